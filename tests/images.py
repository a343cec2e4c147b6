"""Real container images for the tests, built from this machine's files (no registry is reachable).

This interpreter, its standard library, the site-packages modules asked for and every shared library they load.
They are imported into podman's storage as one layer."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

SKIP = ("site-packages", "dist-packages", "test", "tests", "__pycache__", "idlelib", "tkinter", "turtledemo",
        "ensurepip", "lib2to3")


def _copy(src: str, root: Path) -> None:
    dst = root / src.lstrip("/")
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(src), dst)


def python_rootfs(root: Path, modules: tuple[str, ...] = ("numpy",)) -> Path:
    """A root filesystem in which /usr/bin/python3 is this interpreter, at its own path, with `modules`."""
    exe = os.path.realpath(sys.executable)
    stdlib = sysconfig.get_paths()["stdlib"]
    _copy(exe, root)
    shutil.copytree(stdlib, root / stdlib.lstrip("/"), ignore=shutil.ignore_patterns(*SKIP), dirs_exist_ok=True)
    # the base interpreter's own site-packages: inside a virtual environment, purelib is the venv's, which the
    # interpreter at its real path does not read without the venv's pyvenv.cfg beside it
    site = root / sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})[
        "purelib"].lstrip("/")
    for name in modules:
        folder = Path(importlib.util.find_spec(name).origin).parent
        for extra in (folder, folder.parent / f"{name}.libs"):
            if extra.is_dir():
                shutil.copytree(extra, site / extra.name, ignore=shutil.ignore_patterns("tests", "__pycache__"),
                                dirs_exist_ok=True)
    elves = [exe] + [os.path.join(d, f) for d, _, names in os.walk(root) for f in names if ".so" in f]
    for elf in elves:
        out = subprocess.run(["ldd", elf], capture_output=True, text=True).stdout
        for lib in re.findall(r"(/\S+) \(0x", out):
            _copy(lib, root)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    if not (root / "usr/bin/python3").exists():
        os.symlink(exe, root / "usr/bin/python3")
    for d in ("tmp", "proc", "dev", "sys", "etc", "root"):
        (root / d).mkdir(exist_ok=True)
    return root


def podman(*args: str) -> subprocess.CompletedProcess:
    """podman with the settings gpuvs uses (GPUVS_PODMAN_ARGS and what it detects), so that an image
    imported here is in the storage that gpuvs's containers, and podman's API service, use."""
    from gpuvs.environments import engine

    return subprocess.run(engine.detect("podman").argv(*args), capture_output=True, text=True, timeout=300)


def import_image(root: Path, tag: str, tar_path: Path) -> str:
    """`podman import` the folder as image `tag`; returns the tag."""
    with tarfile.open(tar_path, "w") as tar:
        tar.add(root, arcname=".")
    r = podman("import", "--change", "ENV=PATH=/usr/bin:/bin", str(tar_path), tag)
    assert r.returncode == 0, r.stderr
    tar_path.unlink()
    return tag


def binaries_rootfs(root: Path, programs: tuple[str, ...]) -> Path:
    """A root filesystem with these programs of this machine (at their own paths) and every shared library they
    load, /etc/os-release, and nothing else: no Python, no shell (an image such as a compiled benchmark's)."""
    for name in programs:
        exe = shutil.which(name)
        assert exe, f"{name} is not installed here"
        _copy(exe, root)
        out = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
        for lib in re.findall(r"(/\S+) \(0x", out):
            _copy(lib, root)
    _copy("/etc/os-release", root) if os.path.exists("/etc/os-release") else None
    for d in ("tmp", "proc", "dev", "sys", "etc", "root"):
        (root / d).mkdir(exist_ok=True)
    return root
