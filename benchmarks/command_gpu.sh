#!/usr/bin/env bash
# GPU proof of issue 21: a user's own plain PyTorch training script (benchmarks/user_train_loop.py, the recipes'
# plain loop printing its rate every step: not gpuvs's workload) run by gpuvs as a `command` with a --step-metric,
# host vs pod with a verdict, and gpuvs's own cnn-train on the same model and settings (ResNet-50, batch 256, bf16
# autocast, channels_last, SGD with momentum), host vs pod, in the same call. The pod runs on the GPU cluster kit's
# cluster (benchmarks/gpu_cluster.sh: one kubelet per GPU, the project's device plugin in --real mode, the node's
# own /usr, /etc, /opt and this checkout mounted read-only into a near-empty image); this script is the kit with
# its `command` part alone on one node.
#
# Usage, from the repo root (CARRY packed by `python benchmarks/gpu_cluster_prepare.py`, as for the kit):
#   CARRY=.carry/gpu OUT=out bash benchmarks/command_gpu.sh
#   CMD_TRIALS=3 (trials per arm)  CMD_STEPS=60 (timed steps)  COMMAND_S=330  TOTAL_S=540 (keep it 60 s under the
#   device tool's timeout_s)
#   DEVICE=cpu   dry run on a machine without a GPU: ResNet-18, batch 2, 64x64 images, 3 steps, on the CPU, the
#                kit's cluster in its own mount namespace beside the test cluster (fake device plugin)
# Writes OUT/command_gpu.md: the two figures (the script's mean per-step rate, cnn-train's images/sec), host and
# pod, the verdict of each study, their ratio against the 3% target, and whether the script waits for the GPU every
# step (it does, as the recipe does: about 2% on an H100); OUT/gpu_cluster.md (every command and report),
# OUT/gpu_cluster.db (every sample), OUT/gpu_cluster.log. Everything started is stopped at exit.
set -u
cd "$(dirname "$0")/.." || exit 2
export PARTS=command NODES=${NODES:-1}
exec bash benchmarks/gpu_cluster.sh
