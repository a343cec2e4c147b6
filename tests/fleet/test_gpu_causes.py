"""Why a slow GPU is slow: fleet/assess/causes.py on recorded NVML readings (probes/gpu_health.py).

The readings are kept with a trial's telemetry and read back, stores of earlier versions too.
A fleet row's "why" in every format. All on the CPU; the NVML reading itself: tests/probes/test_gpu_health.py."""

from __future__ import annotations

import dataclasses
import json

from rich.console import Console

from gpuvs.fleet.assess import causes
from gpuvs.fleet.result import FleetResult, NodeRow
from gpuvs.probes import gpu_health, telemetry
from gpuvs.probes.gpu_health import GpuHealth
from gpuvs.report import fleet as report
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store
from gpuvs.store.records import ExperimentMeta, TelemetryRecord


def healthy(gpu: int = 0, **kw) -> GpuHealth:
    """An H100 SXM's readings under load, as NVML gives them."""
    base = dict(gpu=gpu, uuid=f"GPU-{gpu:08d}", pcie_gen=5, pcie_width=16, pcie_gen_max=5, pcie_width_max=16,
                pcie_gen_gpu_max=5, sm_clock_mean_mhz=1980.0, sm_clock_max_mhz=1980, mem_clock_mean_mhz=2619.0,
                mem_clock_max_mhz=2619, readings=200, throttle={}, power_limit_w=700.0, power_default_w=700.0,
                temp_max_c=61.0, temp_slowdown_c=87, ecc_uncorrected=0, ecc_uncorrected_before=0,
                remapped_correctable=0, remapped_uncorrectable=0, remap_pending=False, remap_failed=False, xid=[],
                processes=1, other_pids=[], other_util_pct=0.0, other_mem_mib=None, polls=40)
    return GpuHealth(**{**base, **kw})


PEERS = [healthy(0), healthy(1), healthy(2)]


def test_a_downtrained_link_is_named_against_its_peers_with_the_host_to_device_figure():
    slow = healthy(3, pcie_gen=3)
    assert causes.causes(slow, PEERS) == ["PCIe Gen3 x16 where its peers run Gen5 x16"]
    assert causes.causes(slow, PEERS, h2d=12.1, peer_h2d=[55.0, 54.2, 55.3]) == [
        "PCIe Gen3 x16 where its peers run Gen5 x16; host-to-device 12.1 GB/s against 55"]
    narrow = healthy(3, pcie_width=8)
    assert causes.causes(narrow, PEERS) == ["PCIe Gen5 x8 where its peers run Gen5 x16"]
    # no peer with a reading: against what the GPU and its slot support
    assert causes.causes(slow, []) == ["PCIe Gen3 x16, below the Gen5 x16 it and its slot support"]


def test_a_co_tenant_process_is_named_with_its_share_of_the_gpu():
    slow = healthy(3, other_pids=[4242], other_util_pct=41.2, other_mem_mib=2048.0, processes=2)
    assert causes.causes(slow, PEERS) == ["another process (pid 4242) used 41% of the GPU during its trials"]
    idle = healthy(3, other_pids=[4242], other_util_pct=0.0, other_mem_mib=2048.0, processes=2)
    assert causes.causes(idle, PEERS) == [
        "another process (pid 4242), holding 2,048 MiB, on the GPU during its trials (busy 0% of the time)"]
    # in another pid namespace (a pod) the worker's own process cannot be told apart: the count is the fact
    hidden = healthy(3, other_pids=None, other_util_pct=None, processes=2)
    peers = [healthy(i, other_pids=None, other_util_pct=None, processes=1) for i in range(3)]
    assert causes.causes(hidden, peers) == ["2 processes on the GPU during its trials where its peers had 1"]


