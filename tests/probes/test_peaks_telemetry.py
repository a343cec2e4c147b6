"""Datasheet peaks by NVML name, and telemetry: throttle decoding, summaries, the terminal table,
the store round trip, and NVML being absent."""

import json
from pathlib import Path

import pytest
from rich.console import Console

from gpuvs.probes import peaks
from gpuvs.probes import telemetry
from gpuvs.store.records import TelemetryRecord
from gpuvs.report import terminal
from gpuvs.trial.runner import TrialResult
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store

# Readings in the sampler's format (telemetry events), with values typical of an H100 SXM going from
# idle into a GEMM load and hitting its power cap, then a thermal slowdown; plus an idle second GPU
# whose throttle probe failed. Synthetic: there is no GPU on the machine that wrote the tests.
READINGS = [json.loads(line) for line in (Path(__file__).parent.parent / "data" / "telemetry_h100_gemm.jsonl").open()]


@pytest.mark.parametrize("name, model, bf16, mem", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4, 3352),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756, 2000),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5, 3900),
    ("NVIDIA H200", "H200 SXM", 989.4, 4800),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB", 312, 2039),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 312, 1555),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 312, 1935),
    ("NVIDIA A10", "A10", 125, 600),
    ("NVIDIA L40S", "L40S", 362, 864),
    ("NVIDIA L4", "L4", 121, 300),
    ("Tesla V100-SXM2-16GB", "V100 SXM2", None, 900),
])
def test_peak_lookup_by_nvml_name(name, model, bf16, mem):
    p = peaks.lookup(name)
    assert p is not None and p.model == model and p.memory_gbps == mem
    assert p.tflops_for("bf16") == bf16


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "NVIDIA A10G", "AMD Instinct MI300X", "", None])
def test_unknown_models_get_no_peak_and_no_percent(name):
    assert peaks.lookup(name) is None
    assert peaks.percent(100.0, None) is None


def test_percent_and_pcie_link():
    h100 = peaks.lookup("NVIDIA H100 80GB HBM3")
    assert peaks.percent(784.0, h100.tflops_for("bf16")) == pytest.approx(79.24, abs=0.01)
    assert h100.tflops_for("fp32") == 66.9 and h100.tflops_for("fp8") == 1978.9
    assert peaks.lookup("Tesla T4").tflops_for("tf32") is None  # no TF32 on Turing: no percent, not a wrong one
    assert peaks.pcie_gbps(5, 16) == pytest.approx(63.0, abs=0.1)
    assert peaks.pcie_gbps(4, 16) == pytest.approx(31.5, abs=0.1)
    assert peaks.pcie_gbps(None, 16) is None and peaks.pcie_gbps(4, 0) is None


def test_throttle_bits_are_decoded_and_idle_is_not_throttling():
    assert telemetry.throttle_names(0x1) == [] and telemetry.throttle_names(0x2) == []
    assert telemetry.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]
    assert telemetry.throttle_names(0x8 | 0x20 | 0x80) == ["hw_slowdown", "sw_thermal", "hw_power_brake"]
    # a reading that kept only the names (older format) is read by its names
    assert telemetry.reasons({"throttle": ["hw_slowdown"]}) == ["hw_slowdown"]
    assert telemetry.reasons({"throttle_mask": 0x4, "throttle": []}) == ["sw_power_cap"]


def test_summary_of_readings_per_gpu():
    by_gpu = telemetry.summarize_by_gpu(READINGS)
    assert list(by_gpu) == [0, 1]
    s = by_gpu[0]
    assert s["n"] == 10 and s["duration_s"] == pytest.approx(0.9)
    assert s["util_gpu_max"] == 100 and s["util_gpu_mean"] == pytest.approx(80.0)
    assert s["power_w_max"] == 700.0 and s["power_w_mean"] == pytest.approx((2 * 75 + 3 * 610 + 4 * 699 + 700) / 10)
    assert s["sm_clock_mhz_min"] == 1590 and s["sm_clock_mhz_max"] == 1980 and s["temp_c_max"] == 84
    assert s["throttle_seen"] == ["sw_power_cap", "sw_thermal"]
    assert s["throttle_fraction"] == {"sw_power_cap": pytest.approx(0.5), "sw_thermal": pytest.approx(0.1)}
    idle = by_gpu[1]
    assert idle["n"] == 1 and idle["throttle_seen"] == [] and idle["throttle_fraction"] == {}
    assert telemetry.summarize([]) == {"n": 0, "duration_s": 0.0, "throttle_seen": [], "throttle_fraction": {}}


def test_readings_stored_in_sqlite_summarise_the_same(store_path):
    spec = RunSpec(workload="selftest", device="cuda")
    with Store(store_path) as st:
        trial_id = st.begin_trial(spec)
        for r in READINGS:
            st.add_event(trial_id, r)
        st.finish_trial(trial_id, "ok")
        stored = st.telemetry(trial_id)
    assert len(stored) == len(READINGS)
    assert stored[0] == TelemetryRecord.from_event(READINGS[0])
    assert telemetry.summarize_by_gpu([t.to_dict() for t in stored]) == telemetry.summarize_by_gpu(READINGS)


def test_terminal_telemetry_table_shows_means_maxima_and_throttling():
    results = [TrialResult(spec=RunSpec(workload="gemm", device="cuda", arm=arm), status="ok",
                           telemetry=[TelemetryRecord.from_event(e) for e in tel])
               for arm, tel in (("a", READINGS), ("b", READINGS[:2]))]
    results.append(TrialResult(spec=RunSpec(workload="gemm", device="cpu", arm="cpu"), status="ok"))
    console = Console(record=True, width=200)
    console.print(terminal.telemetry_table(results))
    text = console.export_text()
    rows = {(cells[0], cells[1]): cells for cells in
            ([c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│"))}
    assert set(rows) == {("a", "0"), ("a", "1"), ("b", "0")}  # the CPU trial has no readings, no row
    assert rows["a", "0"][2:] == ["10", "80.0 / 100", "8,024", "547.6 / 700.0", "1,851 (1,590)", "84.0",
                                  "sw_power_cap 50%, sw_thermal 10%"]
    assert rows["a", "1"][-1] == "none" and rows["b", "0"][2] == "2" and rows["b", "0"][-1] == "none"
    assert terminal.telemetry_table(results[2:]) is None  # no readings, no table


def test_without_nvml_telemetry_says_so_once_and_goes_on():
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML is present here")
    except ImportError:
        pass
    except Exception:
        pass
    said = []
    assert telemetry.start_for(RunSpec(workload="gemm", device="cuda", telemetry_interval_s=0.1), said.append) is None
    assert len(said) == 1 and said[0]["type"] == "log" and "telemetry off: NVML is not available" in said[0]["message"]
    said.clear()
    assert telemetry.start_for(RunSpec(workload="gemm", device="cuda", telemetry_interval_s=0), said.append) is None
    assert telemetry.start_for(RunSpec(workload="gemm", device="cpu"), said.append) is None
    assert said == []  # off, or a CPU run: nothing to say
