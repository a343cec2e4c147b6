#!/usr/bin/env bash
# GPU proof of issue 4 (containers): is training as fast in a container as on the host, and what does
# a container add to start-up? Runs, with podman unpacked from carried Debian packages:
#   experiments/host-vs-container.yaml       resnet50 bf16 bs256 NHWC, 1 GPU, 5 trials per arm, interleaved
#   experiments/host-vs-container-fp32.yaml  resnet50 fp32 bs64 NCHW, 1 GPU, 5 trials per arm, interleaved
#   experiments/host-vs-container-2gpu.yaml  the bf16 study on 2 GPUs (only where 2 GPUs are present)
#   experiments/startup.yaml                 launch to first GPU result, 10 launches per arm
# and writes $OUT/containers.md (tables + the exact commands) and $OUT/containers.db (every sample).
#
# Usage, from the repo root:  OUT=out PYTHONPATH=src bash benchmarks/containers.sh
#   DEBS=DIR      carried .debs (default .carry/debs); without them a podman on PATH is used
#   DEVICE=cpu    CPU dry run with tiny sizes (checks the script end to end on a machine with no GPU)
#   TRIALS=N STARTUP_TRIALS=N   trials per arm (default 5 and 10); PARTS="bf16 fp32 startup 2gpu" (the default) picks parts
#   BF16_S FP32_S STARTUP_S GPU2_S   each part's time limit in seconds (defaults 300, 240, 120, 360: room for
#                 5 trials per arm at 20-30 s a trial, process and container start included)
# Fail-soft: a part that fails is reported in the markdown file and the others still run.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
MD="$OUT/containers.md"; DB="$OUT/containers.db"; rm -f "$MD" "$DB" "$DB-wal" "$DB-shm"
DEBS=${DEBS:-.carry/debs}; DEVICE=${DEVICE:-cuda}
TRIALS=${TRIALS:-5}; STARTUP_TRIALS=${STARTUP_TRIALS:-10}
PY=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-src} COLUMNS=${COLUMNS:-160}
WORK=$(mktemp -d /tmp/gpuvs-containers.XXXXXX)
T0=$(date +%s)
log() { echo "[containers.sh +$(( $(date +%s) - T0 ))s] $*" >&2; }
md() { printf '%s\n' "$@" >> "$MD"; }
gpuvs() { "$PY" -m gpuvs "$@"; }
FAILED=(); LAST_ID=""
fail() { FAILED+=("$1"); md "" "**FAILED: $1** (see the log above)"; log "FAILED: $1"; }

# -- 1. podman from the carried Debian packages (setup_podman) ---------------------------------------
. benchmarks/podman_from_debs.sh

# -- experiment files for this run (DEVICE=cpu: tiny CPU versions of the same studies) --------------
prepare_file() {  # FILE -> path of the file to run
  if [ "$DEVICE" = cpu ]; then
    "$PY" - "$1" "$WORK/$(basename "$1")" <<'PYEOF'
import sys, yaml
src, dst = sys.argv[1:3]
exp = yaml.safe_load(open(src))
exp["device"] = "cpu"
small = {"batch_size": 2, "image_size": 64, "warmup_steps": 2, "steps": 5, "display_every": 5}
if exp["workload"] == "cnn-train":
    exp["params"].update(small)
exp.pop("num_gpus", None)
yaml.safe_dump(exp, open(dst, "w"), sort_keys=False)
PYEOF
    echo "$WORK/$(basename "$1")"
  else
    echo "$1"
  fi
}

# -- 2. one experiment file: gpuvs compare ---
run_file() {  # TITLE FILE TRIALS TIME_LIMIT_S
  local title=$1 file; file=$(prepare_file "$2"); local trials=$3 limit=$4 rc
  md "" "## $title" "" "\`\`\`" "gpuvs compare --file $2 --trials $trials --store containers.db --quiet" \
     "gpuvs report EXPERIMENT_ID --format md --store containers.db" "\`\`\`"
  log "$title: $file, $trials trials per arm, at most ${limit}s"
  local before; before=$(experiment_ids)
  timeout -s INT "$limit" "$PY" -m gpuvs compare --file "$file" --trials "$trials" --store "$DB" --quiet \
    > "$WORK/run.log" 2>&1; rc=$?
  tail -n 40 "$WORK/run.log" >&2
  [ $rc -eq 0 ] || md "" "exit status $rc (124/130: stopped at the part's ${limit}s limit; finished trials are kept)" \
     "" '```' "$(grep -E 'FAILED|error|Error' "$WORK/run.log" | head -5)" '```'
  local id; id=$(comm -13 <(echo "$before") <(experiment_ids) | head -1); LAST_ID=$id
  if [ -z "$id" ]; then fail "$title: no experiment stored"; return; fi
  md "" "experiment \`$id\`"
  if gpuvs report --help >/dev/null 2>&1; then
    gpuvs report "$id" --format md --store "$DB" >> "$MD" 2>"$WORK/report.err" || { cat "$WORK/report.err" >&2; summary "$id"; }
  else
    summary "$id"
  fi
  [ $rc -eq 0 ] || fail "$title (exit status $rc)"
}

experiment_ids() {
  "$PY" -c "import sqlite3,sys,os; p=sys.argv[1]; print('\n'.join(r[0] for r in sqlite3.connect(p).execute('select id from experiments order by id')) if os.path.exists(p) else '')" "$DB"
}

