#!/usr/bin/env bash
# GPU proof of issue 11 §4: a real GPU pod on the GPU machine, ResNet-50 training host vs pod with a
# verdict, and the pod's start-up breakdown. That machine has no container engine and no network, so
# a one-node cluster is started from what benchmarks/pod_gpu_prepare.py packed: etcd, kube-apiserver,
# containerd + runc and a kubelet, a small registry serving the two images (no scheduler: the pod names its node; no CNI: host network; no
# controller-manager), the project's device plugin in --real mode (tests/fixtures/gpu_device_plugin:
# /dev/nvidia* handed to the container by Allocate), and a near-empty image: the node's own /usr,
# /etc and Python come into the pod read-only through --mount (hostPath), as --rootfs /:O does for
# the container study. gpuvs then runs experiments/host-vs-pod.yaml through the API like any cluster.
#
# Usage (from the worktree copy, CARRY = the folder pod_gpu_prepare.py filled):
#   CARRY=.. OUT=out bash benchmarks/pod_gpu.sh
#   TRIALS=N (default 3)   STEPS=N (default 30)   PART_S=seconds for the comparison (default 200)
#   DEVICE=cpu   dry run on a machine without a GPU (fake device plugin, tiny CPU sizes, its own mount namespace
#                and ports: API_PORT, ETCD_PORT, KUBELET_PORT), to check the script end to end before the GPU call
# Writes $OUT/pod_gpu.md (tables and the commands), $OUT/pod_gpu.db (every sample), $OUT/pod_gpu.log,
# and the cluster parts' logs as $OUT/k8s-logs.txt. Everything it started is stopped at exit.
set -u
cd "$(dirname "$0")/.."
CARRY=${CARRY:-..}; CARRY=$(cd "$CARRY" && pwd)
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
TRIALS=${TRIALS:-3}; STEPS=${STEPS:-30}; PART_S=${PART_S:-200}; DEVICE=${DEVICE:-cuda}
API_PORT=${API_PORT:-6443}; ETCD_PORT=${ETCD_PORT:-2379}; KUBELET_PORT=${KUBELET_PORT:-10250}
REG_PORT=${REG_PORT:-5055}; REG=localhost:$REG_PORT
K=/tmp/gpuvs-k8s; NODE=gpu-node
MD=$OUT/pod_gpu.md; DB=$OUT/pod_gpu.db; LOG=$OUT/pod_gpu.log
PY=${PYTHON:-python3}
if [ "$DEVICE" = cpu ] && [ -z "${POD_GPU_NS:-}" ]; then  # a private /var/lib/kubelet and /var/log/pods
  rm -rf "$K"; mkdir -p "$K/varlib" "$K/varlog" /var/lib/kubelet /var/log/pods
  exec env POD_GPU_NS=1 CARRY="$CARRY" OUT="$OUT" unshare -m --propagation private bash -c \
    "mount --bind $K/varlib /var/lib/kubelet && mount --bind $K/varlog /var/log/pods && exec bash $0"
