"""gemm and membw on the CPU for real: shape and size parsing, refusals, and rotation of operand sets.

The float64 check of every precision, and that a wrong result is caught. Then runs through the CLI."""

import json
import sqlite3

import numpy as np
import pytest

from conftest import pid_alive
from threads import one_thread  # noqa: F401  (a fixture)
from gpuvs import workloads
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.spec import RunSpec
from gpuvs.workloads.workload import RunContext
from gpuvs.workloads.gemm import (CHECK_SHAPE, SETS, TOLERANCE, Gemm, GemmOp, buffer_sets, check_op, check_result,
                                  parse_shapes)
from gpuvs.workloads.membw import parse_size, parse_sizes

torch = pytest.importorskip("torch", reason="the hardware workloads need torch (installed by .ci/run)")


def test_shapes_parse_in_deepbench_order_and_bad_ones_are_refused():
    assert parse_shapes(["7680x48000x2560"]) == [(7680, 48000, 2560)]
    assert parse_shapes(["64X32x16, 8*4*2", "64x32x16"]) == [(64, 32, 16), (8, 4, 2)]  # duplicates dropped
    assert SETS["train"][:2] == ["7680x48000x2560", "6144x48000x2048"] and len(SETS["all"]) == 12
    for bad in ("12x4", "0x4x4", "axbxc", "4x4x4x4", "4x4x-4", "4x4x2000000"):
        with pytest.raises(UsageError, match="is not MxNxK"):
            parse_shapes([bad])
    with pytest.raises(UsageError, match="empty item"):
        parse_shapes(["4x4x4,"])
    assert Gemm().validate({}, "cpu")["set"] == "small" and Gemm().validate({}, "cuda")["set"] == "all"
    assert Gemm().validate({"shape": ["8x8x8,4x4x4"]}, "cpu")["shape"] == ["8x8x8", "4x4x4"]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16", "fp8"])
def test_every_precision_passes_its_float64_check_on_the_cpu(precision, one_thread):
    """The same GemmOp code path a GPU run uses (fp8 through torch._scaled_mm, which torch also has on CPU)."""
    if precision == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    op = GemmOp(torch, precision, "cpu")
    worst = check_op(op, torch.Generator().manual_seed(1))
    assert 0 < worst <= TOLERANCE[precision]
    if precision in ("fp16", "bf16", "fp8"):
        assert worst > TOLERANCE["fp32"]  # the multiply really ran in the low precision


def test_a_wrong_result_is_caught():
    rng = np.random.default_rng(0)
    m, n, k = CHECK_SHAPE
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    good = a @ b
    assert check_result(good.astype(np.float32), a, b, "fp32") < 1e-6
    off_by_one = good.copy()
    off_by_one[17, 5] += 1.0
    with pytest.raises(WorkloadError, match="above the fp32 tolerance"):
        check_result(off_by_one, a, b, "fp32")
    with pytest.raises(WorkloadError, match="above the bf16 tolerance"):
        check_result(np.roll(good, 1, axis=1), a, b, "bf16")
    with pytest.raises(WorkloadError, match="result shape"):
        check_result(good[:, :-1], a, b, "fp8")
    nan = good.copy()
    nan[0, 0] = np.nan
    with pytest.raises(WorkloadError, match="above the fp16 tolerance"):
        check_result(nan, a, b, "fp16")


def test_operand_sets_rotate_and_fill_the_cache(one_thread):
    op = GemmOp(torch, "fp32", "cpu")
    assert buffer_sets(op, (64, 64, 64), False, 0) == 64  # small: as many as allowed
    assert buffer_sets(op, (4096, 4096, 4096), False, 0) == 2  # 128 MiB per set: two
    assert buffer_sets(op, (64, 64, 64), False, 5) == 5

    class Recording(GemmOp):
        seen: list = []

        def __call__(self, ops, out):
            self.seen.append(id(ops[0]))
            return super().__call__(ops, out)

    rec = Recording(torch, "fp32", "cpu")
    params = Gemm().validate({"buffers": 3, "warmup": 2, "repeats": 2, "block_ms": 0}, "cpu")
    secs, inner, nbuf, _, warm = Gemm().time_shape(torch, rec, (16, 8, 4), False, params,
                                                   torch.Generator().manual_seed(0))
    assert nbuf == 3 and inner >= 1 and len(secs) == 2 and warm is None  # a fixed count decides nothing
    assert len(set(rec.seen)) == 3 and all(x != y for x, y in zip(rec.seen, rec.seen[1:]))


