"""Pack what the GPU cluster kit (benchmarks/gpu_cluster.sh) needs into one folder for the device tool's `carry`.

    python benchmarks/gpu_cluster_prepare.py [DEST] [--quick]      (from the repo root; DEST is .carry/gpu by default)
The GPU machine has no container engine, no network and none of this machine's packages: what goes is listed below.
The first run builds kube-multicall (15-30 min); --quick packs links, for tests. It prints the device tool's calls."""

from __future__ import annotations

import io
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pod_gpu_prepare as pod  # noqa: E402  (the one-node kit's pieces: site, node image, test-cluster module)

# What goes into DEST (the repo and DEST together at most LIMIT_MIB):
#   bin.tar.xz      bin/kube-multicall (kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet in one
#                   static binary, built from the tree `scripts/test-cluster build` fetched:
#                   benchmarks/kube_multicall/main.go), bin/etcd, bin/containerd, bin/containerd-shim-runc-v2, bin/runc
#                   and cni/{bridge,ptp,host-local,loopback} (Debian's). One xz stream, the x86 filter and a dictionary
#                   as large as the tar, so that what the binaries share is stored once
#   py/site.tar.xz  the kubernetes client and what it needs that the GPU machine lacks (pod_gpu_prepare.py)
#   pki/            the cluster's CA certificate, the API server's serving and kubelet-client certificates and the
#                   service-account keys, made by scripts/test-cluster (no CA key goes along)
#   images/         pause, gpuvs-node:gpu (near-empty: the node's /usr, /etc and /opt come in by --mount) and
#                   gpuvs-probe:kit (busybox, for gpuvs validate's probe pods), xz-compressed docker archives
# The kit then runs from the repo root on the GPU machine, so this branch must be in the checkout the tool sends.
REPO = pod.REPO
MULTICALL = "kube-multicall"
BINARIES = {"etcd": "/usr/bin/etcd", "containerd": "/usr/bin/containerd",
            "containerd-shim-runc-v2": "/usr/bin/containerd-shim-runc-v2", "runc": "/usr/sbin/runc"}
