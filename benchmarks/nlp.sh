#!/usr/bin/env bash
# GPU proof for the NLP workloads (issue 6): the nlp-gpu-vs-cpu table (NER train, TC train, NER predict,
# TC predict: GPU time, CPU time, CPU/GPU ratio with 95% CIs, 3 trials per arm, the CPU arm on every
# core of the machine) and serve-load runs against `gpuvs serve` on the GPU.
#
#   OUT=/some/folder PYTHONPATH=src bash benchmarks/nlp.sh
#
# Writes $OUT/nlp.md (tables and the exact commands) and $OUT/nlp.db (every trial, sample and event).
# Fails soft: a part that fails is reported in nlp.md and the rest still runs.
# Checking the script on a machine without a GPU: NLP_BENCH_DEVICE=cpu NLP_BENCH_SMALL=1 (the "gpu"
# arm then runs on the CPU too, at toy sizes; the figures mean nothing, the plumbing is exercised).
set -u
OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src}
PY=${PYTHON:-python}
DEVICE=${NLP_BENCH_DEVICE:-cuda}
SMALL=${NLP_BENCH_SMALL:-0}
BUDGET_S=${NLP_BENCH_BUDGET_S:-390}   # parts not started by then are skipped (the whole run must end in 8 min)
MD="$OUT/nlp.md"
DB="$OUT/nlp.db"
START=$(date +%s)
rm -f "$DB" "$DB-wal" "$DB-shm"
. "$(dirname "$0")/serve_common.sh"

say() { echo "[nlp.sh $(( $(date +%s) - START ))s] $*"; }
md() { printf '%s\n' "$*" >> "$MD"; }
over_budget() { [ $(( $(date +%s) - START )) -ge "$BUDGET_S" ]; }
run_logged() {  # run a command, keep its output in $WORK/last.log, put the command into nlp.md
  md '```'
  md "$*"
  md '```'
  md ""
  say "$*"
  "$@" > "$WORK/last.log" 2>&1
  local rc=$?
  grep -E '^(trial [0-9]|gpuvs: error|stored as|[0-9]+ requests in)' "$WORK/last.log" | tail -n 8
  if [ $rc -ne 0 ]; then
    md "exit status $rc; its last lines:"
    md '```'
    tail -n 6 "$WORK/last.log" >> "$MD"
    md '```'
    md ""
  fi
  return $rc
}

: > "$MD"
md "# NLP: GPU vs CPU, and the gRPC service under load"
md ""
md "Produced by \`benchmarks/nlp.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'). Every trial is in \`nlp.db\`"
md "(\`gpuvs results list --store nlp.db\`)."
if [ "$DEVICE" != cuda ] || [ "$SMALL" != 0 ]; then
  md ""
  md "**Check run** (NLP_BENCH_DEVICE=$DEVICE, NLP_BENCH_SMALL=$SMALL): toy sizes or no GPU; the figures are not a measurement."
fi
md ""
say "machine"
$PY -m gpuvs info --json > "$WORK/info.json" 2> "$WORK/info.err" || say "gpuvs info failed: $(tail -1 "$WORK/info.err")"
$PY - "$WORK/info.json" >> "$MD" <<'PY'
import json, sys
try:
    fp = json.load(open(sys.argv[1]))
except Exception as exc:
    print(f"machine: unknown (gpuvs info failed: {exc})\n"); sys.exit(0)
gpus = ", ".join(f"{g['name']} ({g['memory_mib']} MiB)" for g in fp.get("gpus", [])) or "none"
print("| what | value |\n| --- | --- |")
for k, v in [("GPU", gpus), ("driver", fp.get("driver")), ("torch", fp.get("torch")), ("CUDA (torch)", fp.get("cuda")),
             ("CPU", f"{fp.get('cpu_model')} ({fp.get('cpu_usable')} of {fp.get('cpu_count')} usable)"),
             ("python", fp.get("python")), ("gpuvs", fp.get("gpuvs"))]:
    print(f"| {k} | {v} |")
print()
PY

