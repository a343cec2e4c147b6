#!/usr/bin/env bash
# GPU proof of the hardware workloads (issue 5): GEMM set with % of peak, gpuvs GEMM vs a bare
# torch.matmul and gpuvs d2d copy vs a bare copy_ (same process), memory bandwidth, the kernel suite
# on GPU and CPU with speed-ups, and the cost of NVML telemetry.
#
#   OUT=/tmp/out PYTHONPATH=src bash benchmarks/hardware.sh            # on a GPU machine (about 7 minutes on an H100)
#   OUT=/tmp/out PYTHONPATH=src DEVICE=cpu bash benchmarks/hardware.sh # check the script without a GPU (tiny sizes)
#   ONLY="gemm_vs_bare membw_vs_bare" ... bash benchmarks/hardware.sh    # some sections only: gemm gemm_vs_bare
#                                                                       # membw membw_vs_bare telemetry kernels
#
# Writes $OUT/hardware.md (tables and the exact commands) and $OUT/hardware.db (the gpuvs store of every run,
# telemetry readings included). A part that fails is reported in the markdown; the others still run.
set -u
: "${OUT:?set OUT to an output folder}"
export PYTHONPATH="${PYTHONPATH:-src}"
DEVICE="${DEVICE:-cuda}"
PY="${PYTHON:-python}"
mkdir -p "$OUT"
MD="$OUT/hardware.md"
DB="$OUT/hardware.db"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
rm -f "$DB" "$DB-wal" "$DB-shm"
T0=$(date +%s)

if [ "$DEVICE" = cpu ]; then  # a quick check of the script itself: small sizes, CPU figures mean nothing
  GEMM_ARGS="--set small --repeats 3"; MEMBW_ARGS="--size 1MiB,16MiB --repeats 3"
  KGPU_ARGS="--scale tiny --repeats 2"; KCPU_ARGS="--scale tiny --repeats 2"; KDEV=cpu
else
  GEMM_ARGS="--repeats 10"; MEMBW_ARGS="--repeats 10"
  KGPU_ARGS="--scale full --repeats 5"; KCPU_ARGS="--scale full --repeats 2 --check false"; KDEV=cuda
fi

BUDGET="${BUDGET:-470}"  # seconds for the whole script; a step gets at most what is left
note() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
# the time limit of a step: its own, or what is left of the budget if that is less (0: no time left)
limit_for() { local left=$(( BUDGET - ($(date +%s) - T0) )); [ "$left" -lt "$1" ] && echo $(( left > 10 ? left : 0 )) || echo "$1"; }

