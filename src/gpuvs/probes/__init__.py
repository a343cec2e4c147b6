"""What a machine is: its fingerprint, software versions, what a command ran, NVML telemetry, datasheet peaks,
precision checks, failure classes and the environment checkup."""
