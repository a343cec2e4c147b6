"""The image the GPU cluster kit's `check` part runs gpu-check in (issue 33): Python, numpy and glibc, nothing else.

    python benchmarks/gpu_check_image.py OUT.tar [--tag localhost/gpuvs-check:kit]
No PyTorch and no CUDA toolkit: gpuvs comes in by the package ConfigMap, the driver's files by the device plugin.
Built where it runs (the GPU machine's Python differs): a one-layer `docker save` archive the kit's registry serves."""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
from images import python_rootfs  # noqa: E402  (tests/images.py: the interpreter, its stdlib and their libraries)
from pod_gpu_prepare import test_cluster_module  # noqa: E402

TAG = "localhost/gpuvs-check:kit"
# glibc as a distribution's base image has it: libcuda needs libdl, libpthread and librt beside libc and libm
GLIBC = ("libc.so.*", "libm.so.*", "libdl.so.*", "libpthread.so.*", "librt.so.*", "libresolv.so.*", "ld-linux*.so.*")


def build(out: Path, tag: str = TAG) -> Path:
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        root = python_rootfs(Path(tmp) / "root", modules=("numpy",))
        # python_rootfs puts numpy in the base prefix's purelib as this (perhaps virtual) environment names it; a
        # distribution's interpreter (Debian's, Ubuntu's) reads its own dist-packages instead: ask it which
        exe = os.path.realpath(sys.executable)
        own = json.loads(subprocess.run([exe, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
                                        capture_output=True, text=True, check=True).stdout)
        placed = root / sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})[
            "purelib"].lstrip("/")
        if own and Path(own[0]) != Path("/") / placed.relative_to(root):
            shutil.copytree(placed, root / own[0].lstrip("/"), dirs_exist_ok=True)
            shutil.rmtree(placed)
        libc = next(p.parent for p in root.rglob("libc.so.6"))  # where python_rootfs put the interpreter's libc
        libc = Path("/") / libc.relative_to(root)
        for pattern in GLIBC:
            for lib in glob.glob(str(libc / pattern)):
                dest = root / lib.lstrip("/")
                if not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(os.path.realpath(lib), dest)
        layer = Path(tmp) / "layer.tar"
        with tarfile.open(layer, "w") as tar:
            for entry in sorted(root.iterdir()):
                tar.add(str(entry), arcname=entry.name)
        test_cluster_module().docker_archive(out, tag, layer, {"config": {
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Cmd": ["/usr/bin/python3"]}})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tag", default=TAG)
    a = ap.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    build(a.out.resolve(), a.tag)
    print(f"{a.out}: {a.tag}, {a.out.stat().st_size / 2**20:.1f} MiB (Python {sys.version.split()[0]}, its "
          "standard library, numpy, glibc; no other site-packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