def test_throttling_power_clocks_temperature_and_memory_errors_each_say_what_the_reading_is():
    throttled = healthy(3, throttle={"hw_slowdown": 0.3, "sw_power_cap": 0.02}, sm_clock_mean_mhz=1400.0)
    assert causes.causes(throttled, PEERS) == ["HW slowdown throttling 30% of the time",
                                               "SM clock 1400 MHz on average, peers 1980 (its maximum 1980)"]
    capped = healthy(3, power_limit_w=500.0, throttle={"sw_power_cap": 0.8})
    assert causes.causes(capped, PEERS) == ["power cap throttling 80% of the time", "power limit 500 W, default 700 W"]
    hot = healthy(3, temp_max_c=88.0, throttle={"sw_thermal": 0.12})
    assert causes.causes(hot, PEERS) == ["SW thermal slowdown throttling 12% of the time",
                                         "reached 88 °C, its slowdown threshold is 87 °C"]
    worn = healthy(3, ecc_uncorrected=3, ecc_uncorrected_before=1, remap_pending=True, remapped_uncorrectable=12,
                   xid=[48, 63])
    assert causes.causes(worn, PEERS) == ["3 uncorrected ECC errors since the driver loaded (2 during its trials)",
                                          "row remapping pending (12 rows remapped): applied at the GPU's next reset",
                                          "XIDs 48, 63 during its trials"]
    assert causes.causes(healthy(3, remap_failed=True), PEERS) == ["row remapping failed"]


def test_nothing_visible_says_so_and_what_its_peers_share_is_no_cause():
    assert causes.causes(healthy(3, sm_clock_mean_mhz=1950.0), PEERS) == [causes.NO_CAUSE]
    # every GPU on Gen4 or capped alike: the same reading as its peers explains no difference between them
    gen4 = [healthy(i, pcie_gen=4, power_limit_w=500.0) for i in range(4)]
    assert causes.causes(gen4[3], gen4[:3]) == [causes.NO_CAUSE]
    # unknown readings (None: not supported) say nothing, neither cause nor health
    unknown = GpuHealth(gpu=3)
    assert causes.causes(unknown, PEERS) == [causes.NO_CAUSE]
    assert causes.causes(healthy(3, pcie_gen=3), [GpuHealth(gpu=0)]) == [
        "PCIe Gen3 x16, below the Gen5 x16 it and its slot support"]
    assert causes.causes(None, PEERS) == []  # no readings at all (a CPU run): nothing, not "unknown"


def test_for_nodes_names_only_slow_rows_against_the_healthy_ones_gpu_by_gpu():
    verdicts = {"a": "equivalent", "b": "reference", "c": "slower", "d": "slower-within-margin", "e": "slower",
                "cpu": "slower"}
    health = {"a": [healthy(0)], "b": [healthy(0)], "c": [healthy(0, pcie_gen=3)],
              "d": [healthy(0, other_pids=[7], other_util_pct=5.4)],
              "e": [healthy(0), healthy(1, throttle={"hw_slowdown": 0.5})], "cpu": []}
    why = causes.for_nodes(verdicts, health, h2d={"a": 55.0, "b": 54.0, "c": 12.0})
    assert why == {"c": ["PCIe Gen3 x16 where its peers run Gen5 x16; host-to-device 12 GB/s against 54.5"],
                   "d": ["another process (pid 7) used 5% of the GPU during its trials"],
                   "e": [f"GPU 0: {causes.NO_CAUSE}", "GPU 1: HW slowdown throttling 50% of the time"]}


def test_health_is_kept_with_the_telemetry_and_read_back_and_earlier_stores_still_read(tmp_path):
    slow = healthy(1, pcie_gen=3, xid=None, throttle={"hw_slowdown": 0.25})
    events = [{"type": "telemetry", "t": 0.1, "gpu": 1, "util_gpu": 97, "sm_clock_mhz": 1980, "throttle_mask": 0},
              {"type": "telemetry", "t": 0.2, "gpu": 1, "util_gpu": 99, "sm_clock_mhz": 1970, "throttle_mask": 8},
              {"type": "telemetry", "t": 0.25, "gpu": 1, "health": slow.to_dict()}]
    with Store(tmp_path / "g.db") as st:
        st.create_experiment("e1", "x", "run", ExperimentMeta())
        tid = st.begin_trial(RunSpec(workload="selftest", experiment_id="e1", run_id="r", arm="a"))
        for e in events:
            st.add_event(tid, e)
        st.finish_trial(tid, "ok")
        stored = st.telemetry(tid)
    assert gpu_health.from_telemetry(stored) == [slow]
    # the readings proper are summarised as before: the health row is no reading
    s = telemetry.summarize([r.to_dict() for r in stored])
    assert s["n"] == 2 and s["util_gpu_mean"] == 98 and s["throttle_fraction"] == {"hw_slowdown": 0.5}
    assert list(telemetry.summarize_by_gpu([r.to_dict() for r in stored])) == [1]
    # a store of an earlier version: readings only, no health; a health dict with fields unknown to this version
    assert gpu_health.from_telemetry([TelemetryRecord(0.1, 0, {"util_gpu": 5})]) == []
    assert GpuHealth.from_dict({"gpu": 2, "pcie_gen": 4, "later_field": 1}) == GpuHealth(gpu=2, pcie_gen=4)


