#!/usr/bin/env bash
# GPU proof of `gpuvs compare` (issue 3): the shipped experiments gpu-vs-cpu-train,
# gpu-vs-cpu-predict (ResNet-50, batch 32; the CPU arm kept short: 10 timed steps, 3 trials per arm)
# and fp32-vs-bf16 (ResNet-50, batch 128), each a real `gpuvs compare --file ...`, then
# `gpuvs report` as markdown (all three, into $OUT/compare.md with the commands) and as HTML
# (gpu-vs-cpu-train, into $OUT/compare.html).
#
#   OUT=/tmp/out PYTHONPATH=src bash benchmarks/compare.sh            # on a GPU machine (about 5 minutes on an H100)
#   OUT=/tmp/out PYTHONPATH=src bash benchmarks/compare.sh --small    # CPU check: cuda arms moved to cpu, tiny sizes
#
# Fails soft: an experiment that fails or runs past its time limit is reported in compare.md (with
# its log's tail) and the others still run. Each experiment has a time limit (Ctrl-C semantics:
# finished trials are kept and reported), so the whole script ends within about 8 minutes
# (expected: about 5).
set -uo pipefail
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src}
SMALL=${GPUVS_BENCH_SMALL:-0}
[ "${1:-}" = "--small" ] && SMALL=1
PY=${PYTHON:-python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DB=$WORK/compare.db
MD=$OUT/compare.md
HTML=$OUT/compare.html
T0=$(date +%s)

say() { echo "[compare.sh +$(( $(date +%s) - T0 ))s] $*"; }

# name | time limit in seconds (GPU run)
EXPERIMENTS=("gpu-vs-cpu-train 150" "gpu-vs-cpu-predict 95" "fp32-vs-bf16 110")
EXTRA=()
if [ "$SMALL" = 1 ]; then
  EXTRA=(--model resnet18 --batch-size 2 --image-size 32 --trials 2 --steps 5 --warmup-steps 1 --display-every 1)
fi

{
  echo "# gpuvs compare: GPU proof"
  echo
  if [ "$SMALL" = 1 ]; then
    echo "**SMALL CPU CHECK: every cuda arm was moved to the CPU and the sizes are tiny. Not a GPU result.**"
    echo
  fi
  echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') from commit \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\`."
  echo
  echo '```'
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -1
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo '```'
  echo
  echo "Each experiment: \`gpuvs compare --file experiments/NAME.yaml\`, its trials interleaved and shuffled"
  echo "(A B B A ...), each trial a fresh worker process; then \`gpuvs report ID --format md\`."
} > "$MD"

latest_id() {  # the newest experiment of this name in the store
  $PY - "$DB" "$1" <<'PYEOF'
import sqlite3, sys
try:
    row = sqlite3.connect(sys.argv[1]).execute(
        "SELECT id FROM experiments WHERE name=? ORDER BY created DESC LIMIT 1", (sys.argv[2],)).fetchone()
except sqlite3.Error:
    row = None
print(row[0] if row else "")
PYEOF
}

HTML_ID=""
for entry in "${EXPERIMENTS[@]}"; do
  read -r name limit <<<"$entry"
  file=experiments/$name.yaml
  if [ "$SMALL" = 1 ]; then
    sed 's/device: cuda/device: cpu/g' "$file" > "$WORK/$name.yaml"
    file=$WORK/$name.yaml
    limit=300
  fi
  cmd=($PY -m gpuvs compare --file "$file" --store "$DB" --quiet "${EXTRA[@]}")
  shown="gpuvs compare --file experiments/$name.yaml --store compare.db --quiet${EXTRA[*]:+ ${EXTRA[*]}}"
  say "$name: $shown (limit ${limit}s)"
  start=$(date +%s)
  timeout -s INT -k 30 "$limit" "${cmd[@]}" 2>&1 | tee "$WORK/$name.log"
  rc=${PIPESTATUS[0]}
  secs=$(( $(date +%s) - start ))
  id=$(latest_id "$name")
  say "$name: exit status $rc after ${secs}s, experiment ${id:-none}"
  {
    echo
    echo "## $name"
    echo
    echo '```'
    echo "$shown"
    [ -n "$id" ] && echo "gpuvs report $id --store compare.db --format md"
    echo '```'
    echo
    case $rc in
      0) echo "Every trial ran (exit 0) in ${secs} s." ;;
      1) echo "**Some trials failed (exit 1) after ${secs} s; the report lists them.**" ;;
      124|130) echo "**Stopped at its time limit (${limit} s); finished trials are reported below.**" ;;
      *) echo "**gpuvs compare exited with status $rc after ${secs} s.**" ;;
    esac
  } >> "$MD"
  if [ -n "$id" ]; then
    if $PY -m gpuvs report "$id" --store "$DB" --format md > "$WORK/$name.md" 2> "$WORK/$name.report.err"; then
      { echo; sed 's/^### /#### /; s/^## /### Report: /' "$WORK/$name.md"; } >> "$MD"
    else
      { echo; echo "**gpuvs report failed:**"; echo '```'; tail -5 "$WORK/$name.report.err"; echo '```'; } >> "$MD"
    fi
    if [ -z "$HTML_ID" ] || [ "$name" = gpu-vs-cpu-train ]; then
      [ "$name" = gpu-vs-cpu-train ] && HTML_ID=$id || HTML_ID=${HTML_ID:-$id}
    fi
  fi
  if [ "$rc" != 0 ]; then
    { echo; echo "Last lines of its output:"; echo '```'; tail -15 "$WORK/$name.log"; echo '```'; } >> "$MD"
  fi
done

if [ -n "$HTML_ID" ]; then
  say "HTML report of $HTML_ID -> $HTML"
  if $PY -m gpuvs report "$HTML_ID" --store "$DB" --format html -o "$HTML" 2> "$WORK/html.err"; then
    { echo; echo "## HTML report"; echo; echo "\`gpuvs report $HTML_ID --store compare.db --format html -o compare.html\`"
      echo "(self-contained; for a screenshot: \`chromium --headless --no-sandbox --disable-gpu --screenshot=compare.png --window-size=1280,3000 file://\$PWD/compare.html\`)"; } >> "$MD"
  else
    { echo; echo "**HTML report failed:**"; echo '```'; tail -5 "$WORK/html.err"; echo '```'; } >> "$MD"
  fi
else
  { echo; echo "No experiment produced results; no HTML report."; } >> "$MD"
fi
say "done in $(( $(date +%s) - T0 ))s: $MD${HTML_ID:+ and $HTML}"
