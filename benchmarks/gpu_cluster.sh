#!/usr/bin/env bash
# The GPU cluster kit (issues 24 and 26): a Kubernetes cluster on one GPU machine, with the whole control plane
# (etcd, API server, scheduler, controller-manager) and NODES kubelets, one GPU each: each kubelet has its own
# containerd, cgroup root, ports, mount namespace and device plugin (the project's fixture in --real mode, handing
# out only its own /dev/nvidia<minor>, /dev/nvidiactl and /dev/nvidia-uvm*). The cluster is scripts/test-cluster's,
# set up through its environment (docs/kubernetes.md); the runs, each a part with its own time limit:
#   validate  gpuvs validate (functional), then --disruptive on the first node with the kit's own commands
#             (`kit plugin restart NODE`, `kit kubelet restart NODE`, `kit apiserver stop|start`)
#   fleet     gpuvs fleet cnn-train and gemm across the nodes, without and then with a co-tenant outside
#             Kubernetes (benchmarks/gpu_cotenant.py: large GEMMs) on the GPU of SLOW_NODE
#   scaling   gpuvs compare --file experiments/1-vs-n-gpus.yaml on the host (2 GPUs or more)
#   check     gpu-check (issue 33) in a pod whose image is this machine's Python, its standard library and glibc,
#             nothing else (benchmarks/gpu_check_image.py): the device plugin hands it its GPU's device nodes and the
#             driver's files; then gpu-check and torch's references on the host (benchmarks/gpu_check_ref.py), the
#             table in OUT/gpu_check_pod.md, with what the pod's own process mapped and imported
#   command   a user's own training script (benchmarks/user_train_loop.py) as a `command` with a --step-metric,
#             host vs pod, then gpuvs cnn-train on the same model and settings, host vs pod; the two figures and
#             their ratio in OUT/command_gpu.md (benchmarks/command_gpu.sh runs this part alone)
#   pairs     gpuvs fleet collective --pairs over the nodes (issue 35, item 3): every pair of nodes an all-reduce across
#             its two pods, with a co-tenant outside Kubernetes (COTENANT_BUSY) on SLOW_NODE's GPU; the verdict per
#             node and per pair (SLOW_NODE=0: no co-tenant)
#   nodes     one trial across nodes (issue 35, --env pod --num-nodes): the all-reduce sweep over 2 and NODES pods
#             (one GPU each) beside the same collective in one process group on the host (--num-gpus 2 and NODES),
#             then gpuvs compare cnn-train of 1 against NODES nodes (scaling efficiency and its interval)
# The GPU machine has no container engine and no network: everything comes from CARRY, which
# benchmarks/gpu_cluster_prepare.py packs here (it prints the device tool's calls).
#
# Usage, from the repo root:
#   CARRY=.carry/gpu OUT=out bash benchmarks/gpu_cluster.sh
#   NODES=N        kubelets, one GPU each (default: the GPUs nvidia-smi lists; DEVICE=cpu: 3)
#   GPUS_PER_NODE=K  K GPUs a kubelet (node i: the machine's GPUs (i-1)K to iK-1; NODES defaults to the GPUs / K)
#   PER_GPU=1      the fleet runs measure every GPU (`gpuvs fleet --per-gpu`), not every node
#   SLOW_GPU=J     the co-tenant's GPU on SLOW_NODE: its J-th (1 to K; default 1)
#   NODE_COUNTS="2 4" NODES_MAX_BYTES=1G  the nodes part's pod counts and largest all-reduce (over sockets a 1 GiB one
#                  takes 70 s a trial); PAIR_BYTES=64M PAIR_TRIALS=3  the pairs part's all-reduce size and trials a pair;
#                  PAIR_SLOW=N  its co-tenant's node (default SLOW_NODE; 0: none); PAIR_PARALLEL=2  pairs at once
#   SHARES="0.05 0.25" POWER_RUNS=2  the power part: for each share, POWER_RUNS fleet runs of the first FLEET
#                  workload with a co-tenant that busy on SLOW_NODE's SLOW_GPU; how often the slowed GPU (or node)
#                  is found and a healthy one flagged, in OUT/gpu_cluster.md and OUT/power.md
#   PARTS=a,b      among validate, fleet, power, check, scaling, command, nodes, pairs (default: validate on 1 node, else fleet,scaling)
#   TOTAL_S=540    the whole run's deadline, clean-up included: keep it 60 s under the device tool's timeout_s
#   UP_S=180 VALIDATE_S=300 FLEET_S=150 (each fleet run) SCALING_S=300 COMMAND_S=330 CHECK_S=150 NODES_S=420 PAIRS_S=420: each part's own limit, never
#                  past TOTAL_S;  CMD_TRIALS=3 CMD_STEPS=60: the command part's trials per arm and timed steps
#   FLEET="cnn-train gemm"  TRIALS=4 MAX_TRIALS=4  SLOW_NODE=N (index; default the last)  SC_TRIALS=3 (cpu: 2)
#   COTENANT_BUSY=1  the co-tenant's share of each 100 ms spent computing (0.05: a light co-tenant, busy 5% of the
#                  time, its measured share in its rate lines); COTENANT_SIZE=8192 its products' N
#   KIT_DIR=/tmp/gpukit KIT_NAME=gpukit PORT_OFFSET=0 (DEVICE=cpu: 1000)  PYTHON=python3 (with torch, grpcio)
#   DEVICE=cpu     dry run on a machine without a GPU: fake device plugin (one fake GPU a node), tiny CPU workloads
#                  (spin and gemm), the co-tenant replaced by a CPU quota on the node's cgroup root (`kit slow`), in
#                  its own mount namespace (/etc/hosts included), with its own names, ports and pod network;
#                  FAKE_GPUS=1: the plugins in --real mode over character devices of the NVIDIA driver's numbers in
#                  a /dev of its own (no driver behind them): the real-GPU path of the plugin, up to the pods
# Writes under OUT: gpu_cluster.md (the tables, each part's as it ends), gpu_cluster.db (every sample),
# gpu_cluster.log (all output), k8s-logs.txt (the end of each cluster part's log). Everything it started (cluster,
# co-tenant, registry) is stopped at exit, on its own deadline, on SIGTERM, SIGINT and SIGHUP.
set -u
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
bad() { echo "gpu_cluster: $*" >&2; exit 2; }  # bad input: one line, before anything starts
number() { case "$2" in ''|*[!0-9]*) bad "$1=$2: a whole number";; esac; }
CARRY=${CARRY:-.carry/gpu}
[ -d "$CARRY" ] || bad "CARRY=$CARRY is not a folder (python benchmarks/gpu_cluster_prepare.py makes it)"
CARRY=$(cd "$CARRY" && pwd)
OUT=${OUT:-out}; mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || bad "OUT=$OUT cannot be made"
DEVICE=${DEVICE:-cuda}
case "$DEVICE" in cuda|cpu) ;; *) bad "DEVICE=$DEVICE: allowed cuda, cpu";; esac
PY=${PYTHON:-python3}
command -v "$PY" > /dev/null || bad "PYTHON=$PY not found"
K=${KIT_DIR:-/tmp/gpukit}; NAME=${KIT_NAME:-gpukit}
case "$NAME" in ''|*[!abcdefghijklmnopqrstuvwxyz0123456789]*) bad "KIT_NAME=$NAME: lower-case letters and digits";; esac
TOTAL_S=${TOTAL_S:-540}; UP_S=${UP_S:-180}; VALIDATE_S=${VALIDATE_S:-300}; FLEET_S=${FLEET_S:-150}
SCALING_S=${SCALING_S:-300}; TRIALS=${TRIALS:-4}; MAX_TRIALS=${MAX_TRIALS:-4}
COTENANT_BUSY=${COTENANT_BUSY:-1}; COTENANT_SIZE=${COTENANT_SIZE:-8192}
case "$COTENANT_BUSY" in 1|1.0|0.[0-9]*|.[0-9]*) ;; *) bad "COTENANT_BUSY=$COTENANT_BUSY: a share above 0, at most 1";; esac
COMMAND_S=${COMMAND_S:-330}; CHECK_S=${CHECK_S:-150}; NODES_S=${NODES_S:-420}; PAIRS_S=${PAIRS_S:-420}; PAIR_TRIALS=${PAIR_TRIALS:-3}; CMD_TRIALS=${CMD_TRIALS:-3}; CMD_STEPS=${CMD_STEPS:-60}
GPUS_PER_NODE=${GPUS_PER_NODE:-1}; number GPUS_PER_NODE "$GPUS_PER_NODE"
[ "$GPUS_PER_NODE" -ge 1 ] || bad "GPUS_PER_NODE=0: one GPU a node at least"
if [ "$DEVICE" = cpu ]; then  # 2 trials per arm of the scaling check: a CPU trial there costs 20-40 s
  NODES=${NODES:-3}; PORT_OFFSET=${PORT_OFFSET:-1000}; FLEET=${FLEET:-spin gemm}; SC_TRIALS=${SC_TRIALS:-2}