# ---- the four experiments -------------------------------------------------------------------------
if $PY -m gpuvs compare --help > /dev/null 2>&1; then HAVE_COMPARE=1; else HAVE_COMPARE=0; fi
md "## The four experiments"
md ""
if [ $HAVE_COMPARE = 1 ]; then
  md "Each row is one experiment file run with \`gpuvs compare\` (GPU and CPU trials interleaved in a balanced, shuffled order, each in a fresh process):"
else
  md "\`gpuvs compare\` is not in this build, so each arm ran with \`gpuvs run\` (all trials of one arm, then the other: not interleaved):"
fi
md ""
for W in ner-train tc-train ner-predict tc-predict; do
  FILE="experiments/nlp-gpu-vs-cpu-$W.yaml"
  if over_budget; then md "### $W: skipped (time budget of ${BUDGET_S} s used up)"; say "skip $W"; continue; fi
  # the file as run: the repo's, or a copy adjusted for a check run
  $PY - "$FILE" "$WORK/$W.yaml" "$DEVICE" "$SMALL" <<'PY' || { md "- $W: cannot read $FILE"; continue; }
import sys, yaml
src, dst, device, small = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
exp = yaml.safe_load(open(src))
if small:
    exp["params"].update(sentences=300, d_model=32, layers=1, heads=2, threads=2)
    exp["params"].update({k: v for k, v in dict(epochs=1, requests=20, request_size=4, warmup_requests=2,
                                               warmup_steps=2).items() if k in exp["params"]})
    exp["trials"] = 2
for arm in exp["arms"]:
    if arm["name"] == "gpu":
        arm["device"] = device
yaml.safe_dump(exp, open(dst, "w"), sort_keys=False)
PY
  [ "$DEVICE" = cuda ] && [ "$SMALL" = 0 ] && RUNFILE="$FILE" || RUNFILE="$WORK/$W.yaml"
  md "### $W"
  md ""
  if [ $HAVE_COMPARE = 1 ]; then
    run_logged $PY -m gpuvs compare --file "$RUNFILE" --store "$DB" --quiet
  else
    read -r ARGS TRIALS TIMEOUT GPUDEV <<< "$($PY - "$WORK/$W.yaml" <<'PY'
import sys, yaml
exp = yaml.safe_load(open(sys.argv[1]))
args = ",".join(f"--{k.replace('_', '-')}={v}" for k, v in exp["params"].items())
gpu = next(a["device"] for a in exp["arms"] if a["name"] == "gpu")
print(args, exp["trials"], exp.get("timeout_s", 300), gpu)
PY
)"
    IFS=, read -r -a FLAGS <<< "$ARGS"
    run_logged $PY -m gpuvs run "$W" "${FLAGS[@]}" --device "$GPUDEV" --trials "$TRIALS" --timeout "$TIMEOUT" \
      --store "$DB" --name "nlp-gpu-vs-cpu-$W-gpu" --quiet
    over_budget || run_logged $PY -m gpuvs run "$W" "${FLAGS[@]}" --device cpu --trials "$TRIALS" \
      --timeout "$TIMEOUT" --store "$DB" --name "nlp-gpu-vs-cpu-$W-cpu" --quiet
  fi
  md ""
done

# ---- serve-load against gpuvs serve ---------------------------------------------------------------
md "## serve-load against \`gpuvs serve\` on the $DEVICE"
md ""
if over_budget; then
  md "Skipped: time budget of ${BUDGET_S} s used up."