def test_gemm_runs_its_shapes_through_the_cli(cli, tmp_path):
    r = cli("run", "gemm", "--shape", "64x48x32", "--shape", "32x32x32", "--repeats", "3", "--precision", "bf16",
            "--block-ms", "1", "--device", "cpu", OMP_NUM_THREADS="1")  # see threads.one_thread
    assert r.returncode == 0, r.stderr
    assert "check: bf16 256x192x320 against float64" in r.stdout and "Per series" in r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    every = db.execute("SELECT series, step, value, unit, seconds, items, extra FROM samples").fetchall()
    rows = [(s, v, u, sec, it, ex) for s, _, v, u, sec, it, ex in every if s != "all shapes"]
    assert {row[0] for row in rows} == {"64x48x32", "32x32x32"} and len(rows) == 6
    # the headline: both shapes' work over both shapes' time, repeat by repeat (not a mean of rates)
    for step in (1, 2, 3):
        parts = [(sec, it) for s, st, _, _, sec, it, _ in every if st == step and s != "all shapes"]
        (value,) = [v for s, st, v, *_ in every if st == step and s == "all shapes"]
        assert value == pytest.approx(sum(it for _, it in parts) / sum(sec for sec, _ in parts))
    summary = json.loads(db.execute("SELECT summary FROM trials").fetchone()[0])
    assert list(summary)[0] == "all shapes" and "total TFLOP/s (all shapes): " in r.stdout
    for series, value, unit, seconds, items, extra in rows:
        m, n, k = map(int, series.split("x"))
        gemms = json.loads(extra)["gemms"]
        assert unit == "TFLOP/s" and items == pytest.approx(2 * m * n * k * gemms / 1e12)
        assert value == pytest.approx(items / seconds) and json.loads(extra)["us_per_gemm"] == pytest.approx(
            seconds / gemms * 1e6)
    metrics = json.loads(db.execute("SELECT metrics FROM trials").fetchone()[0])
    secs = [row[3] for row in rows if row[0] == "64x48x32"]
    gemms = [json.loads(row[5])["gemms"] for row in rows if row[0] == "64x48x32"]
    assert metrics["64x48x32/us_per_gemm"]["value"] == pytest.approx(sum(secs) / sum(gemms) * 1e6)
    assert "64x48x32/pct_of_peak" not in metrics  # a CPU has no datasheet peak here
    worker = json.loads(db.execute("SELECT fingerprint FROM trials").fetchone()[0])["pid"]
    assert not pid_alive(worker)  # the trial's worker is gone (others' tests may run workers of their own)


@pytest.mark.parametrize("args, message", [
    (["gemm", "--precision", "fp8"], "--precision fp8 needs an NVIDIA GPU of compute capability 8.9 or newer"),
    (["gemm", "--shape", "12x4", "--device", "cpu"], "--shape '12x4' is not MxNxK"),
    (["membw", "--kind", "h2d", "--device", "cpu"], "--kind h2d copies between host and GPU; on the CPU only h2h"),
    (["membw", "--kind", "h2h", "--device", "cuda"], "--kind h2h is the CPU's host memory copy; on a GPU: d2d"),
    (["kernels", "--app", "all", "--size", "100", "--device", "cpu"], "--size needs exactly one --app"),
])
def test_bad_hardware_options_are_one_line_and_exit_2(cli, tmp_path, args, message):
    r = cli("run", *args)
    errors = [line for line in r.stderr.splitlines() if line.startswith("gpuvs: error:")]
    assert r.returncode == 2 and len(errors) == 1 and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "gpuvs.db").exists()


def test_sizes_parse():
    assert parse_size("4MiB") == 4 << 20 and parse_size("1GB") == 10**9 and parse_size("512") == 512
    assert parse_size("1.5KiB") == 1536 and parse_sizes("1MiB, 2MiB,1MiB") == [1 << 20, 2 << 20]
    for bad in ("0", "-1MiB", "4 parsecs", "2TiB"):
        with pytest.raises(UsageError, match="--size"):
            parse_size(bad)
    # one reading of a size for every workload: collective's 'M' is nccl-tests' 2^20, its 'MB' membw's 10^6
    from gpuvs.workloads import collective

    for text, want in (("64M", 64 << 20), ("64MB", 64 * 10**6), ("64MiB", 64 << 20), ("8K", 8192), ("1.5K", 1536)):
        assert parse_size(text) == collective.parse_size("min_bytes", text) == want, text


