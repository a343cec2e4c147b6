"""Commands and workloads that use no framework import none (issue 36).

`gpuvs run command` and `gpuvs --help` start in well under a second of CPU and about 45 MB.
Importing PyTorch costs seconds and about 500 MB. Each case runs in a fresh interpreter and reports its modules."""

import json
import subprocess
import sys

import pytest

from conftest import gpuvs_env

FRAMEWORKS = ("torch", "torchvision", "tensorflow", "jax")

AT_EXIT = r"""
import atexit, json, sys
atexit.register(lambda: print("LOADED " + json.dumps(sorted(m for m in sys.modules if "." not in m)),
                              file=sys.stderr))
from gpuvs.cli import main
main(sys.argv[1:])
"""


def loaded_at_exit(args, cwd) -> set[str]:
    r = subprocess.run([sys.executable, "-c", AT_EXIT, *args], capture_output=True, text=True, timeout=300,
                       cwd=cwd, env=gpuvs_env())
    assert r.returncode == 0, r.stdout + r.stderr
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("LOADED ")]
    assert line, r.stderr
    return set(json.loads(line[-1][len("LOADED "):]))


@pytest.mark.parametrize("args", [
    # no --device: the command line asks the environment whether it has a GPU (NVML, else the CUDA driver)
    ["run", "command", "--trials", "2", "--", "true"],
    ["--help"],
    ["run", "--help"],
])
def test_a_command_that_uses_no_framework_imports_none(tmp_path, args):
    loaded = loaded_at_exit(args, tmp_path)
    assert "gpuvs" in loaded  # the hook saw the run
    assert not loaded & set(FRAMEWORKS), sorted(loaded & set(FRAMEWORKS))


WORKER = r"""
import json, sys
from gpuvs.trial import worker
from gpuvs.spec import RunSpec
out = []
worker.run_events(RunSpec(workload="command", device="cpu", params={"argv": ["true"]}), out.append)
print(json.dumps([e["type"] for e in out]))
print(json.dumps(sorted(m for m in ("torch", "torchvision") if m in sys.modules)))
"""


def test_the_command_workers_own_process_imports_no_framework():
    r = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=120, env=gpuvs_env())
    assert r.returncode == 0, r.stderr
    kinds, loaded = (json.loads(ln) for ln in r.stdout.strip().splitlines()[-2:])
    assert "summary" in kinds and loaded == []
