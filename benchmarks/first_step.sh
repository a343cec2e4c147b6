#!/usr/bin/env bash
# Why is the first training step slower in a container? containers.sh found ResNet-50 bf16 NHWC's first
# step at ~15 s in every container trial but only in the first host trial (~4.5 s after it). This
# script finds what the first host run writes to disk and times the first step cold, warm, with
# CUDA's kernel cache disabled, and in a container with and without the host's caches mounted.
#
# Usage, from the repo root:  OUT=out PYTHONPATH=src bash benchmarks/first_step.sh
#   DEBS=DIR  carried .debs (default .carry/debs)    DEVICE=cpu  dry run (tiny sizes)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
MD="$OUT/first_step.md"; DB="$OUT/first_step.db"; rm -f "$MD" "$DB" "$DB-wal" "$DB-shm"
DEBS=${DEBS:-.carry/debs}; DEVICE=${DEVICE:-cuda}; PY=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-src} COLUMNS=${COLUMNS:-160}
md() { printf '%s\n' "$@" >> "$MD"; }
log() { echo "[first_step.sh] $*" >&2; }
. benchmarks/podman_from_debs.sh

if [ "$DEVICE" = cpu ]; then
  ARGS=(--model resnet18 --batch-size 2 --image-size 64 --steps 2 --warmup-steps 1 --device cpu)
else
  ARGS=(--model resnet50 --batch-size 256 --precision bf16 --data-format NHWC --steps 5 --warmup-steps 2 --device cuda)
fi
CONTAINER=(--env container --engine podman --rootfs /:O)

# one run: NAME [extra gpuvs options...]; prints a table row with first_step_s and the other start-up costs
one() {
  local name=$1; shift
  log "$name"
  "$PY" -m gpuvs run cnn-train "${ARGS[@]}" "$@" --store "$DB" --name "$name" --quiet > "$OUT/$name.log" 2>&1 \
    || { md "| $name | FAILED (exit $?): $(grep -m1 -iE 'error|failed' "$OUT/$name.log") | | | |"; return; }
  "$PY" - "$DB" "$name" >> "$MD" <<'PYEOF'
import json, sqlite3, sys
db, name = sys.argv[1:3]
c = sqlite3.connect(db)
startup, summary = c.execute("select t.startup, t.summary from trials t join experiments e on e.id = t.experiment_id "
                             "where e.name = ? order by t.id desc limit 1", (name,)).fetchone()
s, head = json.loads(startup or "{}"), next(iter(json.loads(summary or "{}").values()), {})
f = lambda k: f"{s[k]:.2f}" if isinstance(s.get(k), (int, float)) else "-"
print(f"| {name} | {f('first_step_s')} | {f('import_s')} | {f('launch_to_exit_s')} | {head.get('value', 0):.1f} |")
PYEOF
}

md "# First training step: host vs container, cold and warm caches" "" "$(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi -L 2>/dev/null | head -1)" ""
md '```' "gpuvs run cnn-train ${ARGS[*]}" '```' ""
setup_podman || { md "podman set-up failed"; exit 1; }
md "" "| run | first_step_s | import_s | launch_to_exit_s | images/sec |" "| --- | ---: | ---: | ---: | ---: |"

touch "$OUT/.marker"; sleep 1
one host-cold
# what the first run wrote outside the store and this script's folders: the caches
find / -xdev -type f -newer "$OUT/.marker" -not -path "$OUT/*" -not -path '/proc/*' -not -path '/tmp/gpuvs-podman/*' \
  -printf '%s %p\n' 2>/dev/null | sort -rn > "$OUT/written.all"
# every file counted by its folder (first three path parts), then the 40 largest
awk '{split($2, p, "/"); d = "/" p[2] "/" p[3] "/" p[4]; n[d]++; b[d] += $1}
     END {for (d in n) printf "%d files, %d bytes under %s\n", n[d], b[d], d}' "$OUT/written.all" > "$OUT/written.txt"
echo "largest:" >> "$OUT/written.txt"; head -40 "$OUT/written.all" >> "$OUT/written.txt"; rm -f "$OUT/written.all"
one host-warm
CUDA_CACHE_DISABLE=1 one host-no-cuda-cache
one container "${CONTAINER[@]}"
# the same container with the host's (now warm) cache folders mounted where the container's HOME has them
MOUNTS=()
for d in "$HOME/.nv" "$HOME/.cache"; do [ -d "$d" ] && MOUNTS+=(--mount "$d:$d"); done
one container-host-caches "${CONTAINER[@]}" "${MOUNTS[@]}"
one container-again "${CONTAINER[@]}"

md "" "Files the first host run wrote (per folder, then the 40 largest, bytes):" '```' "$(cat "$OUT/written.txt")" '```'
md "" "Caches mounted in container-host-caches: ${MOUNTS[*]:-none found}"
md "" "containers labelled gpuvs after the run (should be none):" '```' "$(podman ${GPUVS_PODMAN_ARGS:-} ps -a --filter label=gpuvs 2>&1)" '```'
log "wrote $MD"
