"""Sharing one GPU: everything about it lives in this package.

- `group.py`: concurrent workers measured in one window (the coordinator, groups, the capacity sweep)
- `stats.py`: sharing's figures with intervals and verdicts (statistics only: no rendering)
- `advice.py`: the advisor's prediction rule
- `mps.py`, `knobs.py`: gpuvs's own MPS daemon; MPS client settings as arms
- `gpm.py`: NVML GPM readings over a window
- `barrier.py`: the start/stop barrier the workers meet at (used inside the worker too)

Nothing is imported here, so that a worker importing the barrier loads nothing else."""
