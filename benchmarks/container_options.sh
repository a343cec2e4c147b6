#!/usr/bin/env bash
# Which container settings change a training job's speed? Runs experiments/container-options.yaml
# (every arm in a podman container: 1 GB /dev/shm baseline, the engines' default 64 MB, a 2-CPU limit,
# a 16 GB memory limit) on a synthetic ImageFolder of JPEGs made here, read by DataLoader workers.
#
# Usage, from the repo root:  OUT=out PYTHONPATH=src bash benchmarks/container_options.sh
#   DEBS=DIR   carried .debs (default .carry/debs); without them a podman on PATH is used
#   TRIALS=N   trials per arm (default 3)   LIMIT_S=N  time limit of the study (default 420)
#   DEVICE=cpu tiny CPU dry run
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
MD="$OUT/container_options.md"; DB="$OUT/container_options.db"; rm -f "$MD" "$DB" "$DB-wal" "$DB-shm"
DEBS=${DEBS:-.carry/debs}; DEVICE=${DEVICE:-cuda}; TRIALS=${TRIALS:-3}; LIMIT_S=${LIMIT_S:-420}
PY=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-src} COLUMNS=${COLUMNS:-160}
md() { printf '%s\n' "$@" >> "$MD"; }
log() { echo "[container_options.sh] $*" >&2; }
. benchmarks/podman_from_debs.sh

DATA=/tmp/gpuvs-imagefolder
if [ "$DEVICE" = cpu ]; then
  MAKE=(--classes 4 --per-class 20); EXTRA=(--device cpu --model resnet18 --image-size 64 --batch-size 8 --steps 3
                                            --warmup-steps 1 --workers 2)
else
  MAKE=(--classes 16 --per-class 100); EXTRA=(--steps 30)
fi
md "# Container settings that change a training job's speed" "" "$(date -u +%Y-%m-%dT%H:%MZ), device $DEVICE" \
   "$(nvidia-smi -L 2>/dev/null | head -1)" ""
setup_podman || { md "podman set-up failed"; exit 1; }
log "data: $DATA"
rm -rf "$DATA"; "$PY" benchmarks/make_imagefolder.py "$DATA" "${MAKE[@]}" >> "$MD"
CMD=(compare --file experiments/container-options.yaml --data-dir "$DATA" --mount "$DATA:$DATA:ro"
     --trials "$TRIALS" "${EXTRA[@]}" --store "$DB" --quiet)
md "" '```' "python benchmarks/make_imagefolder.py $DATA ${MAKE[*]}" "gpuvs ${CMD[*]}" '```' ""
log "gpuvs ${CMD[*]} (at most ${LIMIT_S}s)"
timeout -s INT "$LIMIT_S" "$PY" -m gpuvs "${CMD[@]}" > "$OUT/container_options.log" 2>&1
md "exit status $?" ""
ID=$("$PY" -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select id from experiments').fetchone()[0])" "$DB")
"$PY" -m gpuvs report "$ID" --format md --store "$DB" >> "$MD" 2>&1
md "" "Errors of failed trials:" '```' "$("$PY" -c "import sqlite3,sys; [print(*r) for r in sqlite3.connect(sys.argv[1]).execute(\"select arm, trial, substr(error, 1, 300) from trials where status != 'ok'\")]" "$DB")" '```'
md "" "containers labelled gpuvs after the run (should be none):" '```' "$(podman ${GPUVS_PODMAN_ARGS:-} ps -a --filter label=gpuvs 2>&1)" '```'
rm -rf "$DATA"
log "wrote $MD"