else
  NODES=${NODES:-$(( $(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') / GPUS_PER_NODE ))}; PORT_OFFSET=${PORT_OFFSET:-0}
  FLEET=${FLEET:-cnn-train gemm}; SC_TRIALS=${SC_TRIALS:-3}
fi
for v in TOTAL_S UP_S VALIDATE_S FLEET_S SCALING_S COMMAND_S CHECK_S NODES_S PAIRS_S PAIR_TRIALS CMD_TRIALS CMD_STEPS TRIALS MAX_TRIALS SC_TRIALS NODES PORT_OFFSET COTENANT_SIZE; do number "$v" "${!v}"; done
[ "$NODES" -ge 1 ] || bad "NODES=0: one kubelet at least (DEVICE=cuda: none without a GPU nvidia-smi lists)"
if [ "$NODES" -ge 2 ]; then PARTS=${PARTS:-fleet,scaling}; else PARTS=${PARTS:-validate}; fi
for p in ${PARTS//,/ }; do
  case "$p" in validate|fleet|power|check|scaling|command|nodes|pairs) ;; *) bad "PARTS: $p? allowed validate, fleet, power, check, scaling, command, nodes, pairs";; esac
done
for w in $FLEET; do case "$w" in cnn-train|gemm|spin) ;; *) bad "FLEET: $w? allowed cnn-train, gemm, spin";; esac; done
SLOW_NODE=${SLOW_NODE:-$NODES}; number SLOW_NODE "$SLOW_NODE"
[ -z "${FAKE_GPUS:-}" ] || [ "$DEVICE" = cpu ] || bad "FAKE_GPUS=$FAKE_GPUS applies to DEVICE=cpu (a machine without GPUs)"
{ [ "$SLOW_NODE" -ge 1 ] && [ "$SLOW_NODE" -le "$NODES" ]; } || bad "SLOW_NODE=$SLOW_NODE: a node's index, 1 to $NODES"
PAIR_SLOW=${PAIR_SLOW:-$SLOW_NODE}; number PAIR_SLOW "$PAIR_SLOW"
[ "$PAIR_SLOW" -le "$NODES" ] || bad "PAIR_SLOW=$PAIR_SLOW: a node's index, 1 to $NODES, or 0 (no co-tenant)"
PAIR_PARALLEL=${PAIR_PARALLEL:-2}; number PAIR_PARALLEL "$PAIR_PARALLEL"
[ "$PAIR_PARALLEL" -ge 1 ] || bad "PAIR_PARALLEL=0: one pair at a time at least"
for v in ${NODE_COUNTS:-}; do
  number NODE_COUNTS "$v"; { [ "$v" -ge 2 ] && [ "$v" -le "$NODES" ]; } || bad "NODE_COUNTS: $v? each 2 to NODES ($NODES)"
done
SLOW_GPU=${SLOW_GPU:-1}; number SLOW_GPU "$SLOW_GPU"
{ [ "$SLOW_GPU" -ge 1 ] && [ "$SLOW_GPU" -le "$GPUS_PER_NODE" ]; } || bad "SLOW_GPU=$SLOW_GPU: a GPU of the node, 1 to $GPUS_PER_NODE"
SHARES=${SHARES:-0.05 0.25}; POWER_RUNS=${POWER_RUNS:-2}; number POWER_RUNS "$POWER_RUNS"
for v in $SHARES; do case "$v" in 1|1.0|0.[0-9]*|.[0-9]*) ;; *) bad "SHARES: $v? each a share above 0, at most 1";; esac; done
case "${PER_GPU:-}" in ''|0|1) ;; *) bad "PER_GPU=$PER_GPU: 1 or 0";; esac
if [ "$DEVICE" = cpu ] && [ -z "${GPUKIT_NS:-}" ]; then
  # beside the shared test cluster: a mount namespace of its own, with its own /etc/hosts (the kit's node names)
  [ -x "$K/kit" ] && "$K/kit" down > /dev/null 2>&1  # what a killed earlier dry run left
  rm -rf "$K"; mkdir -p "$K"; cp /etc/hosts "$K/hosts"
  devs=true
  if [ -n "${FAKE_GPUS:-}" ]; then  # a /dev of its own: this one's, plus character devices of the NVIDIA driver's
    mkdir -p "$K/dev/shm" && (cd /dev && tar --exclude=./shm --exclude=./mqueue -cf - .) | tar -C "$K/dev" -xf -
    for m in $(seq 0 $((NODES * GPUS_PER_NODE - 1))); do mknod "$K/dev/nvidia$m" c 195 "$m"; done  # no driver
    mknod "$K/dev/nvidiactl" c 195 255; mknod "$K/dev/nvidia-uvm" c 511 0
    devs="mount --bind '$K/dev' /dev && mount -t tmpfs shm /dev/shm"
  fi
  exec env GPUKIT_NS=1 unshare -m --propagation private bash -c \
    "mount --bind '$K/hosts' /etc/hosts && $devs && exec bash '$REPO/benchmarks/gpu_cluster.sh'"
