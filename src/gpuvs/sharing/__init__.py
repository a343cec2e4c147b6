"""Sharing one GPU: everything about it lives in this package.

- `group.py`: concurrent workers measured in one window (the coordinator, groups, the capacity sweep)
- `studies.py`: the studies of `gpuvs share` (scaling, pairs, capacity), repeated in fresh groups
- `advisor.py`: the study of `gpuvs advise-mps`: each job alone, then the pairs, predicted against measured
- `matrix.py`: the pairs file (`share-matrix`, `advise-mps --pairs`) and the matrix's runs
- `stats.py`: sharing's figures with intervals and verdicts (statistics only: no rendering)
- `advice.py`: the advisor's prediction rule
- `windows.py`: the advisor's windows, calibrated from each job's solo steps
- `mps.py`, `knobs.py`: gpuvs's own MPS daemon; MPS client settings as arms
- `gpm.py`: NVML GPM readings over a window
- the start/stop barrier the workers meet at is gpuvs.workloads._barrier (the worker side imports it)

The command line only parses options, calls these and renders (report/sharing.py writes the figures).
Nothing is imported here, so that a worker importing the barrier loads nothing else."""
