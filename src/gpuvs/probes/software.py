"""The software an image holds, read from its files without running anything in it.

The CUDA toolkit, cuDNN, the driver's libraries, the OS and (inside) the frameworks, compared when arms differ in image.
`here()` reads this filesystem; `from_files()` an image read from outside (environments/image_files.py).
Standard library only: it runs inside the user's image."""

from __future__ import annotations

import json
import os
import re
from typing import Callable, Iterable

CUDA_FILES = ("/usr/local/cuda/version.json", "/usr/local/cuda/version.txt")
CUDNN_FILES = ("/usr/include/cudnn_version.h", "/usr/local/cuda/include/cudnn_version.h",
               "/usr/include/x86_64-linux-gnu/cudnn_version_v9.h", "/usr/include/x86_64-linux-gnu/cudnn_version_v8.h",
               "/usr/include/aarch64-linux-gnu/cudnn_version_v9.h", "/usr/include/cudnn.h",
               "/usr/local/cuda/include/cudnn.h")
OS_FILES = ("/etc/os-release", "/usr/lib/os-release")
FILES = CUDA_FILES + CUDNN_FILES + OS_FILES  # every file read (what bare mode copies out of an image)
LIB_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/lib/aarch64-linux-gnu")
LIBRARIES = ("libcudart", "libcublas", "libcudnn", "libnccl")
FRAMEWORKS = ("torch", "torchvision", "tensorflow", "jax", "jaxlib", "onnxruntime-gpu", "tensorrt", "numpy")
_VERSIONED = re.compile(r"^(lib[\w+-]+)\.so\.(\d+(?:\.\d+)+)$")  # libcudart.so.12.4.127 (not the .so.12 link)

Reader = Callable[[str], "str | None"]


def _first(read: Reader, paths: Iterable[str]) -> tuple[str, str] | None:
    for path in paths:
        text = read(path)
        if text:
            return path, text
    return None


def cuda_version(read: Reader, env: dict[str, str]) -> str | None:
    """The CUDA toolkit's version: version.json, else version.txt, else CUDA_VERSION as NVIDIA's images set it."""
    found = _first(read, CUDA_FILES)
    if found is not None:
        path, text = found
        if path.endswith(".json"):
            try:
                return str(json.loads(text)["cuda"]["version"])
            except (ValueError, KeyError, TypeError):
                pass
        m = re.search(r"CUDA Version\s+([\d.]+)", text)
        if m:
            return m.group(1)
    return env.get("CUDA_VERSION") or None


def cudnn_version(read: Reader, env: dict[str, str]) -> str | None:
    """MAJOR.MINOR.PATCH from cudnn_version.h (else cudnn.h), else NV_CUDNN_VERSION or CUDNN_VERSION."""
    for path in CUDNN_FILES:
        text = read(path)
        if not text:
            continue
        parts = [re.search(rf"#define\s+CUDNN_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCHLEVEL")]
        if all(parts):
            return ".".join(m.group(1) for m in parts)  # type: ignore[union-attr]
    raw = env.get("NV_CUDNN_VERSION") or env.get("CUDNN_VERSION")
    return raw.split("-")[0] if raw else None


def os_name(read: Reader) -> str | None:
    """/etc/os-release's PRETTY_NAME."""
    found = _first(read, OS_FILES)
    if found is None:
        return None
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', found[1], re.M)
    return m.group(1) if m else None


def libraries(names: Iterable[str]) -> tuple[dict[str, str], str | None]:
    """({library: version} of the CUDA libraries, the driver's libcuda version) from file names.

    The driver's libcuda.so.VERSION is the host's, mounted into a container."""
    libs: dict[str, str] = {}
    driver = None
    for name in names:
        m = _VERSIONED.match(name)
        if m is None:
            continue
        lib, version = m.groups()
        if lib == "libcuda":
            driver = version if driver is None or _key(version) > _key(driver) else driver
        elif lib in LIBRARIES and (lib not in libs or _key(version) > _key(libs[lib])):
            libs[lib] = version
    return libs, driver


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def env_versions(env: dict[str, str]) -> dict[str, str]:
    """The image's own *_VERSION variables (from outside: the image's configuration)."""
    return {k: v for k, v in sorted(env.items()) if k.endswith("_VERSION") and v}


def from_files(read: Reader, env: dict[str, str] | None = None, names: Iterable[str] = (),
               frameworks: dict[str, str] | None = None) -> dict[str, object]:
    """cuda, cudnn, os, libraries, driver_libs, frameworks and env_versions, each only where known (never a guess).

    From a file reader (path -> text, or None), the image's environment variables, the names of the files in LIB_DIRS
    and the installed framework versions ("torch 2.5.1, numpy 2.1.3": FRAMEWORKS, inside only)."""
    env = env or {}
    out: dict[str, object] = {"cuda": cuda_version(read, env), "cudnn": cudnn_version(read, env), "os": os_name(read)}
    libs, driver = libraries(names)
    if libs:
        out["libraries"] = libs
    if driver:
        out["driver_libs"] = driver
    if frameworks:
        out["frameworks"] = ", ".join(f"{k} {v}" for k, v in frameworks.items())
    versions = env_versions(env)
    if versions:
        out["env_versions"] = versions
    return {k: v for k, v in out.items() if v is not None}


def _read_here(path: str) -> str | None:
    try:
        with open(path, errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return None


def _installed(names: Iterable[str]) -> dict[str, str]:
    """Versions of installed distributions, read from their metadata (nothing is imported)."""
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except Exception:  # not installed (PackageNotFoundError), or broken metadata
            continue
    return out


def here() -> dict[str, object]:
    """This filesystem's software (the worker inside an image or on the host)."""
    names: list[str] = []
    for folder in LIB_DIRS:
        try:
            names += os.listdir(folder)
        except OSError:
            continue
    return from_files(_read_here, {k: v for k, v in os.environ.items() if k in ("CUDA_VERSION", "NV_CUDNN_VERSION",
                                                                                  "CUDNN_VERSION")},
                      names, _installed(FRAMEWORKS))
