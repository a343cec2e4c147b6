#!/usr/bin/env bash
# serve-load against `gpuvs serve` at increasing client counts, up to and past saturation, for the GPU server
# and then the CPU server (issue 16): throughput, p50/p99 latency, busy refusals retried, the server's own
# Metrics after each point, and the saturation point of each (the fewest clients whose throughput is within
# 5% of the best seen).
#
#   OUT=/some/folder PYTHONPATH=src bash benchmarks/serve_load.sh
#
# Settings: SL_CLIENTS ("1 2 4 8 16 32 64"), SL_SECONDS_PER_POINT (about 4 s of requests a point, sized from
# the previous point's rate), SL_DEVICES ("cuda cpu"), SL_BUDGET_S (180: points not started by then are skipped),
# SL_SERVE_ARGS (more `gpuvs serve` options, e.g. "--max-in-flight 2"; none by default).
# Both servers run with their defaults (--max-in-flight 8, --max-queue 16) unless SL_SERVE_ARGS says otherwise and read one models folder: the
# model is trained once, by the first serve-load, on the first server. Writes $OUT/serve_load.md (with the
# server's Metrics after each point) and $OUT/serve_load.db. A check run without a GPU: SL_DEVICES=cpu SL_SMALL=1.
set -u
OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src}
PY=${PYTHON:-python}
CLIENTS=${SL_CLIENTS:-"1 2 4 8 16 32 64"}
PER_POINT=${SL_SECONDS_PER_POINT:-4}
DEVICES=${SL_DEVICES:-"cuda cpu"}
BUDGET_S=${SL_BUDGET_S:-180}
SMALL=${SL_SMALL:-0}
MD="$OUT/serve_load.md"
DB="$OUT/serve_load.db"
START=$(date +%s)
rm -f "$DB" "$DB-wal" "$DB-shm"
. "$(dirname "$0")/serve_common.sh"
say() { echo "[serve_load.sh $(( $(date +%s) - START ))s] $*"; }
over_budget() { [ $(( $(date +%s) - START )) -ge "$BUDGET_S" ]; }

if [ "$SMALL" = 1 ]; then MODEL=(--train-sentences 300 --train-d-model 32 --train-layers 1); else MODEL=(--train-sentences 2000); fi
: > "$MD"
echo "# serve-load at increasing client counts (benchmarks/serve_load.sh, $(date -u '+%Y-%m-%d %H:%M UTC'))" >> "$MD"
echo >> "$MD"
$PY -m gpuvs info --json > "$WORK/info.json" 2>/dev/null && $PY - "$WORK/info.json" >> "$MD" <<'PY'
import json, sys
fp = json.load(open(sys.argv[1]))
gpus = ", ".join(g["name"] for g in fp.get("gpus", [])) or "none"
print(f"GPU: {gpus}; CPU: {fp.get('cpu_model')} ({fp.get('cpu_usable')} usable cores); torch {fp.get('torch')}\n")
PY

RATE=200
for DEV in $DEVICES; do
  over_budget && { say "skip $DEV: budget"; continue; }
  read -r -a EXTRA <<< "${SL_SERVE_ARGS:-}"
  start_server "serve-$DEV" --device "$DEV" --models-dir "$WORK/models" "${EXTRA[@]}"
  if [ -z "$PORT" ]; then echo "gpuvs serve on $DEV did not start: $(tail -2 "$WORK/serve-$DEV.err")" >> "$MD"; continue; fi
  say "$(head -1 "$WORK/serve-$DEV.out")"
  echo "\`$(head -1 "$WORK/serve-$DEV.out")\`" >> "$MD"
  echo >> "$MD"
  for C in $CLIENTS; do
    over_budget && { say "skip $DEV clients=$C: budget"; continue; }
    N=$(( RATE * PER_POINT )); [ "$N" -lt $(( C * 20 )) ] && N=$(( C * 20 ))
    CMD=(serve-load --target "127.0.0.1:$PORT" --task tc --clients "$C" --requests "$N" --request-size 8 "${MODEL[@]}"
         --warmup-requests 20 --device "$DEV" --store "$DB" --name "serve-load-$DEV-c$C" --quiet --telemetry-interval 0)
    say "gpuvs run ${CMD[*]}"
    $PY -m gpuvs run "${CMD[@]}" > "$WORK/last.log" 2>&1 || { say "failed: $(tail -3 "$WORK/last.log")"; continue; }
    grep -E "requests in" "$WORK/last.log" | tail -1
    NEW=$($PY - "$DB" "serve-load-$DEV-c$C" <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
row = db.execute("SELECT t.metrics FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE e.name = ? "
                 "AND t.status = 'ok'", (sys.argv[2],)).fetchone()
print(int(json.loads(row[0])["requests_per_sec"]["value"]) if row else 0)
PY
)
    [ "${NEW:-0}" -gt "$RATE" ] && RATE=$NEW
    $PY -m gpuvs serve-metrics --target "127.0.0.1:$PORT" --json > "$WORK/metrics-$DEV-c$C.json" 2>/dev/null
  done
  kill -TERM "$SERVER_PID"; wait "$SERVER_PID"; SERVER_PID=""
done

$PY - "$DB" "$WORK" >> "$MD" <<'PY'
import glob, json, os, sqlite3, sys

db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT e.name, t.status, t.metrics FROM trials t JOIN experiments e ON e.id = t.experiment_id "
                  "ORDER BY t.id").fetchall()
by_dev = {}
for name, status, metrics in rows:
    _, _, dev, c = name.rsplit("-", 3)
    m = {k: v["value"] for k, v in json.loads(metrics or "{}").items()}
    by_dev.setdefault(dev, []).append((int(c[1:]), status, m))
for dev, points in by_dev.items():
    ok = [(c, m) for c, s, m in points if s == "ok"]
    best = max((m["requests_per_sec"] for _, m in ok), default=0)
    sat = next((c for c, m in ok if m["requests_per_sec"] >= 0.95 * best), None)
    print(f"\n### {dev} server\n")
    print("| clients | requests/sec | texts/sec | p50 ms | p99 ms | busy refusals (retried) | failed | server: peak in flight / queued; refused; Predict p99 over its last 1000 calls (all cumulative) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for c, s, m in points:
        if s != "ok":
            print(f"| {c} | {s} | | | | | | |")
            continue
        path = os.path.join(sys.argv[2], f"metrics-{dev}-c{c}.json")
        peaks = "-"
        if os.path.exists(path):
            sm = json.load(open(path))
            pred = next((x for x in sm.get("calls", []) if x.get("method") == "Predict"), {})
            peaks = (f"{sm.get('peakInFlight', 0)} / {sm.get('peakQueued', 0)}; refused {sm.get('refused', 0)}; "
                     f"Predict p99 {float(pred.get('p99Ms', 0)):.2f} ms")
        mark = " **saturation**" if c == sat else ""
        print(f"| {c}{mark} | {m['requests_per_sec']:,.0f} | {m['texts_per_sec']:,.0f} | {m['latency_p50_ms']:.2f} | "
              f"{m['latency_p99_ms']:.2f} | {int(m.get('refused_responses', 0))} | {int(m['failed_requests'])} | {peaks} |")
    if sat is not None:
        print(f"\nSaturation ({dev}): {sat} clients, {best:,.0f} requests/sec at best (the fewest clients within 5% of it).")
PY
say "done"
cat "$MD"