# gpuvs CLI command: shown in the markdown exactly as run; its failure is reported there, not fatal.
gpuvs() {
  local limit; limit=$(limit_for "$1"); shift
  echo "    gpuvs $*" >> "$TMP/commands"
  note "gpuvs $*"
  if [ "$limit" -eq 0 ]; then echo "**Skipped (time budget of ${BUDGET}s spent): \`gpuvs $*\`**" >> "$TMP/failures"; return; fi
  timeout "$limit" "$PY" -m gpuvs "$@" --store "$DB" --quiet > "$TMP/last.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    { echo; echo "**FAILED (exit $rc$([ $rc -eq 124 ] && echo ": timed out after ${limit}s")): \`gpuvs $*\`**"
      echo; echo '```'; tail -n 15 "$TMP/last.log"; echo '```'; } >> "$TMP/failures"
    tail -n 5 "$TMP/last.log"
  fi
}

# helper part (Python below): appends markdown; a failure is reported in the markdown.
part() {
  local limit name=$2; limit=$(limit_for "$1"); shift 2
  note "part $name"
  if [ "$limit" -eq 0 ]; then echo "**Part $name skipped: the time budget of ${BUDGET}s is spent.**" >> "$TMP/body"; return; fi
  if ! timeout "$limit" "$PY" -c "$HELPER" "$name" "$DEVICE" "$DB" "$@" > "$TMP/part.md" 2> "$TMP/part.err"; then
    { echo; echo "**Part $name FAILED or timed out after ${limit}s.**"; echo; echo '```'; tail -n 15 "$TMP/part.err"; echo '```'; } >> "$TMP/part.md"
    tail -n 5 "$TMP/part.err"
  fi
  cat "$TMP/part.md" >> "$TMP/body"
}

read -r -d '' HELPER <<'PY'
import json, math, os, statistics, sys, time
part, device, db = sys.argv[1], sys.argv[2], sys.argv[3]
cuda = device.startswith("cuda")
import torch
from gpuvs import events
from gpuvs.analysis import stats
from gpuvs.probes import peaks, telemetry
from gpuvs.store.db import Store
from gpuvs.spec import RunSpec


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def latest(st, name):
    exps = [e for e in st.experiments() if e.name == name]
    return [t.to_dict() for t in st.trials(exps[-1].id, status="ok")] if exps else []


def fmtn(v, d=1):
    return "-" if v is None or v != v else f"{v:,.{d}f}"


def gpu_name():
    return torch.cuda.get_device_name(0) if cuda else "CPU"


def in_process(spec):
    """The whole worker path (fingerprint, telemetry sampler, workload), in this process."""
    from gpuvs.trial import worker
    out = []
    worker.run_events(spec, out.append)
    return next(e for e in out if e["type"] == "summary")["data"]


def timed(fn, n):
    """Seconds per call of fn over a block of n calls: CUDA events, or a host clock on the CPU."""
    if cuda:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record(); e.synchronize()
        return s.elapsed_time(e) / 1e3 / n
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def versus(names, unit, digits, g, r, need):
    """The per-round table of gpuvs (g) against the bare reference (r), and the verdict."""
    ratio = statistics.median(g) / statistics.median(r)
    print(f"| | {unit} per round | median |\n|---|---|---|")
    for name, vals in zip(names, (g, r)):
        print(f"| {name} | {', '.join(f'{v:.{digits}f}' for v in vals)} | {statistics.median(vals):.{digits}f} |")
    print(f"\n**gpuvs / bare = {100 * ratio:.2f}%** (must be >= {100 * need:.0f}%): "
          f"**{'PASS' if ratio >= need else 'FAIL'}**\n")


def interleaved(a, b, rounds):
    """a() and b() alternately, ABBA, so that drift (clocks, temperature) hits both alike."""
    ra, rb = [], []
    for r in range(rounds):
        for f in ((a, b) if r % 2 == 0 else (b, a)):
            (ra if f is a else rb).append(f())
    return ra, rb


if part == "gemm_tables":
    with Store(db) as st:
        runs = {p: latest(st, f"gemm-{p}") for p in ("fp32", "tf32", "bf16")}
    shapes = []
    for trials in runs.values():
        for t in trials:
            shapes += [s for s in t["summary"] if s not in shapes]
    pk = peaks.lookup(gpu_name()) if cuda else None
    print(f"GPU: **{gpu_name()}**; datasheet peaks (dense TFLOP/s): "
          + (", ".join(f"{p} {pk.tflops_for(p)}" for p in ("fp32", "tf32", "bf16")) if pk else "unknown (no %)") + "\n")
    print("| shape MxNxK | " + " | ".join(f"{p} us | {p} TFLOP/s | {p} % peak" for p in runs) + " |")
    print("|---" * (1 + 3 * len(runs)) + "|")
    for s in shapes:
        cells = []
        for p, trials in runs.items():
            t = trials[-1] if trials else None
            summ = (t or {}).get("summary", {}).get(s, {})
            met = (t or {}).get("metrics", {})
            cells += [fmtn((met.get(f"{s}/us_per_gemm") or {}).get("value")), fmtn(summ.get("value"), 2),
                      fmtn((met.get(f"{s}/pct_of_peak") or {}).get("value"))]
        print(f"| {s} | " + " | ".join(cells) + " |")
    print()

elif part == "gemm_vs_bare":
    shape, n = (8192, 8192, 8192) if cuda else (512, 512, 512), 80 if cuda else 10
    label = "x".join(map(str, shape))
    spec = RunSpec(workload="gemm", device=device, params={"shape": [label], "precision": "bf16", "repeats": 20,
                   "check": False, "warmup": 3}, telemetry_interval_s=0.1)
    m, k_, nn = shape[0], shape[2], shape[1]
    a = torch.randn(m, k_, device=device, dtype=torch.bfloat16)
    b = torch.randn(k_, nn, device=device, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    flop = 2.0 * m * nn * k_

    def bare():
        return flop / timed(lambda: a @ b, n) / 1e12

    def harness():
        return in_process(spec)[label]["value"]

    harness()  # first call: imports, fingerprint, cuBLAS heuristics
    g, r = interleaved(harness, bare, 6)
    print(f"bf16 GEMM {label}, same process, 6 interleaved rounds (ABBA). gpuvs = the gemm workload through "
          f"the worker path (fingerprint, telemetry sampler at 0.1 s, rotated operand sets, CUDA events per "
          f"block); bare = `a @ b` on one operand pair, {n} GEMMs between two CUDA events.\n")
    versus(("gpuvs", "bare torch.matmul"), "TFLOP/s", 1, g, r, 0.98)

elif part == "membw_tables":
    with Store(db) as st:
        trials = latest(st, "membw")
    if not trials:
        raise SystemExit("no membw results")
    t = trials[-1]
    print("| kind, size | GB/s | % of datasheet (d2d) / PCIe link (h2d, d2h) |\n|---|---|---|")
    for s, summ in t["summary"].items():
        met = t["metrics"]
        pct = (met.get(f"{s}/pct_of_peak") or met.get(f"{s}/pct_of_link") or {}).get("value")
        print(f"| {s} | {fmtn(summ.get('value'))} | {fmtn(pct)} |")
    print(f"\nd2d counts bytes read + written; h2d/d2h count bytes moved. Peaks: memory "
          f"{t['config'].get('peak_memory_gbps')} GB/s, PCIe link {t['config'].get('pcie_link_gbps')} GB/s.\n")

elif part == "membw_vs_bare":
    size = (1 << 30) if cuda else (64 << 20)
    spec = RunSpec(workload="membw", device=device, params={"kind": ["d2d"], "size": [str(size)], "repeats": 20},
                   telemetry_interval_s=0.1)
    src = torch.randint(0, 256, (size,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)

    def bare():
        return 2 * size / timed(lambda: dst.copy_(src), 20) / 1e9

    def harness():
        return next(iter(in_process(spec).values()))["value"]

    harness()
    g, r = interleaved(harness, bare, 6)
    print(f"Device-to-device copy of {size >> 20} MiB, same process, 6 interleaved rounds; GB/s counts bytes "
          f"read + written; bare = `dst.copy_(src)`, 20 copies between two CUDA events.\n")
    versus(("gpuvs membw d2d", "bare copy_"), "GB/s", 0, g, r, 0.90)

elif part == "kernel_tables":
    with Store(db) as st:
        g, c = latest(st, "kernels-gpu"), latest(st, "kernels-cpu")
    if not g and not c:
        raise SystemExit("no kernels results")
    g, c = (g[-1] if g else {}), (c[-1] if c else {})
    fp = c.get("fingerprint") or {}
    print(f"GPU: {gpu_name()}; CPU: {fp.get('cpu_model')} ({fp.get('cpu_usable')} usable CPUs), same sizes, same "
          f"PyTorch code. Kernel = the computation (CUDA events on the GPU); wall = inputs in, compute, results "
          f"out. Speed-up = CPU time / GPU time.\n")
    print("| app | size | GPU kernel ms | GPU wall ms | GPU footprint MB | data MB | CPU kernel ms | CPU wall ms "
          "| speed-up kernel | speed-up wall |\n|---|---|---|---|---|---|---|---|---|---|")
    sizes = dict(x.split(" ") for x in (g.get("config") or c.get("config") or {}).get("apps", "").split(", ") if x)
    for app in (g.get("summary") or c.get("summary")):
        gk = (g.get("summary", {}).get(app) or {}).get("value")
        ck = (c.get("summary", {}).get(app) or {}).get("value")
        gw = (g.get("metrics", {}).get(f"{app}/wall_ms") or {}).get("value")
        cw = (c.get("metrics", {}).get(f"{app}/wall_ms") or {}).get("value")
        fpm = (g.get("metrics", {}).get(f"{app}/footprint_mb") or {}).get("value")
        data = (g.get("metrics", {}).get(f"{app}/data_mb") or c.get("metrics", {}).get(f"{app}/data_mb") or {}).get("value")
        sk = ck / gk if gk and ck else None
        sw = cw / gw if gw and cw else None
        print(f"| {app} | {sizes.get(app, '')} | {fmtn(gk, 2)} | {fmtn(gw, 2)} | {fmtn(fpm)} | {fmtn(data)} | "
              f"{fmtn(ck, 2)} | {fmtn(cw, 2)} | {fmtn(sk)}x | {fmtn(sw)}x |")
    print()

elif part == "telemetry_overhead":
    from gpuvs.workloads import get
    from gpuvs.workloads.workload import RunContext
    if not cuda:
        print("Telemetry overhead: skipped (no GPU: NVML has nothing to sample).\n")
        raise SystemExit(0)
    sink = open(os.devnull, "w")
    count = [0]

    def emit(ev):  # as the worker does: encode each reading and write it out
        count[0] += 1
        sink.write(events.encode(ev) + "\n")

    indices = telemetry.visible_gpu_indices("cuda", 1)

    def make_cnn():
        w = get("cnn-train")
        p = w.validate({"model": "resnet50", "batch_size": 128, "precision": "bf16", "data_format": "NHWC"}, "cuda")
        ctx = RunContext(spec=RunSpec(workload="cnn-train", device="cuda", params=p), params=p)
        w.set_precision("bf16", "benchmark")
        model, dev = w.build(ctx)
        data = w.batches(ctx, dev)
        step = w.make_step(ctx, model, dev)
        return (lambda: step(next(data))), 25, 128, "images/s"

    def make_gemm():
        a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        return (lambda: a @ b), 8000, 2 * 2048 ** 3 / 1e12, "TFLOP/s"

    arms = {"off": 0.0, "0.1 s": 0.1, "0.01 s": 0.01}
    print("Same process, one model; segments of steps with the NVML sampler off, at 0.1 s and at 0.01 s, in "
          "rounds A B C | C B A (interleaved); readings are JSON-encoded and written out as the worker does. "
          "Ratio = throughput with telemetry / throughput without, per round; mean and 95% CI over rounds.\n")
    print("| workload | arm | readings/s | throughput (mean) | ratio to off | 95% CI | cost | under 0.5% |\n"
          "|---|---|---|---|---|---|---|---|")
    for wname, make in (("resnet50 train bf16 bs128", make_cnn), ("bf16 GEMM 2048^3 (short kernels)", make_gemm)):
        fn, steps, items, unit = make()
        for _ in range(15):
            fn()
        torch.cuda.synchronize()
        res = {a: [] for a in arms}
        rate = {a: [] for a in arms}
        rounds = 6
        for r in range(rounds):
            for arm in (list(arms) if r % 2 == 0 else list(reversed(arms))):
                interval = arms[arm]
                sampler = telemetry.Sampler(indices, interval, emit) if interval else None
                count[0] = 0
                if sampler:
                    sampler.start()
                t0 = time.perf_counter()
                sec = timed(fn, steps) * steps
                wall = time.perf_counter() - t0
                if sampler:
                    sampler.stop()
                res[arm].append(items * steps / sec)
                rate[arm].append(count[0] / wall)
        base = res["off"]
        print(f"| {wname} | off | 0 | {statistics.mean(base):,.1f} {unit} | 1 | - | - | |")
        for arm in list(arms)[1:]:
            mean, lo, hi = stats.t_interval([v / o for v, o in zip(res[arm], base)])
            print(f"| {wname} | {arm} | {statistics.mean(rate[arm]):.0f} | {statistics.mean(res[arm]):,.1f} {unit} | "
                  f"{mean:.4f} | {lo:.4f} … {hi:.4f} | {100 * (1 - mean):+.2f}% | "
                  f"{'PASS' if 1 - mean < 0.005 else 'FAIL'} |")
        log(f"{wname}: done")
    print("\nCost under 0.5% is the target (a negative cost is noise in the other direction).\n")
else:
    raise SystemExit(f"unknown part {part}")
PY

: > "$TMP/body"; : > "$TMP/commands"; : > "$TMP/failures"
note "hardware proof on $DEVICE -> $MD"

# a section runs unless ONLY names others
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
# titled TITLE LIMIT PART: a "## TITLE" heading in the markdown, then the helper part under it
titled() { { echo "## $1"; echo; } >> "$TMP/body"; part "$2" "$3"; }

# 1. the GEMM set at fp32, tf32, bf16, and gpuvs against a bare torch.matmul
if want gemm; then
  for p in fp32 tf32 bf16; do gpuvs 180 run gemm --device "$DEVICE" --precision $p $GEMM_ARGS --name gemm-$p; done
  titled "GEMM: the DeepBench training shapes, square and inference shapes" 60 gemm_tables
fi
want gemm_vs_bare && titled "gpuvs GEMM vs bare torch.matmul" 120 gemm_vs_bare

# 2. memory bandwidth, and gpuvs against a bare copy_
if want membw; then
  gpuvs 150 run membw --device "$DEVICE" $MEMBW_ARGS --name membw
  titled "Memory bandwidth" 60 membw_tables
fi
want membw_vs_bare && titled "gpuvs d2d copy vs bare copy_" 100 membw_vs_bare

# 3. telemetry overhead
want telemetry && titled "Telemetry overhead" 120 telemetry_overhead

# 4. the kernel suite on the GPU and on the CPU
if want kernels; then
  gpuvs 180 run kernels --device "$KDEV" $KGPU_ARGS --name kernels-gpu
  gpuvs 150 run kernels --device cpu $KCPU_ARGS --name kernels-cpu
  titled "Kernel suite (Rodinia-style apps): GPU vs CPU" 40 kernel_tables
fi

{
  echo "# gpuvs hardware proof ($(date -u +%Y-%m-%dT%H:%MZ), device $DEVICE)"
  echo
  "$PY" - <<'PY' 2>/dev/null || echo "(fingerprint unavailable)"
from gpuvs.probes import fingerprint
fp = fingerprint.take()
print(f"GPU: {fp.get('gpu_name')}; driver {fp.get('driver')}; torch {fp.get('torch')} (CUDA {fp.get('cuda')}); "
      f"CPU: {fp.get('cpu_model')} x{fp.get('cpu_usable')}")
PY
  echo
  echo "Commands (each with \`--store $DB --quiet\`):"
  echo
  cat "$TMP/commands"
  echo
  if [ -s "$TMP/failures" ]; then echo "## Failures"; cat "$TMP/failures"; echo; fi
  cat "$TMP/body"
  echo "Total time: $(( $(date +%s) - T0 )) s. Every run is in $(basename "$DB") (gpuvs results list --store ...)."
} > "$MD"
note "done: $MD"