else
  if [ "$SMALL" = 1 ]; then LOAD=(--clients 4 --requests 100 --request-size 4 --train-sentences 300 --train-d-model 32 --train-layers 1)
  else LOAD=(--clients 8 --requests 3000 --request-size 8 --train-sentences 5000 --train-epochs 2); fi
  md '```'
  md "$PY -m gpuvs serve --port 0 --device $DEVICE --models-dir MODELS_DIR &"
  md '```'
  say "starting gpuvs serve on $DEVICE"
  start_server serve --device "$DEVICE" --models-dir "$WORK/models"
  if [ -z "$PORT" ]; then
    md "gpuvs serve did not start; its last lines:"; md '```'; tail -n 8 "$WORK/serve.err" >> "$MD"; md '```'
  else
    md ""
    md "$(head -1 "$WORK/serve.out")"
    md ""
    for T in tc ner; do
      over_budget && { md "$T: skipped (time budget)"; continue; }
      run_logged $PY -m gpuvs run serve-load --target "127.0.0.1:$PORT" --task "$T" "${LOAD[@]}" \
        --store "$DB" --name "nlp-serve-load-$T" --quiet
    done
    say "stopping gpuvs serve (SIGTERM)"
    kill -TERM "$SERVER_PID"
    for _ in $(seq 1 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then md ""; md "gpuvs serve did not stop within 30 s of SIGTERM"; else
      wait "$SERVER_PID"; md "After SIGTERM (exit status $?):"; md '```'; tail -n 2 "$WORK/serve.out" >> "$MD"; md '```'; fi
    SERVER_PID=""
  fi
fi
md ""

# ---- tables ---------------------------------------------------------------------------------------
say "tables"
$PY - "$DB" >> "$MD" <<'PY' || md "Making the tables failed: see the script's output."
import json, math, sqlite3, sys

import numpy as np
from scipy import stats as st

db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT t.workload, t.arm, t.status, t.error, t.spec, t.metrics, t.startup, t.fingerprint, e.name "
                  "FROM trials t JOIN experiments e ON e.id = t.experiment_id ORDER BY t.id").fetchall()
groups = {}
for workload, arm, status, error, spec, metrics, startup, fp, exp in rows:
    side = arm if arm in ("gpu", "cpu") else exp.rsplit("-", 1)[-1]
    g = groups.setdefault((workload, side), {"ok": [], "failed": [], "device": json.loads(spec)["device"]})
    if status == "ok":
        m = {k: v["value"] for k, v in json.loads(metrics or "{}").items()}
        g["ok"].append({**m, **{f"startup:{k}": v for k, v in json.loads(startup or "{}").items()},
                        "fp": json.loads(fp or "{}")})
    else:
        g["failed"].append(error or status)


def ci(values):
    a = np.asarray(values, float)
    if a.size < 2:
        return float(a.mean()) if a.size else float("nan"), float("nan"), float("nan")
    h = st.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size)
    return float(a.mean()), float(a.mean() - h), float(a.mean() + h)


def ratio_ci(num, den):
    """Ratio of means num/den, 95% CI from Welch's t on the log scale (delta method)."""
    a, b = np.asarray(num, float), np.asarray(den, float)
    r = a.mean() / b.mean()
    if a.size < 2 or b.size < 2:
        return r, float("nan"), float("nan")
    va, vb = a.var(ddof=1) / (a.size * a.mean() ** 2), b.var(ddof=1) / (b.size * b.mean() ** 2)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)) if va + vb > 0 else a.size + b.size - 2
    h = st.t.ppf(0.975, df) * se
    return r, r * math.exp(-h), r * math.exp(h)


def f(x, d=2):
    return "-" if x is None or x != x else f"{x:,.{d}f}"


def cell(values, d=2):
    m, lo, hi = ci(values)
    return f"{f(m, d)} [{f(lo, d)}, {f(hi, d)}]" if values else "-"


print("## The nlp-gpu-vs-cpu table\n")
print("Time is the timed part of each trial, the same work in both arms (sizes in the experiment files): for "
      "training, the optimizer steps after the warm-up steps; for prediction, the timed requests one after another, "
      "after the warm-up requests, with the model loaded before (model load is its own column). "
      "Mean over trials with its 95% CI; the ratio is CPU time / GPU time, its CI from Welch's t on log times.\n")