def test_merge_over_trials_keeps_the_worst_link_weighted_shares_and_every_xid():
    a = healthy(0, readings=100, throttle={"hw_slowdown": 0.5}, sm_clock_mean_mhz=1800.0, xid=[79], pcie_gen=5)
    b = healthy(0, readings=300, throttle={}, sm_clock_mean_mhz=1960.0, xid=None, pcie_gen=3, other_pids=[9],
                other_util_pct=20.0, polls=10)
    m = gpu_health.merge([a, b])
    assert (m.readings, m.throttle, m.sm_clock_mean_mhz, m.xid, m.pcie_gen) == (
        400, {"hw_slowdown": 0.125}, 1920.0, [79], 3)
    assert m.other_pids == [9] and m.other_util_pct == 20.0 * 10 / 50
    assert gpu_health.merge([a]) is a


def fleet_with_why() -> FleetResult:
    from gpuvs.fleet.execute import adaptive
    from gpuvs.fleet.assess import node_verdicts as verdicts
    from gpuvs.fleet.assess.rows import sort_rows

    rows = [NodeRow("gpu-node-a", "equivalent", n_ok=4, n_trials=4, mean=1000.0, speed=1.0, speed_low=0.99,
                    speed_high=1.01, reference=["gpu-node-b"], health=[healthy(0)]),
            NodeRow("gpu-node-b", "equivalent", n_ok=4, n_trials=4, mean=1001.0, speed=1.0, speed_low=0.99,
                    speed_high=1.01, reference=["gpu-node-a"], health=[healthy(0)]),
            NodeRow("gpu-node-c", "slower", n_ok=4, n_trials=4, mean=540.0, speed=0.54, speed_low=0.53,
                    speed_high=0.55, reference=["gpu-node-a", "gpu-node-b"],
                    health=[healthy(0, pcie_gen=3, other_pids=[4242], other_util_pct=41.0)],
                    why=["PCIe Gen3 x16 where its peers run Gen5 x16",
                         "another process (pid 4242) used 41% of the GPU during its trials"])]
    return FleetResult("exp-why", "gpu-check", "TFLOP/s", True, 0.02, 0.95, adaptive.AdaptiveTrials(4, 12, 4),
                       verdicts.ErrorControl(0.95, looks=3, nodes=3), 1, sort_rows(rows), command="gpuvs fleet")


def test_the_slow_row_says_why_in_every_format_wrapped_never_cut():
    res = fleet_with_why()
    for width in (60, 80, 200):
        term = report.render("term", res, width=width)
        assert "…" not in term and all(len(line) <= width for line in term.splitlines())
        words = " ".join(term.split())
        for word in ("why:", "Gen3", "Gen5", "4242", "41%"):
            assert word in words
    md = report.render("md", res)
    assert ("why: PCIe Gen3 x16 where its peers run Gen5 x16; another process (pid 4242) used 41% of the GPU "
            "during its trials") in md
    assert "why:" in report.render("html", res)
    data = json.loads(report.render("json", res))
    slow = data["rows"][0]
    assert slow["node"] == "gpu-node-c" and slow["why"][1].startswith("another process (pid 4242) used 41%")
    assert slow["health"][0]["pcie_gen"] == 3 and slow["health"][0]["other_util_pct"] == 41.0
    assert "why" not in data["rows"][1] and data["rows"][1]["health"][0]["pcie_gen"] == 5
    assert FleetResult.from_dict(data) == res
    # a fleet result stored before health was read: no health, no why, the same report as it always was
    old = dataclasses.replace(res, rows=[dataclasses.replace(r, health=[], why=[]) for r in res.rows])
    old_data = json.loads(report.render("json", old))
    assert all("health" not in r and "why" not in r for r in old_data["rows"])
    assert FleetResult.from_dict(old_data) == old
    assert "why" not in report.render("term", old, width=200)


def test_the_terminal_table_stacks_rather_than_cut_a_long_why():
    res = fleet_with_why()
    console = Console(record=True, width=40, markup=False, highlight=False, file=open("/dev/null", "w"))
    report.terminal(console, res)
    text = console.export_text()
    assert "…" not in text and "4242" in text
