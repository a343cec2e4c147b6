#!/usr/bin/env bash
# GPU proof of sharing, part 2 (issue 15): the MPS advisor predicted against measured on eight pairs,
# the co-location capacity study (processes, MPS off and on), and a latency-sensitive inference job
# next to a training job under time-slicing, MPS and the MPS knobs (thread percentage, memory limit).
# Each part runs under its own time limit (SIGTERM, which gpuvs treats like Ctrl-C: every worker and
# the MPS daemon stopped, what was measured kept); everything lands under $OUT/sharing.
#
#   OUT=/tmp/out PARTS="advise capacity latency" benchmarks/sharing.sh
#   CPU check of the script itself: DEVICE=cpu OUT=/tmp/out benchmarks/sharing.sh   (tiny jobs, no MPS)
set -u
OUT=${OUT:-out}
DEST="$OUT/sharing"
mkdir -p "$DEST"
PARTS=${PARTS:-"advise capacity latency"}   # also: predict (solo runs only), pair (one pair, share --with)
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" COLUMNS=${COLUMNS:-220}
DB="$DEST/sharing.db"
LIMIT_ADVISE=${LIMIT_ADVISE:-300}
LIMIT_CAPACITY=${LIMIT_CAPACITY:-200}
LIMIT_LATENCY=${LIMIT_LATENCY:-120}
LIMIT_PREDICT=${LIMIT_PREDICT:-100}
LIMIT_PAIR=${LIMIT_PAIR:-45}

if [ "$DEVICE" = cpu ]; then
  PAIRS="$DEST/pairs-cpu.yaml"
  printf 'pairs:\n  - ["selftest --step-seconds 0.02", "selftest --step-seconds 0.05"]\n  - ["kernels --app hotspot3D --scale tiny --check false", "selftest"]\n' > "$PAIRS"
  ADVISE_ARGS="--repeats 2 --duration 1"
  CAPACITY=(kernels --app hotspot3D --scale tiny --check false --hold-mb 10 --max-workers 3 --duration 1)
  MPS=off; KNOBS=()
  INFER=(selftest --step-seconds 0.01); TRAIN="selftest --step-seconds 0.03"
  LAT_ARGS=(--repeats 2 --duration 1)
  PAIR=(selftest --step-seconds 0.02); PAIR_WITH="selftest --step-seconds 0.05"; PAIR_ARGS=(--repeats 1 --duration 1)
else
  PAIRS=${PAIRS:-experiments/sharing/advisor-pairs.yaml}
  ADVISE_ARGS=${ADVISE_ARGS:-"--repeats 2 --duration 2"}
  # per instance: hotspot3D on a 512 x 512 x 32 grid (about 100 MB, the published study's 98 MB) plus
  # 6 GB held beside it, so that an 80 GB GPU fills within the ten minutes
  HOLD_MB=${HOLD_MB:-6000}
  CAPACITY=(kernels --app hotspot3D --size 512 --check false --hold-mb "$HOLD_MB" --max-workers 40 --duration 1.5)
  MPS=both; read -r -a KNOBS <<< "${KNOBS:---mps-threads 100:50 --mps-mem-limit 8G:60G}"
  read -r -a INFER <<< "${INFER:-cnn-infer --model resnet50 --batch-size 1 --precision bf16 --warmup-steps 5}"
  TRAIN=${TRAIN:-"cnn-train --model resnet50 --batch-size 128 --precision bf16 --data-format NHWC --warmup-steps 3"}
  read -r -a LAT_ARGS <<< "${LAT_ARGS:---repeats 2 --duration 3}"
  PAIR=(kernels --app pathfinder --check false); PAIR_WITH="kernels --app hotspot3D --check false"
  read -r -a PAIR_ARGS <<< "${PAIR_ARGS:---repeats 2 --duration 2}"
fi

leftovers() {  # anything of gpuvs's still running: workers, MPS daemons, GPU compute processes
  echo "gpuvs workers: $(pgrep -fc 'gpuvs.trial.worker' || true); MPS processes: $(pgrep -c nvidia-cuda-mps || true)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | sed 's/^/  GPU process: /'
}

part() {  # part NAME LIMIT gpuvs-args...
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): gpuvs $*" | tee -a "$DEST/commands.txt"
  local t0=$SECONDS
  timeout -s TERM -k 30 "$limit" "$PY" -m gpuvs "$@" --store "$DB" > "$DEST/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s; after it: $(leftovers | tr '\n' ' ')" | tee -a "$DEST/commands.txt"
  grep -v '^  ' "$DEST/$name.txt" | tail -40
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU"; } > "$DEST/gpu.txt"
for p in $PARTS; do
  case $p in
    advise) part advise "$LIMIT_ADVISE" advise-mps --pairs "$PAIRS" --device "$DEVICE" $ADVISE_ARGS \
              --json "$DEST/advise.json" ;;
    predict) part predict "$LIMIT_PREDICT" advise-mps --pairs "$PAIRS" --predict-only --device "$DEVICE" $ADVISE_ARGS \
               --json "$DEST/predict.json" ;;
    pair) part pair "$LIMIT_PAIR" advise-mps "${PAIR[*]}" "$PAIR_WITH" --device "$DEVICE" "${PAIR_ARGS[@]}" \
            --json "$DEST/pair.json" ;;
    capacity) part capacity "$LIMIT_CAPACITY" share --capacity "${CAPACITY[@]}" --device "$DEVICE" --mps "$MPS" ;;
    latency) part latency "$LIMIT_LATENCY" share "${INFER[@]}" --with "$TRAIN" --device "$DEVICE" --mps "$MPS" \
               "${KNOBS[@]}" "${LAT_ARGS[@]}" ;;
    *) echo "unknown part $p (advise, predict, pair, capacity, latency)"; exit 2 ;;
  esac
done
