"""What a machine is: its fingerprint, software versions, NVML telemetry, datasheet peaks, precision checks,
failure classes and the environment checkup."""