print("| row | GPU time (s) | CPU time (s) | CPU/GPU | trials ok (GPU, CPU) | GPU examples/sec | CPU examples/sec "
      "| model load GPU / CPU (s) | accuracy GPU / CPU |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
names = {"ner-train": "NER train", "tc-train": "TC train", "ner-predict": "NER predict", "tc-predict": "TC predict"}
failures = []
for w, label in names.items():
    g, c = groups.get((w, "gpu"), {"ok": [], "failed": []}), groups.get((w, "cpu"), {"ok": [], "failed": []})
    if not g["ok"] and not c["ok"] and not g["failed"] and not c["failed"]:
        print(f"| {label} | not run | | | | | | | |")
        continue
    tg, tc = [t["timed_s"] for t in g["ok"]], [t["timed_s"] for t in c["ok"]]
    r, lo, hi = ratio_ci(tc, tg) if tg and tc else (float("nan"),) * 3
    eg, ec = [t["examples_per_sec"] for t in g["ok"]], [t["examples_per_sec"] for t in c["ok"]]
    load = " / ".join(f(ci([t.get("startup:model_load_s", float("nan")) for t in s["ok"]])[0], 3) for s in (g, c)) \
        if w.endswith("predict") else "-"
    acc = " / ".join(f(ci([t["accuracy"] for t in s["ok"]])[0], 3) for s in (g, c))
    print(f"| {label} | {cell(tg, 3)} | {cell(tc, 3)} | **{f(r)}x** [{f(lo)}, {f(hi)}] | {len(tg)}, {len(tc)} "
          f"| {f(ci(eg)[0], 0)} | {f(ci(ec)[0], 0)} | {load} | {acc} |")
    failures += [f"{label} ({side}): {e.splitlines()[0][:200]}" for side, s in (("GPU", g), ("CPU", c)) for e in s["failed"]]
print()
pred = [(w, s) for w in ("ner-predict", "tc-predict") for s in ("gpu", "cpu") if groups.get((w, s), {}).get("ok")]
if pred:
    print("Prediction latency per request (mean over trials of each trial's percentile, ms), and the "
          "start-up that is kept out of it (s):\n")
    print("| row | arm | p50 | p90 | p99 | first request | framework import | model load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for w, s in pred:
        ts = groups[(w, s)]["ok"]
        mean = lambda k: ci([t.get(k, float("nan")) for t in ts])[0]  # noqa: E731
        print(f"| {names[w]} | {s} | {f(mean('latency_p50_ms'))} | {f(mean('latency_p90_ms'))} | "
              f"{f(mean('latency_p99_ms'))} | {f(mean('startup:first_request_s'), 3)} | "
              f"{f(mean('startup:import_s'), 2)} | {f(mean('startup:model_load_s'), 3)} |")
    print()
if failures:
    print("Failed trials:\n")
    for line in failures:
        print(f"- {line}")
    print()
serve_rows = db.execute("SELECT e.name, t.status, t.error, t.metrics, t.startup FROM trials t JOIN experiments e "
                        "ON e.id = t.experiment_id WHERE t.workload = 'serve-load' ORDER BY t.id").fetchall()
if serve_rows:
    print("## serve-load results\n")
    print("| run | status | requests/sec | texts/sec | p50 ms | p90 ms | p99 ms | server p50 ms | failed | "
          "model load (server, s) | training on the server (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, status, error, metrics, startup in serve_rows:
        m = {k: v["value"] for k, v in json.loads(metrics or "{}").items()}
        s = json.loads(startup or "{}")
        if status != "ok":
            print(f"| {name} | {status}: {(error or '').splitlines()[0][:120] if error else ''} | | | | | | | | | |")
            continue
        print(f"| {name} | ok | {f(m['requests_per_sec'], 1)} | {f(m['texts_per_sec'], 0)} | {f(m['latency_p50_ms'])} "
              f"| {f(m['latency_p90_ms'])} | {f(m['latency_p99_ms'])} | {f(m['server_p50_ms'])} "
              f"| {int(m['failed_requests'])} | {f(s.get('model_load_s'), 3)} | {f(s.get('train_s'), 1)} |")
    print()
fps = [t["fp"] for g in groups.values() for t in g["ok"] if t.get("fp")]
if fps:
    fp = fps[0]
    print(f"Torch threads on the CPU arm: every usable core ({fp.get('cpu_usable')} of {fp.get('cpu_count')}, "
          f"{fp.get('cpu_model')}).\n")
PY
say "done: $MD"
cat "$MD"
