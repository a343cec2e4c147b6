"""Prepare what the GPU machine needs to run a real GPU pod (benchmarks/pod_gpu.sh), in one folder.

    python benchmarks/pod_gpu_prepare.py DEST      (from the repo root; e.g. /work/main/.carry/pod)
That machine has no container engine and no network, so everything goes along (at most 64 MiB with the repo).
The folder's parts are listed below the imports."""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# What goes into DEST:
#   bin/*.xz        etcd, kube-apiserver, kubelet (built by scripts/test-cluster build), containerd,
#                   containerd-shim-runc-v2, runc (Debian's), xz-compressed with the x86 filter (no ctr: the images
#                   are pulled from benchmarks/pod_gpu_registry.py)
#   py/site.tar.xz  the kubernetes client (31, pure Python) and what it needs that the GPU machine lacks
#   pki/            a CA, the API server's serving certificate (127.0.0.1), its kubelet-client certificate, the
#                   service-account key pair, a token file, and two kubeconfigs (admin, node gpu-node)
#   images/         the pause image and `gpuvs-node:gpu`: a near-empty image (mount points and the merged-/usr
#                   symlinks); the pod gets the node's /usr, /etc and Python through --mount
#   wt/             this worktree (src, tests' device plugin, benchmarks, experiments)
REPO = Path(__file__).resolve().parent.parent
K8S_BIN = Path(os.environ.get("GPUVS_K8S_CACHE", "/var/cache/gpuvs-k8s")) / "bin"
NODE = "gpu-node"
IMAGE = "localhost/gpuvs-node:gpu"
BINARIES = {"etcd": "/usr/bin/etcd", "kube-apiserver": K8S_BIN / "kube-apiserver", "kubelet": K8S_BIN / "kubelet",
            "containerd": "/usr/bin/containerd", "containerd-shim-runc-v2": "/usr/bin/containerd-shim-runc-v2",
            "runc": "/usr/sbin/runc"}
# The client for the GPU machine's Python (3.12, no pydantic there): kubernetes 31 is pure Python; what it
# imports that the machine lacks goes along (pip download, pure-Python wheels only; google-auth 2.29 still
# works without the cryptography package).
WHEELS = ("kubernetes==31.0.0", "durationpy", "websocket-client", "oauthlib", "requests-oauthlib", "google-auth==2.29.0",
          "cachetools", "pyasn1", "pyasn1-modules", "rsa", "six")


def test_cluster_module():
    """scripts/test-cluster as a module (its image writer), without running it."""
    loader = importlib.machinery.SourceFileLoader("test_cluster", str(REPO / "scripts/test-cluster"))
    spec = importlib.util.spec_from_loader("test_cluster", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def compress(src: Path, dst: Path) -> None:
    if dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
        return
    filters = [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
    with open(src, "rb") as f, lzma.open(str(dst) + ".part", "wb", filters=filters) as out:
        shutil.copyfileobj(f, out)
    os.rename(str(dst) + ".part", dst)


def site(dest: Path) -> None:
    if dest.exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "-d", tmp, *WHEELS], check=True)
        with tarfile.open(dest, "w:xz", preset=9) as tar:
            for wheel in sorted(Path(tmp).glob("*.whl")):
                with zipfile.ZipFile(wheel) as z:
                    for info in z.infolist():
                        if info.is_dir() or "/tests/" in info.filename or info.filename.startswith("kubernetes/aio"):
                            continue
                        data = z.read(info)
                        t = tarfile.TarInfo(info.filename)
                        t.size = len(data)
                        tar.addfile(t, io.BytesIO(data))


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def pki(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if (d / "admin.kubeconfig").exists():
        return
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
            "-subj", "/CN=gpuvs-gpu-ca", cwd=d)
    ext = d / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n")
    for name, subj, extra in (("apiserver", "/CN=kube-apiserver", ["-extfile", "san.cnf"]),
                              ("kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                subj, cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "30", *extra, cwd=d)
    openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    tokens = {"admin": os.urandom(16).hex(), NODE: os.urandom(16).hex()}
    (d / "tokens.csv").write_text(f'{tokens["admin"]},admin,admin,"system:masters"\n'
                                  f'{tokens[NODE]},system:node:{NODE},node-{NODE},"system:nodes"\n')
    ca = base64.b64encode((d / "ca.crt").read_bytes()).decode()
    for user, token in (("admin", tokens["admin"]), ("kubelet", tokens[NODE])):
        kc = {"apiVersion": "v1", "kind": "Config", "current-context": "gpu",
              "clusters": [{"name": "gpu", "cluster": {"server": "https://127.0.0.1:6443",
                                                       "certificate-authority-data": ca}}],
              "users": [{"name": user, "user": {"token": token}}],
              "contexts": [{"name": "gpu", "context": {"cluster": "gpu", "user": user, "namespace": "default"}}]}
        (d / f"{user}.kubeconfig").write_text(json.dumps(kc, indent=1))
    for leftover in ("ca.key", "ca.srl", "apiserver.csr", "kubelet-client.csr", "san.cnf"):
        (d / leftover).unlink(missing_ok=True)


def node_image(tc, out: Path) -> None:
    """Mount points and merged-/usr symlinks only: the node's own /usr, /etc and Python come in by --mount."""
    with tempfile.TemporaryDirectory() as tmp:
        layer = Path(tmp) / "layer.tar"
        with tarfile.open(layer, "w") as tar:
            for name in ("usr", "etc", "opt", "tmp", "dev", "proc", "sys", "run", "var", "root"):
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
                tar.addfile(info)
            for name in ("bin", "sbin", "lib", "lib64", "lib32"):
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, f"usr/{name}"
                tar.addfile(info)
        tc.docker_archive(out, IMAGE, layer, {"config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                                                  "/usr/bin:/sbin:/bin"]}})


def main(dest: str) -> int:
    d = Path(dest)
    for sub in ("bin", "py", "images"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    missing = [str(p) for p in BINARIES.values() if not Path(p).exists()]
    if missing:
        print(f"missing: {', '.join(missing)} (scripts/test-cluster build; apt-get install etcd-server containerd "
              "runc)", file=sys.stderr)
        return 2
    for name, src in BINARIES.items():
        compress(Path(src), d / "bin" / f"{name}.xz")
    site(d / "py" / "site.tar.xz")
    pki(d / "pki")
    tc = test_cluster_module()
    shutil.copy2(tc.pause_image(), d / "images" / "pause.tar")
    node_image(tc, d / "images" / "node.tar")
    skip = [".git", ".venv", "__pycache__", "docs/img", ".pytest_cache", ".carry"]  # .carry: this folder's parent
    subprocess.run(["rsync", "-a", "--delete", *(f"--exclude={x}" for x in skip), f"{REPO}/", f"{d}/wt/"], check=True)
    total = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    print(f"{d}: {total / 2**20:.1f} MiB")
    for f in sorted(d.rglob("*.xz")):
        print(f"  {f.relative_to(d)} {f.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(REPO / ".carry/pod")))