fi
T0=$(date +%s)
log() { echo "[pod_gpu +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG" >&2; }
md() { printf '%s\n' "$@" >> "$MD"; }
PIDS=()
cleanup() {
  log "stopping the cluster"
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill "${PIDS[$i]}" 2>/dev/null; done
  sleep 2
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill -9 "${PIDS[$i]}" 2>/dev/null; done
  # containerd's shims (and any container left) outlive containerd: end those of this cluster, by their ids
  for pid in $(grep -l -a "$K/containerd" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do kill -9 "$pid" 2>/dev/null; done
  for f in "$K"/log/*.log; do [ -f "$f" ] && { echo "=== $f"; tail -n 60 "$f"; }; done > "$OUT/k8s-logs.txt" 2>&1
}
trap cleanup EXIT
[ -n "${POD_GPU_NS:-}" ] || rm -rf "$K"; mkdir -p "$K/bin" "$K/log" "$K/site" "$K/cni" "$K/pki"
: > "$MD"
P=$K/pki
cp "$CARRY"/pki/* "$P/"
sed -i "s#https://127.0.0.1:6443#https://127.0.0.1:$API_PORT#" "$P"/*.kubeconfig

# -- 1. unpack ------------------------------------------------------------------------------------
"$PY" - "$CARRY" "$K" <<'PYEOF'
import lzma, os, shutil, sys, tarfile
carry, k = sys.argv[1:3]
for f in os.listdir(f"{carry}/bin"):
    out = f"{k}/bin/{f[:-3]}"
    with lzma.open(f"{carry}/bin/{f}") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(out, 0o755)
tarfile.open(f"{carry}/py/site.tar.xz").extractall(f"{k}/site")
PYEOF
export PATH=$K/bin:$PATH PYTHONPATH=$PWD/src:$K/site PYTHONUNBUFFERED=1 COLUMNS=160
log "unpacked: $(ls "$K/bin" | xargs)"
grep -q " $NODE\$" /etc/hosts || echo "127.0.0.1 $NODE" >> /etc/hosts
nvidia-smi -L >> "$LOG" 2>&1

start() {  # NAME ARGV...: in the background, logged
  local name=$1; shift
  "$@" > "$K/log/$name.log" 2>&1 &
  PIDS+=($!)
}
waitfor() {  # WHAT SECONDS COMMAND...
  local what=$1 limit=$2; shift 2
  local t=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$t" ]; then log "FAILED: $what not up within ${limit}s"; return 1; fi
    sleep 0.3
  done
  log "$what up"
}
api_ready() {
  "$PY" -c "import json,ssl,sys,urllib.request as u
t=json.load(open('$P/admin.kubeconfig'))['users'][0]['user']['token']
c=ssl.create_default_context(cafile='$P/ca.crt')
r=u.urlopen(u.Request('https://127.0.0.1:$API_PORT/readyz',headers={'Authorization':'Bearer '+t}),context=c,timeout=2)
sys.exit(0 if r.read()==b'ok' else 1)"
}
node_ready() {
  "$PY" -c "from kubernetes import client, config
n=client.CoreV1Api(config.new_client_from_config('$P/admin.kubeconfig')).read_node('$NODE')
import sys; sys.exit(0 if int((n.status.allocatable or {}).get('nvidia.com/gpu','0'))>0 else 1)"
}

# -- 2. the cluster: etcd, API server, containerd, kubelet, device plugin ---------------------------
start etcd etcd --name gpu --data-dir "$K/etcd" --listen-client-urls http://127.0.0.1:$ETCD_PORT \
  --advertise-client-urls http://127.0.0.1:$ETCD_PORT --listen-peer-urls http://127.0.0.1:$((ETCD_PORT + 1))
start apiserver kube-apiserver --etcd-servers=http://127.0.0.1:$ETCD_PORT --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 --secure-port=$API_PORT --tls-cert-file="$P/apiserver.crt" \
  --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" --token-auth-file="$P/tokens.csv" \
  --authorization-mode=Node,RBAC --service-account-key-file="$P/sa.pub" \
  --service-account-signing-key-file="$P/sa.key" --service-account-issuer=https://kubernetes.default.svc \
  --service-cluster-ip-range=10.0.0.0/24 --kubelet-client-certificate="$P/kubelet-client.crt" \
  --kubelet-client-key="$P/kubelet-client.key" --kubelet-preferred-address-types=Hostname,InternalIP \
  --enable-admission-plugins=NodeRestriction --disable-admission-plugins=ServiceAccount --allow-privileged=false \
  --kubelet-port=$KUBELET_PORT
cat > "$K/containerd.toml" <<EOF
version = 2
root = "$K/containerd/root"
state = "$K/containerd/state"
[grpc]
  address = "$K/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$REG/pause:3.2"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$K/bin/runc"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."$REG"]
    endpoint = ["http://$REG"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$K/cni"
    conf_dir = "$K/cni"
EOF
start registry "$PY" benchmarks/pod_gpu_registry.py "$REG_PORT" "$CARRY/images/pause.tar" "$CARRY/images/node.tar"
start containerd containerd --config "$K/containerd.toml"
waitfor containerd 30 test -S "$K/containerd.sock" || exit 1
waitfor "API server" 60 api_ready || exit 1
CGROOT=""
if [ "$DEVICE" = cpu ]; then  # beside other kubelets on a shared machine: a cgroup root of its own (cgroup v1)
  CGROOT=', "cgroupRoot": "/gpuvs-podgpu"'
  for h in /sys/fs/cgroup/*/; do [ -d "$h" ] && mkdir -p "$h/gpuvs-podgpu" 2>/dev/null; done
fi
cat > "$K/kubelet.json" <<EOF
{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "address": "127.0.0.1",
 "port": $KUBELET_PORT, "healthzPort": $((KUBELET_PORT - 2)), "readOnlyPort": 0, "cgroupDriver": "cgroupfs", "failSwapOn": false,
 "authentication": {"x509": {"clientCAFile": "$P/ca.crt"}, "anonymous": {"enabled": false},
                    "webhook": {"enabled": false}},
 "authorization": {"mode": "AlwaysAllow"}, "resolvConf": "",
 "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                  "nodefs.inodesFree": "1%"},
 "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99, "nodeStatusUpdateFrequency": "4s"$CGROOT}
EOF
start kubelet kubelet --config="$K/kubelet.json" --kubeconfig="$P/kubelet.kubeconfig" --container-runtime=remote \
  --container-runtime-endpoint="unix://$K/containerd.sock" --hostname-override=$NODE --v=1
sleep 2
if [ "$DEVICE" = cpu ]; then PLUGIN_MODE=(--count 1); else
  PLUGIN_MODE=(--real)  # one CUDA context on the host first: the driver makes /dev/nvidia-uvm, which Allocate hands on
  "$PY" -c "import torch; torch.zeros(1, device='cuda'); print('host CUDA:', torch.cuda.get_device_name(0))" >> "$LOG" 2>&1
  ls -la /dev/nvidia* >> "$LOG" 2>&1
fi
start plugin "$PY" tests/fixtures/gpu_device_plugin/plugin.py "${PLUGIN_MODE[@]}" --dir /var/lib/kubelet/device-plugins
waitfor "node $NODE with allocatable nvidia.com/gpu" 90 node_ready || exit 1

# -- 3. gpuvs: doctor, then host vs pod -----------------------------------------------------------
TORCH_PY=$("$PY" -c 'import sys; print(sys.executable)')
MOUNTS=(--mount /usr:/usr:ro --mount /etc:/etc:ro --mount /opt:/opt:ro)
for m in $("$PY" -c 'import sys; print(sys.prefix, sys.base_prefix)'); do  # a venv or pyenv outside them
  case "$m" in /usr|/usr/*|/opt|/opt/*|/etc|/etc/*) ;; *) MOUNTS+=(--mount "$m:$m:ro");; esac
done
POD=(--image $REG/gpuvs-node:gpu --image-pull-policy IfNotPresent --kubeconfig "$P/admin.kubeconfig" --node $NODE
     --bypass-scheduler --host-network --python "$TORCH_PY" "${MOUNTS[@]}" --env-var "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" --env-var "PATH=$PATH"
     --env-var "HOME=/tmp" --start-timeout 120)
md "# GPU pod on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) (issue 11 §4)" ""
md "One-node cluster started on the GPU machine (Kubernetes 1.20.2 built from Debian's source, containerd 1.6," \
   "runc, the project's device plugin in --real mode; pod on the host network, bound to its node)." ""
md "\`\`\`" "gpuvs doctor --env pod --device $DEVICE ${POD[*]}" "\`\`\`" "" "\`\`\`"
timeout 90 "$PY" -m gpuvs doctor --env pod --device "$DEVICE" "${POD[@]}" 2>&1 | tee -a "$MD" >> "$LOG"
md "\`\`\`"
log "doctor done"
SIZES=(--steps "$STEPS")
[ "$DEVICE" = cpu ] && SIZES=(--device cpu --steps 3 --warmup-steps 1 --batch-size 2 --image-size 64 --model resnet18)
CMD=(compare --file experiments/host-vs-pod.yaml --trials "$TRIALS" "${SIZES[@]}" --store "$DB" "${POD[@]}")
md "" "## ResNet-50 training, host vs pod" "" "\`\`\`" "gpuvs ${CMD[*]}" "\`\`\`" ""
timeout "$PART_S" "$PY" -m gpuvs "${CMD[@]}" > "$OUT/compare.txt" 2>&1
rc=$?
log "compare exit $rc"
md "\`\`\`"; cat "$OUT/compare.txt" >> "$MD"; md "\`\`\`"
ID=$(grep -o '^experiment [^ ]*' "$OUT/compare.txt" | tail -1 | cut -d' ' -f2)
if [ -n "$ID" ]; then
  md "" "## Report (gpuvs report $ID --format md)" ""
  "$PY" -m gpuvs report "$ID" --format md --store "$DB" >> "$MD" 2>> "$LOG"
  "$PY" - "$DB" >> "$MD" <<'PYEOF'
import json, sqlite3, statistics, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT arm, status, startup FROM trials ORDER BY id").fetchall()
keys = ("pod_created_s", "pod_scheduled_s", "pod_image_ready_s", "pod_started_s", "pod_first_line_s",
        "pod_first_result_s", "launch_to_worker_s", "launch_to_exit_s")
print("\n## Start-up breakdown (seconds from the create request; mean [min-max] over ok trials)\n")
print("| arm | " + " | ".join(keys) + " |")
print("|---" * (len(keys) + 1) + "|")
for arm in sorted({r[0] for r in rows}):
    vals = [json.loads(s or "{}") for a, st, s in rows if a == arm and st == "ok"]
    cells = []
    for k in keys:
        xs = [v[k] for v in vals if k in v]
        cells.append(f"{statistics.mean(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]" if xs else "-")
    print(f"| {arm} | " + " | ".join(cells) + " |")
PYEOF
fi
ls /var/log/pods >> "$LOG" 2>&1
log "left: $("$PY" -c "from kubernetes import client, config
print(len(client.CoreV1Api(config.new_client_from_config('$P/admin.kubeconfig')).list_namespaced_pod('default', label_selector='gpuvs=1').items))" 2>&1) gpuvs pods"
