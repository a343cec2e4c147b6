#!/usr/bin/env bash
# The GPU check after the reliability work and the house (issues 30, 31): the figures of BENCHMARKS.md unchanged, in
# one call. 1. benchmarks/spot_check.sh: cnn-train against the plain PyTorch loop (ResNet-50 bf16 NHWC batch 256)
# and gemm against a bare torch.matmul. 2. A user's own training script (benchmarks/user_train_loop.py, ResNet-50
# batch 256 bf16 autocast channels_last) as a `command`, wrapped (gpuvs's worker runs it under its keeper) against
# bare (the script is gpuvs's own child, under its keeper): a verdict, each arm's rate, the script against cnn-train,
# and how each trial's tree was held (cgroup v2 on the lent machine).
# Usage, from the repo root:  OUT=out [PAIRS=2] [TRIALS=3] bash benchmarks/reliability_gpu.sh
# Writes OUT/spot_check.md, OUT/hardware.md (from spot_check.sh), OUT/command.txt, OUT/reliability_gpu.md.
set -u
cd "$(dirname "$0")/.." || exit 2
: "${OUT:?set OUT to an output folder}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="${PYTHONPATH:-src}"
PY=${PYTHON:-python}
TRIALS=${TRIALS:-3}
OUT="$OUT" PAIRS="${PAIRS:-2}" bash benchmarks/spot_check.sh
DB="$OUT/command.db"
rm -f "$DB" "$DB-wal" "$DB-shm"
timeout 420 "$PY" -m gpuvs compare command --device cuda --trials "$TRIALS" --store "$DB" \
  --step-metric 'images_per_sec=step \d+: ([0-9.]+) images/sec,rate,images/sec' --headline images_per_sec \
  --arm wrapped --arm bare:bare=true \
  -- "$PY" benchmarks/user_train_loop.py resnet50 256 amp steps=60 warmup=15 > "$OUT/command.txt" 2>&1
echo "compare exit $?" >> "$OUT/command.txt"
"$PY" - "$DB" "$OUT/spot.db" > "$OUT/reliability_gpu.md" <<'PYEOF'
import json, sqlite3, statistics, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT arm, status, summary, config FROM trials ORDER BY id").fetchall()
print("| arm | trial status | images/sec (the script's mean per-step rate) | containment |")
print("| --- | --- | ---: | --- |")
rates = {}
for arm, status, summary, config in rows:
    s = json.loads(summary or "{}").get("images_per_sec") or {}
    c = json.loads(config or "{}").get("containment", "-")
    v = s.get("value")
    rates.setdefault(arm, []).append(v)
    print(f"| {arm} | {status} | {v if v is None else round(v, 1)} | {c} |")
spot = sqlite3.connect(sys.argv[2]).execute(
    "SELECT summary FROM trials WHERE status='ok' AND workload='cnn-train'").fetchall()
cnn = [json.loads(r[0])["main"]["value"] for r in spot]
print()
for arm, vs in rates.items():
    ok = [v for v in vs if v is not None]
    if ok and cnn:
        print(f"- {arm}: mean {statistics.mean(ok):.1f} images/sec; against gpuvs cnn-train "
              f"({statistics.mean(cnn):.1f}): {statistics.mean(ok) / statistics.mean(cnn):.4f}")
PYEOF
cat "$OUT/reliability_gpu.md"
