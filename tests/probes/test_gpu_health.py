"""A real GPU's health through NVML (probes/gpu_health.py), on a machine with an NVIDIA GPU.

Run: python -m pytest -m gpu tests/probes/test_gpu_health.py. CI has none.
There the cause function and the records are tested on the CPU, in tests/fleet/test_gpu_causes.py."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from gpuvs.fleet.assess import causes
from gpuvs.probes import fingerprint, gpu_health, telemetry

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(fingerprint.gpu_count() == 0, reason="needs an NVIDIA GPU and NVML")]

CO_TENANT = """
import sys, time, torch
a = torch.randn(4096, 4096, device="cuda:0")
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def check_sane(h: gpu_health.GpuHealth) -> None:
    assert h.gpu == 0 and h.uuid and h.uuid.startswith("GPU-")
    assert h.readings >= 1
    for value, allowed in ((h.pcie_gen, range(1, 7)), (h.pcie_gen_max, range(1, 7)), (h.pcie_gen_gpu_max, range(1, 7)),
                           (h.pcie_width, (1, 2, 4, 8, 16, 32)), (h.pcie_width_max, (1, 2, 4, 8, 16, 32))):
        assert value is None or (isinstance(value, int) and value in allowed), h
    if h.pcie_gen is not None and h.pcie_gen_max is not None:
        assert h.pcie_gen <= h.pcie_gen_max
    assert isinstance(h.sm_clock_max_mhz, int) and 300 <= h.sm_clock_max_mhz <= 4000
    assert isinstance(h.mem_clock_max_mhz, int) and 300 <= h.mem_clock_max_mhz <= 20000
    assert h.sm_clock_mean_mhz is not None and 0 < h.sm_clock_mean_mhz <= 1.05 * h.sm_clock_max_mhz
    assert all(name in telemetry.THROTTLE_BITS.values() and 0 < share <= 1 for name, share in h.throttle.items())
    assert h.power_limit_w is None or 10 <= h.power_limit_w <= 2000
    assert h.power_default_w is None or 10 <= h.power_default_w <= 2000
    assert h.temp_max_c is not None and 0 < h.temp_max_c < 120
    assert h.temp_slowdown_c is None or 50 <= h.temp_slowdown_c <= 120
    for count in (h.ecc_uncorrected, h.ecc_uncorrected_before, h.remapped_correctable, h.remapped_uncorrectable):
        assert count is None or (isinstance(count, int) and count >= 0)
    assert h.remap_pending in (None, True, False) and h.remap_failed in (None, True, False)
    assert h.xid is None or all(isinstance(x, int) for x in h.xid)
    assert isinstance(h.processes, int) and h.processes >= 0
    json.dumps(h.to_dict())  # what the worker sends


def test_a_real_gpus_health_reads_sane_values_and_the_worker_itself_is_no_other_process():
    import torch

    a = torch.randn(2048, 2048, device="cuda:0")  # this process on the GPU, busy
    t0 = time.time()
    readings: list[dict] = []
    sampler = telemetry.Sampler([0], 0.05, readings.append, health=True).start()
    while time.time() - t0 < 2.0:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    sampler.stop()
    (h,) = gpu_health.from_telemetry(readings)
    check_sane(h)
    assert h.readings >= 10 and h.polls >= 1
    assert h.processes >= 1 and h.other_pids is not None
    import os

    assert os.getpid() not in h.other_pids
    assert telemetry.summarize(readings)["n"] == h.readings  # the health event is no reading


def test_a_co_tenant_process_is_seen_as_another_process_with_its_share(cli, tmp_path):
    """The co-tenant is this test's child and gpuvs's worker its sibling: not the worker's own (a pid that is the
    worker's or its descendant's is its own)."""
    proc = subprocess.Popen([sys.executable, "-c", CO_TENANT, "120"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        r = cli("run", "gpu-check", "--steps", "20", "--block-ms", "50", "--device", "cuda",
                "--telemetry-interval", "0.05")
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    (h,) = [gpu_health.GpuHealth.from_dict(d["health"]) for d in
            (json.loads(x) for (x,) in db.execute("SELECT data FROM telemetry")) if "health" in d]
    check_sane(h)
    assert h.readings >= 10 and h.polls >= 1
    assert h.other_pids is not None, f"NVML's pids are not in this pid namespace here ({h.processes} processes)"
    assert proc.pid in h.other_pids, h
    assert h.other_util_pct is not None and h.other_util_pct > 20, h
    peer = gpu_health.GpuHealth(**{**h.to_dict(), "other_pids": [], "other_util_pct": 0.0, "processes": 1})
    found = causes.causes(h, [peer])
    # the co-tenant is named; this test process may hold a CUDA context of its own too (an earlier test's torch),
    # which is another process as far as the worker is concerned: "2 other processes (pid A, B) used N% ..."
    who = "another process" if len(h.other_pids) == 1 else f"{len(h.other_pids)} other processes"
    pids = ", ".join(str(p) for p in h.other_pids)
    assert any(line.startswith(f"{who} (pid {pids}) used ") for line in found), found
    assert str(proc.pid) in pids.split(", ")


def test_a_gpu_run_stores_each_gpus_health_with_its_telemetry(cli, tmp_path):
    r = cli("run", "gpu-check", "--steps", "3", "--block-ms", "5", "--device", "cuda", "--telemetry-interval", "0.05")
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = [json.loads(d) for (d,) in db.execute("SELECT data FROM telemetry")]
    health = [gpu_health.GpuHealth.from_dict(d["health"]) for d in rows if "health" in d]
    assert len(health) == 1 and len(rows) > 1
    check_sane(health[0])
