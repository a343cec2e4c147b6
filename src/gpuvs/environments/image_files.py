"""An image's software read from outside, through its engine, without running anything in it (bare mode).

With podman as root the image is mounted and read in place; elsewhere a container is created, never started.
Then software.py's files are copied out one by one, and the libraries' folders are left out (`software.note`).
Cached per image ID for the process: every trial of an arm uses the same image."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import uuid
from typing import Any

from gpuvs.probes import software
from gpuvs.environments.engine import Engine

_CACHE: dict[tuple[str, str], dict[str, Any]] = {}
NOTE = "read from outside the image (bare mode): its CUDA libraries' folders were not listed"


def _image_id(engine: Engine, image: str) -> str | None:
    try:
        r = engine.call("image", "inspect", "--format", "{{.Id}}", image, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def _config_env(engine: Engine, image: str) -> dict[str, str]:
    try:
        r = engine.call("image", "inspect", "--format", "{{json .Config.Env}}", image, timeout=30)
        items = json.loads(r.stdout or "null") or [] if r.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        items = []
    return dict(str(i).partition("=")[::2] for i in items)


def _copy_out(engine: Engine, name: str, path: str) -> str | None:
    try:
        r = subprocess.run(engine.argv("cp", f"{name}:{path}", "-"), capture_output=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout:
        return None
    try:
        with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
            for member in tar:
                if member.isfile():
                    fh = tar.extractfile(member)
                    return fh.read(65536).decode("utf-8", "replace") if fh else None
                if member.issym() or member.islnk():  # a link: copy what it points to
                    target = member.linkname if member.linkname.startswith("/") else \
                        path.rsplit("/", 1)[0] + "/" + member.linkname
                    return _copy_out(engine, name, target) if target != path else None
    except tarfile.TarError:
        return None
    return None


def _mounted(engine: Engine, image: str, env: dict[str, str]) -> dict[str, Any] | None:
    """podman as root: the image's files read where `podman image mount` shows them (every field, the libraries'
    folders listed too); None where that is not possible (docker, rootless podman)."""
    if engine.name != "podman" or os.geteuid() != 0:
        return None
    try:
        r = engine.call("image", "mount", image, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    top = r.stdout.strip()
    if r.returncode != 0 or not os.path.isdir(top):
        return None
    try:
        def read(path: str) -> str | None:
            full = os.path.realpath(os.path.join(top, path.lstrip("/")))
            if not full.startswith(os.path.realpath(top)):  # a link out of the image: not the image's file
                return None
            try:
                with open(full, errors="replace") as fh:
                    return fh.read(65536)
            except OSError:
                return None

        names: list[str] = []
        for folder in software.LIB_DIRS:
            try:
                names += os.listdir(os.path.join(top, folder.lstrip("/")))
            except OSError:
                continue
        return software.from_files(read, env, names)
    finally:
        try:
            engine.call("image", "unmount", image, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass


def describe(engine: Engine, image: str) -> dict[str, Any]:
    """{"image_id": ..., "software": {...}} of a local image, read from outside."""
    image_id = _image_id(engine, image)
    if image_id is None:
        return {}
    key = (engine.path + " " + " ".join(engine.global_args), image_id)
    if key in _CACHE:
        return _CACHE[key]
    env = _config_env(engine, image)
    soft = _mounted(engine, image, env)
    if soft is not None:
        _CACHE[key] = {"image_id": image_id[:19], "software": soft}
        return _CACHE[key]
    name = f"gpuvs-files-{uuid.uuid4().hex[:12]}"
    texts: dict[str, str | None] = {}
    try:
        r = engine.call("create", "--name", name, "--label", "gpuvs=1", "--network", "none", image, "/gpuvs-never-run",
                        timeout=60)
        if r.returncode == 0:
            for path in software.FILES:
                texts[path] = _copy_out(engine, name, path)
    except (OSError, subprocess.TimeoutExpired):
        pass
    finally:
        try:
            engine.call("rm", "-f", name, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
    soft = software.from_files(texts.get, {k: v for k, v in env.items()})
    soft["note"] = NOTE
    out = {"image_id": image_id[:19], "software": soft}
    _CACHE[key] = out
    return out