CNI = ("bridge", "ptp", "host-local", "loopback")
PROBE = "localhost/gpuvs-probe:kit"
LIMIT_MIB = 64
XZ = [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


def multicall(tc) -> Path:
    """The four Kubernetes components as one binary (cached beside the test cluster's binaries)."""
    out = tc.BIN / MULTICALL
    src = REPO / "benchmarks/kube_multicall/main.go"
    if out.exists() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    tree = tc.fetch_source()
    (tree / "cmd" / MULTICALL).mkdir(exist_ok=True)
    shutil.copy2(src, tree / "cmd" / MULTICALL / "main.go")
    return tc.make(tree, [MULTICALL], KUBE_STATIC_OVERRIDES=MULTICALL)[MULTICALL]


def xz(data_from: Path, dest: Path, dict_size: int | None = None) -> None:
    filters = [dict(f) for f in XZ]
    if dict_size:
        filters[-1]["dict_size"] = dict_size
    with open(data_from, "rb") as f, lzma.open(str(dest) + ".part", "wb", filters=filters) as out:
        shutil.copyfileobj(f, out, 1 << 20)
    os.rename(str(dest) + ".part", dest)


def binaries(dest: Path, members: dict[str, Path]) -> None:
    """One tar of every binary, compressed as one stream (skipped when newer than every input)."""
    if dest.exists() and all(dest.stat().st_mtime >= p.stat().st_mtime for p in members.values()):
        return
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "bin.tar"
        with tarfile.open(tar_path, "w") as tar:
            for name, path in members.items():
                tar.add(str(path), arcname=name)
        size = tar_path.stat().st_size
        dict_size = min(1 << 30, 1 << (size - 1).bit_length())  # the whole tar in the window
        print(f"compressing {size / 2**20:.0f} MiB of binaries (dictionary {dict_size >> 20} MiB; minutes)",
              flush=True)
        xz(tar_path, dest, dict_size)


def probe_image(tc, out: Path) -> None:
    """busybox as /bin/sh and its applets: what gpuvs validate's probe pods run (nvidia-smi comes from the node)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        for d in ("bin", "tmp", "dev", "proc", "sys", "etc"):
            (root / d).mkdir(parents=True)
        tc.add_busybox(root)
        layer = Path(tmp) / "layer.tar"
        with tarfile.open(layer, "w") as tar:
            for entry in sorted(root.iterdir()):
                tar.add(str(entry), arcname=entry.name)
        tc.docker_archive(out, PROBE, layer, {"config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]}})


def images(tc, d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        made = {"pause": tc.pause_image(), "node": Path(tmp) / "node.tar", "probe": Path(tmp) / "probe.tar"}
        pod.node_image(tc, made["node"])
        probe_image(tc, made["probe"])
        for name, src in made.items():
            xz(src, d / f"{name}.tar.xz")


def pki(tc, d: Path) -> None:
    if all((d / f).exists() for f in tc.PKI_FILES):
        return
    d.mkdir(parents=True, exist_ok=True)
    tc.PKI = d
    tc.make_pki()
    for leftover in ("ca.key", "ca.srl"):  # the kit signs nothing: its CA key stays here
        (d / leftover).unlink(missing_ok=True)


def size_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def repo_mib() -> float:
    """What the device tool sends besides the carry: tracked files and untracked ones git does not ignore."""
    import subprocess

    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    return sum((REPO / f).stat().st_size for f in files if f and (REPO / f).is_file()) / 2**20


def calls(dest: Path) -> str:
    """The device tool calls (the tool sets OUT; the kit keeps its own deadline, TOTAL_S=540, clean-up included)."""
    rel = os.path.relpath(dest, REPO)
    kit = f"CARRY={rel} TOTAL_S=540"
    return "\n".join([
        f"device tool calls: carry [\"{rel}\"], timeout_s 600 each, run from the repo root:",
        "(a) kind nvidia-h100-x1: validate functional + --disruptive on one GPU node (expected 2-3 min: unpack and",
        "    host CUDA 20 s, cluster 25 s, functional 15 s, disruptive 60-90 s, clean-up 10 s)",
        f"    {kit} NODES=1 PARTS=validate bash benchmarks/gpu_cluster.sh",
        "(b) kind nvidia-h200-x4 (or -x2, -x8; one kubelet per GPU), two calls on the same machine:",
        "    (b1) fleet cnn-train without and with a co-tenant (expected 5-6 min: start 50 s, each run 4 rounds of",
        "         25-35 s pods, 110-170 s)",
        f"    {kit} PARTS=fleet FLEET=cnn-train FLEET_S=200 bash benchmarks/gpu_cluster.sh",
        "    (b2) fleet gemm without and with a co-tenant, then 1 vs N GPUs on the host (expected 5-7 min: start 50 s,",
        "         each gemm run 60-90 s, 1-vs-n 6 trials of 20-35 s)",
        f"    {kit} PARTS=fleet,scaling FLEET=gemm bash benchmarks/gpu_cluster.sh",
    ])


def quick(tc, d: Path) -> None:
    """A carry for this machine alone: links to the test cluster's four binaries and the others, no compression."""
    members = {**{f"bin/{c}": tc.BIN / c for c in tc.COMPONENTS}, **{f"bin/{n}": Path(p) for n, p in BINARIES.items()},
               **{f"cni/{c}": Path("/usr/lib/cni", c) for c in CNI}}
    missing = [str(p) for p in members.values() if not p.exists()]
    if missing:
        raise SystemExit(f"missing: {', '.join(missing)} (scripts/test-cluster build; .ci/apt/cluster.txt)")
    with tarfile.open(d / "bin.tar", "w") as tar:
        for name, path in members.items():
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, str(path)
            tar.addfile(link)
    with tarfile.open(d / "py" / "site.tar.xz", "w:xz"):
        pass  # this machine's Python has the client


def main(argv: list[str]) -> int:
    quick_carry = "--quick" in argv
    argv = [a for a in argv if a != "--quick"]
    d = Path(argv[0] if argv else REPO / ".carry/gpu").resolve()
    tc = pod.test_cluster_module()
    if quick_carry:
        for sub in ("py", "images"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        quick(tc, d)
        pki(tc, d / "pki")
        images(tc, d / "images")
        print(f"{d}: a quick carry for this machine ({size_mib(d):.1f} MiB)")
        return 0
    missing = [str(p) for p in BINARIES.values() if not Path(p).exists()]
    missing += [f"/usr/lib/cni/{c}" for c in CNI if not Path("/usr/lib/cni", c).exists()]
    if missing:
        print(f"missing: {', '.join(missing)} (apt-get install etcd-server containerd runc containernetworking-plugins;"
              " see .ci/apt/cluster.txt)", file=sys.stderr)
        return 2
    for sub in ("py", "images"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    members = {f"bin/{MULTICALL}": multicall(tc), **{f"bin/{n}": Path(p) for n, p in BINARIES.items()},
               **{f"cni/{c}": Path("/usr/lib/cni", c) for c in CNI}}
    binaries(d / "bin.tar.xz", members)
    pod.site(d / "py" / "site.tar.xz")
    pki(tc, d / "pki")
    images(tc, d / "images")
    carried, repo = size_mib(d), repo_mib()
    print(f"{d}: {carried:.1f} MiB; the repo sent with it: {repo:.1f} MiB; together {carried + repo:.1f} MiB "
          f"(limit {LIMIT_MIB} MiB)")
    for f in sorted(d.rglob("*.xz")):
        print(f"  {f.relative_to(d)} {f.stat().st_size / 2**20:.1f} MiB")
    print(calls(d))
    return 0 if carried + repo <= LIMIT_MIB else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