def test_membw_counts_bytes_read_and_written_on_the_cpu(cli, tmp_path):
    """On the CPU the copy is named for what it is, h2h (host memory to host memory), and its sizes read in
    order: the largest (the headline, least flattered by a cache) first, then down."""
    r = cli("run", "membw", "--size", "256KiB,64KiB,1MiB", "--repeats", "3", "--block-ms", "1", "--device", "cpu",
            OMP_NUM_THREADS="1", COLUMNS="200")
    assert r.returncode == 0, r.stderr
    assert "d2d" not in r.stdout and "h2h 64KiB" in r.stdout
    shown = [ln.split("│")[2].strip() for ln in r.stdout.splitlines() if ln.startswith("│ default │ h2h")]
    assert shown == ["h2h 1MiB", "h2h 256KiB", "h2h 64KiB"], r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = db.execute("SELECT series, value, unit, seconds, items, extra FROM samples").fetchall()
    assert {row[0] for row in rows} == {"h2h 64KiB", "h2h 256KiB", "h2h 1MiB"} and len(rows) == 9
    summary = json.loads(db.execute("SELECT summary FROM trials").fetchone()[0])
    assert list(summary) == ["h2h 1MiB", "h2h 256KiB", "h2h 64KiB"]
    for series, value, unit, seconds, items, extra in rows:
        size = parse_size(series.split()[1])
        assert unit == "GB/s" and items == pytest.approx(2 * size * json.loads(extra)["copies"] / 1e9)
        assert value == pytest.approx(items / seconds)


def test_membw_headline_is_the_largest_copy_of_the_first_kind_and_beyond_the_cpu_cache():
    w = workloads.get("membw")
    assert w.headline_series(w.validate({}, "cpu")) == "h2h 256MiB"
    assert w.headline_series(w.validate({"kind": "d2d"}, "cpu")) == "h2h 256MiB"  # d2d on a CPU is its h2h
    assert w.headline_series(w.validate({}, "cuda")) == "d2d 1GiB"
    assert w.headline_series(w.validate({"kind": "h2d", "size": "4MiB,64MiB"}, "cuda")) == "h2d pinned 64MiB"
    llc = max((int(p.read_text().strip().rstrip("K")) << 10 for p in
               __import__("pathlib").Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")), default=0)
    # the CPU default headline copy is four times an LLC of up to 64 MiB (a server's); a machine with more (one here
    # reports 480 MiB) measures its cache with it, which docs/hardware.md says
    assert llc > 64 << 20 or parse_size("256MiB") >= 4 * llc


def test_membw_inline_checks_the_copy_and_names_series(one_thread):
    w = workloads.get("membw")
    params = w.validate({"size": "4KiB", "repeats": 2, "block_ms": 0}, "cpu")
    evs = list(w.run(RunContext(spec=RunSpec(workload="membw", device="cpu"), params=params)))
    samples = [e for e in evs if e["type"] == "sample"]
    assert [s["series"] for s in samples] == ["h2h 4KiB"] * 2
    assert next(e for e in evs if e["type"] == "config")["items"]["peak_memory_gbps"] == "unknown"


def _busy(seconds: float, first: float = 0.0):
    """A step that spins for `seconds` (its first call for `first` more: a lazy first touch)."""
    import time

    calls = []

    def step():
        end = time.perf_counter() + seconds + (first if not calls else 0.0)
        calls.append(1)
        while time.perf_counter() < end:
            pass
    return step, calls


@pytest.mark.quiet  # its verdict reads timing (tests/quiet.py)
@pytest.mark.parametrize("step_s, first_s", [(20e-6, 0.0), (20e-6, 0.02), (2e-3, 0.0)])
def test_block_calibration_times_many_steps_and_shrugs_off_a_slow_first_one(step_s, first_s):
    from gpuvs.workloads._devtime import inner_count

    step, calls = _busy(step_s, first_s)
    inner = inner_count(torch, False, step, 0.005)
    want = 0.005 / step_s  # 250 steps of 20 us, 2.5 of 2 ms: a 5 ms block either way
    assert max(1, 0.5 * want) <= inner <= 2 * want + 1, (inner, want)
    # microsecond steps are timed by the hundred, not one at a time; a step of milliseconds is not repeated idly
    assert (len(calls) >= 100) if step_s < 1e-4 else len(calls) <= 12, len(calls)
    assert inner_count(torch, False, _busy(1e-6)[0], 0.005, max_inner=64) == 64  # the cap holds