# per arm: trials, mean and 95% CI of the headline and of launch_to_exit_s; ratio to the first arm with a
# Welch 95% CI of the difference (used where `gpuvs report` is not in this checkout, and for start-up)
summary() {
  "$PY" - "$DB" "$1" >> "$MD" 2>&1 <<'PYEOF'
import sys
import numpy as np
from scipy import stats as st
from gpuvs.analysis.stats import summarize_trials
from gpuvs.store.db import Store
db, exp_id = sys.argv[1:3]
with Store(db) as s:
    trials = [t.to_dict() for t in s.trials(exp_id)]
arms = {}
for t in trials:
    a = arms.setdefault(t["arm"], {"head": [], "exit": [], "n": 0, "unit": "", "series": ""})
    a["n"] += 1
    if t["status"] != "ok":
        continue
    series, head = next(iter((t["summary"] or {}).items()), (None, {}))
    if head.get("value") is not None:
        a["head"].append(head["value"]); a["unit"] = head.get("unit", ""); a["series"] = series
    if (t["startup"] or {}).get("launch_to_exit_s") is not None:
        a["exit"].append(t["startup"]["launch_to_exit_s"])
def ci(v):
    s = summarize_trials(v)
    return (f"{s['mean']:.4g} [{s['ci_low']:.4g}, {s['ci_high']:.4g}]" if s.get("n", 0) > 1 else
            (f"{s['mean']:.4g}" if s.get("n") else "-"))
def diff(a, b):
    if len(a) < 2 or len(b) < 2:
        return "-"
    try:
        lo, hi = st.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    except (AttributeError, TypeError):  # scipy < 1.11
        lo = hi = float("nan")
    return f"{np.mean(b) - np.mean(a):+.4g} [{lo:+.4g}, {hi:+.4g}] (ratio {np.mean(b) / np.mean(a):.4f})"
names = list(arms)
print(f"\n| arm | trials ok | {arms[names[0]]['series']} ({arms[names[0]]['unit']}), mean [95% CI] | "
      f"vs {names[0]}: difference [Welch 95% CI] | launch_to_exit_s, mean [95% CI] | vs {names[0]} |")
print("| --- | --- | --- | --- | --- | --- |")
for n in names:
    a, b = arms[names[0]], arms[n]
    print(f"| {n} | {len(b['head'])}/{b['n']} | {ci(b['head'])} | {'-' if n == names[0] else diff(a['head'], b['head'])} | "
          f"{ci(b['exit'])} | {'-' if n == names[0] else diff(a['exit'], b['exit'])} |")
PYEOF
}

# -- the run ---------------------------------------------------------------------------------------
md "# gpuvs: host vs container on a GPU (issue 4)" "" "$(date -u +%Y-%m-%dT%H:%MZ), device $DEVICE, $(hostname)" ""
md '```' "$(nvidia-smi -L 2>&1 | head -8)" "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)" \
   "$("$PY" -c 'import torch,sys;print("torch",torch.__version__,"cuda",torch.version.cuda,"python",sys.version.split()[0])' 2>&1)" '```'
md "" "## Set-up" ""
log "set-up: podman from $DEBS"
setup_podman || fail "podman set-up"

md "" "## gpuvs doctor" "" '```' "gpuvs doctor --env container --rootfs /:O --device $DEVICE" '```' '```'
log "doctor"
timeout 120 "$PY" -m gpuvs doctor --env container --rootfs /:O --device "$DEVICE" >> "$MD" 2>&1 || fail "gpuvs doctor"
md '```'

want() { case " ${PARTS:-bf16 fp32 startup 2gpu} " in *" $1 "*) return 0 ;; esac; return 1; }
want bf16 && run_file "Host vs container: resnet50 bf16 batch 256 NHWC, 1 GPU" experiments/host-vs-container.yaml "$TRIALS" ${BF16_S:-300}
want fp32 && run_file "Host vs container: resnet50 fp32 batch 64 NCHW, 1 GPU" experiments/host-vs-container-fp32.yaml "$TRIALS" ${FP32_S:-240}
want startup && run_file "Start-up: launch to first GPU result (one tiny kernel), one launch per trial" experiments/startup.yaml \
  "$STARTUP_TRIALS" ${STARTUP_S:-120}
if want startup && [ -n "$LAST_ID" ] && gpuvs report --help >/dev/null 2>&1; then  # (without `report`, run_file printed it)
  md "" "Start-up and total wall time per launch (launch_to_exit_s: launch to process exit, container teardown included):"
  summary "$LAST_ID"
fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if ! want 2gpu; then
  :
elif [ "$DEVICE" = cuda ] && [ "${NGPU:-0}" -ge 2 ]; then
  run_file "Host vs container: resnet50 bf16 batch 256 NHWC, 2 GPUs" experiments/host-vs-container-2gpu.yaml "$TRIALS" ${GPU2_S:-360}
else
  md "" "## 2 GPUs" "" "skipped: ${NGPU:-0} GPU(s) here (experiments/host-vs-container-2gpu.yaml needs 2)"
fi

md "" "## Leftovers" "" "containers labelled gpuvs after the run (should be none):" '```'
podman ${GPUVS_PODMAN_ARGS:-} ps -a --filter label=gpuvs >> "$MD" 2>&1
md '```' "" "total time: $(( $(date +%s) - T0 )) s; failed parts: ${#FAILED[@]} ${FAILED[*]:-}"
rm -rf "$WORK"
log "wrote $MD and $DB in $(( $(date +%s) - T0 )) s; failed parts: ${#FAILED[@]}"