fi
T0=$(date +%s); DEADLINE=$((T0 + TOTAL_S)); RESERVE=45  # what clean-up may take
REG_PORT=$((5055 + PORT_OFFSET)); REG=localhost:$REG_PORT
MD=$OUT/gpu_cluster.md; DB=$OUT/gpu_cluster.db; LOG=$OUT/gpu_cluster.log; RUNS=$K/fleet-runs.tsv
KC=$K/cluster/kubeconfig
log() { echo "[gpu_cluster +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG" >&2; }
md() { printf '%s\n' "$@" >> "$MD"; }
node() { echo "$NAME-node-$1"; }
left() { echo $(( DEADLINE - RESERVE - $(date +%s) )); }
within() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }  # a part's limit, inside the deadline

# -- clean-up: every exit path -------------------------------------------------------------------------------------
CHILD=""; COTENANT_PID=""; SLOWED=""; CLEANED=""
cotenant_stop() {
  if [ -n "$COTENANT_PID" ]; then
    kill -TERM "$COTENANT_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$COTENANT_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$COTENANT_PID" 2>/dev/null; wait "$COTENANT_PID" 2>/dev/null
    log "co-tenant stopped: $(tail -n 1 "$K/cotenant.log" 2>/dev/null)"
    COTENANT_PID=""
  fi
  if [ -n "$SLOWED" ]; then "$K/kit" slow "$SLOWED" 0 >> "$LOG" 2>&1; SLOWED=""; fi
}
cleanup() {
  [ -n "$CLEANED" ] && return; CLEANED=1
  trap - EXIT TERM INT HUP
  if [ -n "$CHILD" ]; then  # the gpuvs command in flight deletes its pods; 30 s at most
    kill -TERM "$CHILD" 2>/dev/null
    for _ in $(seq 150); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- -"$CHILD" "$CHILD" 2>/dev/null; wait "$CHILD" 2>/dev/null  # timeout leads its own group
  fi
  cotenant_stop
  log "stopping the cluster"
  [ -x "$K/kit" ] && timeout 120 "$K/kit" down >> "$LOG" 2>&1
  for f in "$K"/cluster/logs/*.log; do [ -f "$f" ] && { echo "=== $f"; tail -n 40 "$f"; }; done > "$OUT/k8s-logs.txt" 2>&1
  # nothing of the kit may be left: processes whose command line names the kit's folder (pids are ours alone)
  local pids left=""
  pids=$(grep -l -a -F "$K/" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3 | grep -v -x -e "$$" -e "$BASHPID")
  for p in $pids; do [ -r "/proc/$p/cmdline" ] && left="$left $p:$(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-80)"; done
  md "" "## Clean-up" "" "Everything the kit started was stopped at +$(( $(date +%s) - T0 )) s${STOPPED_BY:+ ($STOPPED_BY)}." \
     "Processes left that name $K: ${left:-none}."
  log "done; left:${left:- none}"
}
STOPPED_BY=""
on_signal() { STOPPED_BY="stopped by $1"; log "$1: stopping"; exit 143; }
trap cleanup EXIT
trap 'on_signal SIGTERM' TERM; trap 'on_signal SIGINT' INT; trap 'on_signal SIGHUP' HUP
run_limited() {  # SECONDS COMMAND...: in the background (a signal reaches the trap at once), stopped at its limit
  local lim=$1; shift
  timeout -k 20 "$lim" "$@" >> "$LOG" 2>&1 &
  CHILD=$!; wait "$CHILD"; local rc=$?; CHILD=""
  [ "$rc" -eq 124 ] && log "stopped at its limit of ${lim}s: $*"
  return "$rc"
}

# -- 1. unpack, the kit's cluster command ----------------------------------------------------------------------------
[ -n "${GPUKIT_NS:-}" ] || { [ -x "$K/kit" ] && "$K/kit" down > /dev/null 2>&1; rm -rf "$K"; }  # a warm machine's leftovers
mkdir -p "$K/bin" "$K/cni" "$K/site" "$K/home" "$K/cluster/pki"
: > "$MD"; : > "$RUNS"
"$PY" - "$CARRY" "$K" <<'PYEOF' || { log "FAILED: unpacking $CARRY"; exit 1; }
import os, sys, tarfile
carry, k = sys.argv[1:3]
packed = next(f"{carry}/{n}" for n in ("bin.tar.xz", "bin.tar") if os.path.exists(f"{carry}/{n}"))
trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}  # our own archives
with tarfile.open(packed) as tar:  # bin/ and cni/ (bin.tar, of a --quick carry: links to this machine's)
    tar.extractall(k, **trusted)
if os.path.exists(f"{k}/bin/kube-multicall"):
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"):
        os.symlink("kube-multicall", f"{k}/bin/{name}")  # one binary, chosen by the name it is called by
with tarfile.open(f"{carry}/py/site.tar.xz") as tar:
    tar.extractall(f"{k}/site", **trusted)
PYEOF
cp "$CARRY"/pki/* "$K/cluster/pki/"
export PATH=$K/bin:$PATH PYTHONPATH=$REPO/src:$K/site PYTHONUNBUFFERED=1 COLUMNS=160
KIT_IMAGES="$CARRY/images/pause.tar.xz:$CARRY/images/node.tar.xz:$CARRY/images/probe.tar.xz"
case ",$PARTS," in *,check,*)  # made here: the pod's Python is this machine's
  if CHECK_IMAGE=$("$PY" benchmarks/gpu_check_image.py "$K/check.tar" 2>> "$LOG"); then KIT_IMAGES="$KIT_IMAGES:$K/check.tar"
  else log "the check part's image could not be made (gpu_cluster.log)"; fi;;
esac
CNI=bridge  # a kernel without bridges (some VMs): a veth pair per pod instead
if command -v ip > /dev/null; then
  if ip link add "$NAME-probe" type bridge 2>> "$LOG"; then ip link del "$NAME-probe"; else CNI=ptp; fi
fi
KIT_ENV=(GPUVS_CLUSTER_DIR="$K/cluster" GPUVS_K8S_CACHE="$K" GPUVS_CLUSTER_NAME="$NAME"
         GPUVS_CLUSTER_PORT_OFFSET="$PORT_OFFSET" GPUVS_CLUSTER_POD_NET=10.245 GPUVS_CLUSTER_CNI="$CNI"
         GPUVS_CLUSTER_CNI_BIN="$K/cni" GPUVS_CLUSTER_SNAPSHOTTER=native GPUVS_CLUSTER_REGISTRY_PORT="$REG_PORT"
         GPUVS_CLUSTER_IMAGES="$KIT_IMAGES"
         GPUVS_CLUSTER_KUBELET_CONFIG='{"resolvConf": ""}' GPUVS_CLUSTER_PYTHON="$("$PY" -c 'import sys; print(sys.executable)')"
         PATH="$PATH" PYTHONPATH="$PYTHONPATH")
{ echo "#!/bin/sh"
  echo "# this kit's cluster: scripts/test-cluster with the kit's settings (up, down, status, kubelet|plugin"
  echo "# stop|start|restart NODE, apiserver stop|start, slow NODE PCT)"
  printf 'export'; printf ' %q' "${KIT_ENV[@]}"; echo
  printf 'exec %q %q "$@"\n' "$(command -v "$PY")" "$REPO/scripts/test-cluster"; } > "$K/kit"
chmod +x "$K/kit"
log "unpacked: $(ls "$K/bin" | xargs); CNI $CNI"

# -- 2. the cluster -------------------------------------------------------------------------------------------------
GPU_NAME=cpu; REAL=()
[ -n "${FAKE_GPUS:-}" ] && { GPU_NAME="cpu, fake GPU device nodes"; REAL=(--real-gpus); }
if [ "$DEVICE" = cuda ]; then
  nvidia-smi -L >> "$LOG" 2>&1
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  REAL=(--real-gpus)  # one CUDA context on the host first: the driver makes /dev/nvidia-uvm, which Allocate hands on
  "$PY" -c "import torch; torch.zeros(1, device='cuda'); print('host CUDA:', torch.cuda.get_device_name(0))" >> "$LOG" 2>&1
fi
PLUGIN_MODE="--real --only <its GPU>"; [ "$GPUS_PER_NODE" = 1 ] || PLUGIN_MODE="--real --only <each of its $GPUS_PER_NODE GPUs>"
[ ${#REAL[@]} -gt 0 ] || PLUGIN_MODE="fake: $GPUS_PER_NODE GPU(s) a node, no GPU behind them"
md "# GPU cluster kit: $NODES node(s) on $(uname -n), $GPU_NAME (issues 24 and 26)" "" \
   "$(date -u '+%Y-%m-%d %H:%M UTC'); DEVICE=$DEVICE NODES=$NODES PARTS=$PARTS; $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/driver /')" "" \
   "Kubernetes 1.20.2 (built from Debian's source: kube-apiserver, kube-controller-manager, kube-scheduler and the" \
   "kubelet in one multi-call binary), etcd, containerd 1.6 + runc, CNI $CNI; one kubelet per $GPUS_PER_NODE GPU(s), each with its own" \
   "containerd, cgroup root, mount namespace and the project's device plugin ($PLUGIN_MODE); images pulled" \
   "from a registry on 127.0.0.1. The kit's cluster commands: \`$K/kit\` (scripts/test-cluster)."
case ",$PARTS," in *,validate,*|*,fleet,*|*,power,*|*,check,*|*,command,*|*,nodes,*|*,pairs,*) ;; *) NO_CLUSTER=1;; esac  # scaling alone runs on the host
t=$(date +%s)
if [ -n "${NO_CLUSTER:-}" ]; then
  md "" "(No cluster started: PARTS=$PARTS runs on the host.)"
elif ! run_limited "$(within "$UP_S")" "$K/kit" up --nodes "$NODES" --gpus "$GPUS_PER_NODE" "${REAL[@]}"; then
  log "FAILED: the cluster did not come up"; md "" "**The cluster did not come up** (see gpu_cluster.log, k8s-logs.txt)."; exit 1
fi
UP_TOOK=$(( $(date +%s) - t ))
[ -n "${NO_CLUSTER:-}" ] || md "" "## The cluster (up in ${UP_TOOK} s)" "" "| node | kubelet port | device plugin's GPU (ID, device node) |" "|---|---|---|"
MINORS=($(ls /dev 2>/dev/null | sed -n 's/^nvidia\([0-9][0-9]*\)$/\1/p' | sort -n))
declare -A GPU_OF
for i in $(seq "$NODES"); do
  [ -n "${NO_CLUSTER:-}" ] && break
  if [ ${#REAL[@]} -gt 0 ]; then
    only=(); for m in "${MINORS[@]:$(( (i - 1) * GPUS_PER_NODE )):$GPUS_PER_NODE}"; do only+=(--only "$m"); done
    GPU_OF[$i]=$("$PY" tests/fixtures/gpu_device_plugin/plugin.py --real "${only[@]}" --list 2>> "$LOG")
  else
    GPU_OF[$i]=$("$PY" tests/fixtures/gpu_device_plugin/plugin.py --count "$GPUS_PER_NODE" --list 2>> "$LOG")
  fi
  md "| $(node "$i") | $((10250 + PORT_OFFSET + 20 * (i - 1))) | $(echo "${GPU_OF[$i]}" | paste -sd ';' | sed 's/;/; /g') |"
done
log "cluster up in ${UP_TOOK}s"

healthy() {  # until `kit status` reads healthy (a restarted part settling), at most SECONDS
  local t=$(( $(date +%s) + $1 ))
  until "$K/kit" status >> "$LOG" 2>&1; do
    [ "$(date +%s)" -ge "$t" ] && { log "cluster not healthy after $1 s"; return 1; }
    sleep 2
  done
}
gpuvs_run() {  # LIMIT ARGS...: gpuvs ARGS, its new experiments' ids in NEW
  local lim=$1; shift
  local before; before=$("$PY" benchmarks/gpu_cluster_tables.py ids "$DB")
  run_limited "$lim" "$PY" -m gpuvs "$@"; local rc=$?
  NEW=$(comm -13 <(echo "$before" | sort) <("$PY" benchmarks/gpu_cluster_tables.py ids "$DB" | sort))
  return $rc
}
report() {  # the stored experiments in NEW, as markdown
  local id
  for id in $NEW; do md "" "\`gpuvs report $id --format md\`" ""; "$PY" -m gpuvs report "$id" --format md --store "$DB" >> "$MD" 2>> "$LOG"; done
}
cmdline() { md "" '```' "gpuvs $*" '```'; }

# -- 3. validate: functional, then disruptive on the first node -------------------------------------------------------
part_validate() {
  local lim; lim=$(within "$VALIDATE_S")
  [ "$lim" -ge 60 ] || { md "" "## gpuvs validate: not run (${lim} s for it: VALIDATE_S or the time left)"; return; }
  local end=$(( $(date +%s) + lim )) n1; n1=$(node 1)
  local VAL=(--image "$REG/gpuvs-probe:kit" --image-pull-policy IfNotPresent --kubeconfig "$KC" --store "$DB"
             --timeout 60)
  md "" "## gpuvs validate (functional)"
  cmdline validate "${VAL[@]}"
  local t; t=$(date +%s)
  gpuvs_run $(( lim / 3 )) validate "${VAL[@]}" --name "kit: validate functional"; local rc=$?
  md "" "Exit status $rc, $(( $(date +%s) - t )) s."; report
  healthy 60
  local DIS=(--node "$n1" --disruptive --restart-plugin-cmd "$K/kit plugin restart $n1"
             --restart-kubelet-cmd "$K/kit kubelet restart $n1" --stop-apiserver-cmd "$K/kit apiserver stop"
             --start-apiserver-cmd "$K/kit apiserver start" --apiserver-outage 10 --command-timeout 90)
  md "" "## gpuvs validate --disruptive on $n1"
  cmdline validate "${VAL[@]}" "${DIS[@]}"
  t=$(date +%s)
  gpuvs_run $(( end - $(date +%s) )) validate "${VAL[@]}" "${DIS[@]}" --name "kit: validate disruptive"; rc=$?
  md "" "Exit status $rc, $(( $(date +%s) - t )) s."; report
  healthy 90
}

# -- 4. fleet: each workload without, then with a co-tenant ------------------------------------------------------------
cotenant_start() {  # INDEX: slow that node's GPU from outside Kubernetes; its GPU UUID in COTENANT_UUID
  local i=$1 n; n=$(node "$1")
  if [ "$DEVICE" = cpu ]; then  # no GPU here: the node's pods get a quarter of one CPU (its cgroup root's quota)
    "$K/kit" slow "$n" 25 >> "$LOG" 2>&1 && SLOWED=$n
    COTENANT_UUID="CPU quota of 25% of one CPU on the node's cgroup root"
    return
  fi
  local uuid; uuid=$(echo "${GPU_OF[$i]}" | sed -n "${SLOW_GPU}p" | cut -d' ' -f1)
  rm -f "$K/cotenant.log"  # not the last co-tenant's: the redirect below truncates it only once the child runs
  CUDA_VISIBLE_DEVICES=$uuid "$PY" benchmarks/gpu_cotenant.py --seconds "$(left)" --busy "$COTENANT_BUSY" \
    --size "$COTENANT_SIZE" > "$K/cotenant.log" 2>&1 &
  COTENANT_PID=$!
  local t=$(( $(date +%s) + 90 ))
  until grep -q '^cotenant running' "$K/cotenant.log"; do
    kill -0 "$COTENANT_PID" 2>/dev/null && [ "$(date +%s)" -lt "$t" ] || { log "co-tenant did not start"; cat "$K/cotenant.log" >> "$LOG"; return 1; }
    sleep 0.5
  done
  COTENANT_UUID=$(sed -n 's/^cotenant running gpu=\(.*\) uuid=\(.*\)$/\2 (\1)/p' "$K/cotenant.log")
  if [ "${COTENANT_UUID%% *}" = "$uuid" ]; then COTENANT_UUID="$COTENANT_UUID, the GPU $n's device plugin hands out"
  else COTENANT_UUID="$COTENANT_UUID; CAUTION: $n's device plugin hands out $uuid"; fi
  log "co-tenant on $n: $COTENANT_UUID"
}
fleet_args() {  # WORKLOAD: its short settings
  case "$1/$DEVICE" in
    cnn-train/cuda) echo --model resnet50 --batch-size 128 --precision bf16 --data-format NHWC --warmup-steps 5 --steps 30;;
    gemm/cuda) echo --shape 8192x8192x8192 --precision bf16 --repeats 20 --block-ms 50;;
    spin/cpu) echo --steps 10 --ops 200000;;
    gemm/cpu) echo --set small --repeats 3;;
    cnn-train/cpu) echo --model resnet18 --batch-size 2 --image-size 32 --warmup-steps 1 --steps 2;;
    *) echo "";;
  esac
}
fleet_run() {  # WORKLOAD SLOW_INDEX (0: no co-tenant)
  local w=$1 slow=$2 lim; lim=$(within "$FLEET_S")
  [ "$lim" -ge 20 ] || { md "" "## gpuvs fleet $w: not run (${lim} s for it: FLEET_S or the time left)"; return; }
  local mounts=(--mount /usr:/usr:ro --mount /etc:/etc:ro --mount /opt:/opt:ro --mount "$K/home:$K/home")
  local m
  for m in $("$PY" -c 'import sys; print(sys.prefix, sys.base_prefix)'); do  # a venv or pyenv outside them
    case "$m" in /usr|/usr/*|/opt|/opt/*|/etc|/etc/*) ;; *) mounts+=(--mount "$m:$m:ro");; esac
  done
  local parallel=$NODES margin=0.05
  [ "$DEVICE" = cpu ] && { parallel=1; margin=0.3; }  # 2 shared CPUs: one trial at a time, +/-30% is what settles
  local POD=(--image "$REG/gpuvs-node:gpu" --image-pull-policy IfNotPresent --kubeconfig "$KC" --host-network
             --python "$("$PY" -c 'import sys; print(sys.executable)')" "${mounts[@]}"
             --env-var "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" --env-var "PATH=$PATH" --env-var "HOME=$K/home"
             --start-timeout 120)
  local ARGS=($w $(fleet_args "$w") ${PER_GPU:+$([ "$PER_GPU" = 1 ] && echo --per-gpu)} --device "$DEVICE" --trials "$TRIALS" --max-trials "$MAX_TRIALS"
              --parallel "$parallel" --margin "$margin" --store "$DB" "${POD[@]}")
  local title="gpuvs fleet $w, no co-tenant" n="-" name="kit: fleet $w, no co-tenant"
  COTENANT_UUID="-"
  if [ "$slow" -gt 0 ]; then
    n=$(node "$slow"); title="gpuvs fleet $w, co-tenant on $n"; name="kit: fleet $w, co-tenant on $n"
    [ "$COTENANT_BUSY" = 1 ] || { title="$title, busy $COTENANT_BUSY"; name="$name, busy $COTENANT_BUSY"; }
    cotenant_start "$slow" || { md "" "## $title: not run (the co-tenant did not start)"; cotenant_stop; return; }
  fi
  md "" "## $title"
  [ "$slow" -gt 0 ] && md "" "Co-tenant outside Kubernetes on $n: $COTENANT_UUID."
  cmdline fleet "${ARGS[@]}"
  local t; t=$(date +%s%N)
  gpuvs_run "$lim" fleet "${ARGS[@]}" --name "$name"; local rc=$?
  local wall; wall=$(awk "BEGIN { printf \"%.1f\", ($(date +%s%N) - $t) / 1e9 }")
  cotenant_stop
  [ "$slow" -gt 0 ] && [ "$DEVICE" = cuda ] && md "" "Co-tenant's own rate while it ran: $(grep '^cotenant rate' "$K/cotenant.log" | sed 's/cotenant rate=//' | xargs | tr ' ' ' ') (one figure every 5 s)."
  md "" "Exit status $rc; wall time of the fleet run: $wall s."
  local id
  for id in $NEW; do
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$w" "$n" "$COTENANT_UUID" "$wall" "$([ "$slow" -gt 0 ] && echo "$COTENANT_BUSY" || echo -)" >> "$RUNS"
    md "" "### Nodes: GPUs, verdicts, fingerprints" ""
    "$PY" benchmarks/gpu_cluster_tables.py nodes "$DB" "$id" >> "$MD" 2>> "$LOG"
  done
  report
  healthy 60
}
part_fleet() {
  if [ "$NODES" -lt 2 ]; then md "" "## gpuvs fleet: not run (a fleet needs 2 nodes or more; NODES=$NODES)"; return; fi
  local w
  for w in $FLEET; do fleet_run "$w" 0; fleet_run "$w" "$SLOW_NODE"; done
  md "" "## Fleet runs" ""
  "$PY" benchmarks/gpu_cluster_tables.py runs "$DB" "$RUNS" >> "$MD" 2>> "$LOG"
}

part_power() {  # detection power: POWER_RUNS fleet runs at each co-tenant share in SHARES (issue 33, item 4)
  if [ "$NODES" -lt 2 ] && [ "${PER_GPU:-0}" != 1 ]; then md "" "## Power: not run (NODES=$NODES)"; return; fi
  local w=${FLEET%% *} share r busy=$COTENANT_BUSY
  for share in $SHARES; do
    for r in $(seq "$POWER_RUNS"); do COTENANT_BUSY=$share; fleet_run "$w" "$SLOW_NODE"; done
  done
  COTENANT_BUSY=$busy
  { echo "# Detection power: a co-tenant on one GPU, busy a set share of the time ($GPU_NAME, DEVICE=$DEVICE)"; echo
    "$PY" benchmarks/gpu_cluster_tables.py power "$DB" "$RUNS"; } > "$OUT/power.md" 2>> "$LOG"
  md "" "## Detection power" ""; tail -n +3 "$OUT/power.md" >> "$MD"
}

# -- gpu-check in a pod with nothing but Python and the driver's files, against the same check and torch on the host --
part_check() {
  local lim; lim=$(within "$CHECK_S")
  [ "$lim" -ge 40 ] || { md "" "## gpu-check in a pod: not run (${lim} s for it: CHECK_S or the time left)"; return; }
  [ -f "$K/check.tar" ] || { md "" "## gpu-check in a pod: not run (its image could not be made)"; return; }
  local end=$(( $(date +%s) + lim )) n libdir; n=$(node 1)
  # the driver's folder (where the device plugin took its files from) on the pod's loader path, as the NVIDIA
  # container toolkit's ld-cache hook makes them findable in any image
  libdir=$("$PY" tests/fixtures/gpu_device_plugin/plugin.py --driver-dir 2>> "$LOG")
  local ARGS=(run gpu-check --device cuda --trials 3 --env pod --image "$REG/gpuvs-check:kit" --image-pull-policy
              IfNotPresent --kubeconfig "$KC" --node "$n" --start-timeout 90 --store "$DB" --name "kit: gpu-check in a pod"
              ${libdir:+--env-var "LD_LIBRARY_PATH=$libdir"})
  md "" "## gpu-check in a pod: nothing but Python and the driver's files" "" \
     "The pod's image (benchmarks/gpu_check_image.py): ${CHECK_IMAGE#*: }. No --mount: its GPU's device nodes and" \
     "the driver's files come from the device plugin's Allocate answer alone."
  cmdline "${ARGS[@]}"
  local t; t=$(date +%s)
  gpuvs_run $(( lim * 2 / 3 )) "${ARGS[@]}"; local rc=$?
  md "" "Exit status $rc, $(( $(date +%s) - t )) s."; report
  if [ "$DEVICE" = cuda ]; then
    run_limited $(( end - $(date +%s) )) "$PY" benchmarks/gpu_check_ref.py --json "$OUT/gpu_check_ref.json"
  fi
  { echo "# gpu-check in a pod of the kit ($GPU_NAME, DEVICE=$DEVICE)"
    "$PY" benchmarks/gpu_cluster_tables.py check "$DB" "$OUT/gpu_check_ref.json"; } > "$OUT/gpu_check_pod.md" 2>> "$LOG"
  tail -n +2 "$OUT/gpu_check_pod.md" >> "$MD"
}

# -- 5. 1 vs N GPUs on the host --------------------------------------------------------------------------------------
part_scaling() {
  local lim; lim=$(within "$SCALING_S")
  local gpus=$NODES
  [ "$DEVICE" = cuda ] && gpus=$(nvidia-smi -L | grep -c '^GPU ')
  if [ "$gpus" -lt 2 ] || [ "$lim" -lt 20 ]; then
    md "" "## 1 vs N GPUs: not run ($gpus GPU(s), ${lim} s left)"; return
  fi
  local ARGS=(compare --file experiments/1-vs-n-gpus.yaml --trials "$SC_TRIALS" --store "$DB")
  [ "$DEVICE" = cpu ] && ARGS+=(--device cpu --model resnet18 --batch-size 2 --image-size 32 --warmup-steps 1 --steps 2)
  md "" "## 1 vs N GPUs on the host (experiments/1-vs-n-gpus.yaml)"
  cmdline "${ARGS[@]}"
  local t; t=$(date +%s)
  gpuvs_run "$lim" "${ARGS[@]}"; local rc=$?
  md "" "Exit status $rc, $(( $(date +%s) - t )) s."; report
}

# -- 6. a user's own training script as a command, host vs pod, beside gpuvs's cnn-train (benchmarks/command_gpu.sh) --
part_command() {
  local lim; lim=$(within "$COMMAND_S")
  [ "$lim" -ge 60 ] || { md "" "## A user's script as a command: not run (${lim} s for it: COMMAND_S or the time left)"; return; }
  local end=$(( $(date +%s) + lim )) py; py=$("$PY" -c 'import sys; print(sys.executable)')
  local mounts=("/usr:/usr:ro" "/etc:/etc:ro" "/opt:/opt:ro" "$K/home:$K/home" "$REPO:$REPO:ro") m
  for m in $("$PY" -c 'import sys; print(sys.prefix, sys.base_prefix)'); do  # a venv or pyenv outside them
    case "$m" in /usr|/usr/*|/opt|/opt/*|/etc|/etc/*) ;; *) mounts+=("$m:$m:ro");; esac
  done
  local script=(resnet50 256 amp "steps=$CMD_STEPS" warmup=15)
  local cnn='{"model": "resnet50", "batch_size": 256, "precision": "bf16", "data_format": "NHWC", "optimizer": "momentum", "warmup_steps": 15, "steps": '$CMD_STEPS'}'
  if [ "$DEVICE" = cpu ]; then
    script=(resnet18 2 steps=3 warmup=1 size=64 device=cpu)
    cnn='{"model": "resnet18", "batch_size": 2, "image_size": 64, "data_format": "NHWC", "optimizer": "momentum", "warmup_steps": 1, "steps": 3}'
  fi
  # the two studies as experiment files (JSON is YAML): the same arms, the pod's options on its arm
  "$PY" - "$K" "$DEVICE" "$CMD_TRIALS" "$REG/gpuvs-node:gpu" "$KC" "$py" "$K/home" "${LD_LIBRARY_PATH:-}" "$PATH" \
      "$cnn" "$REPO/benchmarks/user_train_loop.py" "${mounts[*]}" "${script[@]}" <<'PYEOF'
import json, sys
k, device, trials, image, kc, py, home, ld, path, cnn, script, mounts, *args = sys.argv[1:]
pod = {"name": "pod", "env": "pod", "image": image, "image_pull_policy": "IfNotPresent", "kubeconfig": kc,
       "host_network": True, "python": py, "mount": mounts.split(), "start_timeout": 120,
       "env_var": [f"LD_LIBRARY_PATH={ld}", f"PATH={path}", f"HOME={home}"]}
common = {"device": device, "trials": int(trials), "arms": [{"name": "host", "env": "host"}, pod]}
json.dump({"name": "kit: a user's training script as a command, host vs pod", "command": [py, script, *args],
           "params": {"step_metric": ["images_per_sec=step \\d+: ([0-9.]+) images/sec,rate,images/sec"],
                      "headline": "images_per_sec"}, **common}, open(f"{k}/command.yaml", "w"), indent=1)
json.dump({"name": "kit: gpuvs cnn-train, the same model and settings, host vs pod", "workload": "cnn-train",
           "params": json.loads(cnn), **common}, open(f"{k}/cnn.yaml", "w"), indent=1)
PYEOF
  md "" "## A user's own training script as a command, host vs pod, beside gpuvs's cnn-train" "" \
     "The script: benchmarks/user_train_loop.py (the plain loop of the recipes, printing its rate every step)." "" \
     '```' "$(cat "$K/command.yaml")" '```'
  local t; t=$(date +%s)
  gpuvs_run $(( lim * 5 / 9 )) compare --file "$K/command.yaml" --store "$DB"; local rc=$?
  local cmd_id=$NEW
  md "" "Exit status $rc, $(( $(date +%s) - t )) s."; report
  md "" '```' "gpuvs compare --file cnn.yaml   # $(tr -d '\n' < "$K/cnn.yaml" | cut -c1-400)" '```'
  t=$(date +%s)
  gpuvs_run $(( end - $(date +%s) )) compare --file "$K/cnn.yaml" --store "$DB"; rc=$?
  local cnn_id=$NEW
  md "" "Exit status $rc, $(( $(date +%s) - t )) s."; report
  if [ -n "$cmd_id" ] && [ -n "$cnn_id" ]; then
    { echo "# A user's training script as a command, host vs pod, beside gpuvs cnn-train ($GPU_NAME, DEVICE=$DEVICE)"; echo
      "$PY" benchmarks/command_gpu_table.py "$DB" "$cmd_id" "$cnn_id" "$([ "$DEVICE" = cuda ] && echo yes || echo cpu)"; } > "$OUT/command_gpu.md" 2>> "$LOG"
    md "" "### The two figures" ""; tail -n +3 "$OUT/command_gpu.md" >> "$MD"
  else
    md "" "**No table: a study did not store an experiment** (see gpu_cluster.log)."
  fi
}

# -- 7. one trial across nodes (issue 35): the all-reduce over N pods against one process group on the host -----------
host_mounts() {  # --mount options: the host's interpreter, its packages and libraries, read-only, as part_command's
  local m
  echo --mount "$K/home:$K/home"
  # a venv layered on another through .pth files reads the other's site-packages: their real folders too
  for m in /usr /etc /opt "$REPO" $("$PY" -c 'import os, sys; print(sys.prefix, sys.base_prefix, *{os.path.realpath(p)
      for p in sys.path if p.endswith("-packages") and os.path.isdir(p)})'); do
    case "$m" in /usr/*|/opt/*|/etc/*|"$REPO"/*) continue;; esac
    echo --mount "$m:$m:ro"
  done | sort -u
}
part_nodes() {
  local lim; lim=$(within "$NODES_S")
  if [ "$NODES" -lt 2 ] || [ "$lim" -lt 60 ]; then md "" "## Across nodes: not run ($NODES node(s), ${lim} s left)"; return; fi
  local end=$(( $(date +%s) + lim )) py; py=$("$PY" -c 'import sys; print(sys.executable)')
  # the pods' own network (no --host-network): each pod is a host of its own to NCCL, which then goes through its
  # socket transport between them, as between nodes; the host's process group is the reference on the same GPUs
  local POD=(--env pod --image "$REG/gpuvs-node:gpu" --image-pull-policy IfNotPresent --kubeconfig "$KC" --python "$py"
             --start-timeout 120 --env-var "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" --env-var "PATH=$PATH"
             --env-var "HOME=$K/home" $(host_mounts))
  local COLL=(collective --op all-reduce --device "$DEVICE" --min-bytes 1M --max-bytes "${NODES_MAX_BYTES:-1G}" --factor 4 --trials 3)
  local CNN=(cnn-train --device "$DEVICE" --model resnet50 --batch-size 128 --precision bf16 --warmup-steps 10
             --steps 50 --trials "$SC_TRIALS")
  if [ "$DEVICE" = cpu ]; then
    COLL=(collective --op all-reduce --device cpu --min-bytes 64 --max-bytes 64K --factor 8 --warmup 1 --iters 5
          --repeats 3 --trials 2)
    CNN=(cnn-train --device cpu --model resnet18 --batch-size 2 --image-size 32 --warmup-steps 1 --steps 2
         --trials "$SC_TRIALS")
  fi
  md "" "## Across nodes: the all-reduce over N pods, one GPU each, against one process group on the host" "" \
     "Each N: \`gpuvs run ${COLL[*]} --num-gpus N\` on the host (the reference: N ranks in one process group), then" \
     "the same with \`--num-gpus 1 --num-nodes N\` and the pod options below (N pods on N kubelets, rendezvous at the" \
     "first pod's IP, NCCL between the pods' network namespaces)." "" '```' "gpuvs ... ${POD[*]}" '```'
  local n rc t
  for n in ${NODE_COUNTS:-$(printf '%s\n' 2 "$NODES" | sort -nu)}; do
    [ "$(date +%s)" -lt "$end" ] || break
    t=$(date +%s); gpuvs_run $(( end - $(date +%s) )) run "${COLL[@]}" --num-gpus "$n" --store "$DB"; rc=$?
    md "" "### $n ranks on the host: exit status $rc, $(( $(date +%s) - t )) s"; report
    t=$(date +%s); gpuvs_run $(( end - $(date +%s) )) run "${COLL[@]}" --num-gpus 1 --num-nodes "$n" "${POD[@]}" --store "$DB"; rc=$?
    md "" "### $n pods (--num-nodes $n): exit status $rc, $(( $(date +%s) - t )) s"; report
  done
  [ "$(date +%s)" -lt "$end" ] || return
  md "" "## 1 against $NODES nodes of cnn-train" "" '```' "gpuvs compare ${CNN[*]} --arm one:num_nodes=1 --arm n:num_nodes=$NODES (pod options above)" '```'
  t=$(date +%s)
  gpuvs_run $(( end - $(date +%s) )) compare "${CNN[@]}" "${POD[@]}" --arm "one:num_nodes=1" \
    --arm "nodes$NODES:num_nodes=$NODES" --store "$DB"; rc=$?
  md "" "Exit status $rc, $(( $(date +%s) - t )) s."; report
}

part_pairs() {  # which node or link: the pair fleet, with a co-tenant on SLOW_NODE's GPU
  local lim; lim=$(within "$PAIRS_S")
  if [ "$NODES" -lt 3 ] || [ "$lim" -lt 60 ]; then md "" "## Pairs of nodes: not run ($NODES node(s), ${lim} s left)"; return; fi
  local py; py=$("$PY" -c 'import sys; print(sys.executable)')
  # as the nodes part: the pods' own network, so NCCL goes through its socket transport between each pair's pods
  local POD=(--image "$REG/gpuvs-node:gpu" --image-pull-policy IfNotPresent --kubeconfig "$KC" --python "$py"
             --start-timeout 120 --env-var "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" --env-var "PATH=$PATH"
             --env-var "HOME=$K/home" $(host_mounts))
  local COLL=(collective --op all-reduce --device "$DEVICE" --min-bytes "${PAIR_BYTES:-64M}" --max-bytes "${PAIR_BYTES:-64M}" --trials "$PAIR_TRIALS")
  [ "$DEVICE" = cpu ] && COLL=(collective --op all-reduce --device cpu --min-bytes 256K --max-bytes 256K --warmup 2
                               --iters 10 --repeats 3 --trials "$PAIR_TRIALS")
  local n="-" title="no co-tenant" slow=$PAIR_SLOW
  if [ "$slow" -gt 0 ]; then
    n=$(node "$slow"); title="co-tenant on $n, busy $COTENANT_BUSY"
    cotenant_start "$slow" || { md "" "## Pairs of nodes: not run (the co-tenant did not start)"; cotenant_stop; return; }
  fi
  md "" "## Pairs of nodes ($title)" "" "Every pair of the $NODES nodes an all-reduce across its two pods (the pods' own network:" \
     "NCCL's socket transport between them), \`--trials $PAIR_TRIALS\` each, pairs without a node in common $PAIR_PARALLEL at a time."
  [ "$slow" -gt 0 ] && md "" "Co-tenant outside Kubernetes on $n: $COTENANT_UUID."
  cmdline fleet "${COLL[@]}" --pairs --parallel "$PAIR_PARALLEL" "${POD[@]}"
  local t; t=$(date +%s)
  gpuvs_run "$lim" fleet "${COLL[@]}" --pairs --parallel "$PAIR_PARALLEL" --store "$DB" --name "kit: pairs, $title" "${POD[@]}"; local rc=$?
  cotenant_stop
  [ "$slow" -gt 0 ] && [ "$DEVICE" = cuda ] && md "" "Co-tenant's own rate while it ran: $(grep '^cotenant rate' "$K/cotenant.log" | sed 's/cotenant rate=//' | xargs) (one figure every 5 s)."
  md "" "Exit status $rc, $(( $(date +%s) - t )) s."; report
}

for p in ${PARTS//,/ }; do
  log "part $p ($(left) s left)"
  "part_$p"
  log "part $p done"
done
