"""How a container gets the GPU: the engine's own way, or what the NVIDIA container toolkit would do, done by gpuvs.

Modes (--gpus): toolkit (docker --gpus), cdi (--device nvidia.com/gpu=all), devices, none, or auto.
devices passes the /dev/nvidia* nodes and mounts the driver's user-space libraries read-only."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from gpuvs.errors import EnvironmentUnavailable, UsageError

MODES = ("auto", "toolkit", "cdi", "devices", "none")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
# Where the driver's libraries are mounted when they live in a system folder (one mount per file).
INSIDE_DIR = "/usr/local/gpuvs-nvidia"
# The driver's user-space libraries (what the toolkit mounts for the compute and utility capabilities).
DRIVER_LIBS = ("libcuda.so*", "libcudadebugger.so*", "libnvidia-ml.so*", "libnvidia-ptxjitcompiler.so*",
               "libnvidia-nvvm.so*", "libnvidia-gpucomp.so*", "libnvidia-allocator.so*", "libnvidia-cfg.so*",
               "libnvidia-opencl.so*", "libnvidia-pkcs11*.so*")
DRIVER_BINS = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
               "nvidia-cuda-mps-server")
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64", "/lib/x86_64-linux-gnu",
                   "/usr/lib/aarch64-linux-gnu", "/usr/lib/wsl/lib")


@dataclass
class GpuPlan:
    mode: str
    args: list[str] = field(default_factory=list)  # engine `run` arguments
    ld_library_path: list[str] = field(default_factory=list)  # folders to put first, inside
    path: list[str] = field(default_factory=list)  # folders to put first on PATH, inside
    notes: list[str] = field(default_factory=list)


def plan(mode: str, engine_name: str, device: str, runtimes: list[str] | None = None, dev_dir: str = "/dev",
         driver_dir: str | None = None) -> GpuPlan:
    """The GPU access for one run. Raises UsageError for a contradiction in what was asked, and
    EnvironmentUnavailable (one line saying what is missing) where this host cannot provide it."""
    if mode not in MODES:
        raise UsageError(f"--gpus {mode!r}: use one of {', '.join(MODES)}")
    cuda = device.split(":")[0] == "cuda"
    if mode == "none" or (mode == "auto" and not cuda):
        if cuda:
            raise UsageError(f"device {device} asked for with --gpus none: the container would see no GPU")
        return GpuPlan("none")
    if mode == "auto":
        if engine_name == "docker" and toolkit_installed(runtimes):
            mode = "toolkit"
        elif cdi_spec():
            mode = "cdi"
        else:
            mode = "devices"
    if mode == "toolkit":
        if engine_name != "docker":
            raise UsageError("--gpus toolkit is docker's (--gpus all with the NVIDIA container toolkit); "
                             "with podman use --gpus cdi or --gpus devices")
        if not toolkit_installed(runtimes):
            raise EnvironmentUnavailable("--gpus toolkit: the NVIDIA container toolkit is not installed here "
                                         "(no nvidia-container-runtime-hook or nvidia runtime in docker info); "
                                         "use --gpus devices")
        return GpuPlan("toolkit", ["--gpus", "all"], notes=["docker --gpus all (NVIDIA container toolkit)"])
    if mode == "cdi":
        spec = cdi_spec()
        if not spec:
            raise EnvironmentUnavailable(f"--gpus cdi: no CDI spec for nvidia.com/gpu in {' or '.join(CDI_DIRS)} "
                                         "(create one: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml), "
                                         "or use --gpus devices")
        return GpuPlan("cdi", ["--device", "nvidia.com/gpu=all"], notes=[f"CDI spec {spec}"])
    return devices_plan(dev_dir, driver_dir)


def devices_plan(dev_dir: str = "/dev", driver_dir: str | None = None,
                 lib_dirs: tuple[str, ...] | None = None) -> GpuPlan:
    nodes = device_nodes(dev_dir)
    names = {os.path.basename(n) for n in nodes}
    if "nvidiactl" not in names:
        raise EnvironmentUnavailable(f"--gpus devices: {dev_dir}/nvidiactl is missing on this host: "
                                     "is the NVIDIA driver loaded?")
    if not any(re.fullmatch(r"nvidia\d+", n) for n in names):
        raise EnvironmentUnavailable(f"--gpus devices: no {dev_dir}/nvidia0 (or other GPU node) on this host")
    if "nvidia-uvm" not in names:
        raise EnvironmentUnavailable(f"--gpus devices: {dev_dir}/nvidia-uvm is missing (CUDA needs it; "
                                     "nvidia-modprobe -u -c=0 creates it)")
    gp = GpuPlan("devices")
    for node in nodes:
        gp.args += ["--device", f"{node}:/dev/{os.path.relpath(node, dev_dir)}"]
    root, libs, dedicated = find_driver(driver_dir, lib_dirs)
    if dedicated:
        gp.args += ["-v", f"{root}:{root}:ro"]
        gp.ld_library_path = [d for d in (f"{root}/lib64", f"{root}/lib") if os.path.isdir(d)] or [root]
        if os.path.isdir(f"{root}/bin"):
            gp.path = [f"{root}/bin"]
        gp.notes.append(f"driver folder {root} mounted read-only")
    else:
        for lib in libs:
            gp.args += ["-v", f"{os.path.realpath(lib)}:{INSIDE_DIR}/lib64/{os.path.basename(lib)}:ro"]
        gp.ld_library_path = [f"{INSIDE_DIR}/lib64"]
        bins = [b for b in (shutil.which(n) for n in DRIVER_BINS) if b]
        for b in bins:
            gp.args += ["-v", f"{os.path.realpath(b)}:{INSIDE_DIR}/bin/{os.path.basename(b)}:ro"]
        if bins:
            gp.path = [f"{INSIDE_DIR}/bin"]
        gp.notes.append(f"{len(libs)} driver libraries from {root} mounted read-only at {INSIDE_DIR}/lib64")
    gp.notes.insert(0, f"device nodes: {', '.join(nodes)}")
    return gp


def device_nodes(dev_dir: str = "/dev") -> list[str]:
    """The NVIDIA device nodes a CUDA process uses: nvidiactl, nvidia-uvm(-tools), nvidia-modeset,
    every nvidiaN, and nvidia-caps/* (MIG)."""
    out = []
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        if os.path.exists(f"{dev_dir}/{name}"):
            out.append(f"{dev_dir}/{name}")
    gpus = [p for p in glob.glob(f"{dev_dir}/nvidia[0-9]*") if re.fullmatch(r"nvidia\d+", os.path.basename(p))]
    out += sorted(gpus, key=lambda p: int(os.path.basename(p)[6:]))
    out += sorted(glob.glob(f"{dev_dir}/nvidia-caps/*"))
    return out


def find_driver(driver_dir: str | None = None, lib_dirs: tuple[str, ...] | None = None
                ) -> tuple[str, list[str], bool]:
    """(folder, library files, dedicated?). A dedicated folder (GPUVS_NVIDIA_DRIVER_DIR, /usr/local/nvidia)
    is mounted whole; a system library folder (from ldconfig, else lib_dirs) gives its driver files only."""
    explicit = driver_dir or (None if lib_dirs else os.environ.get("GPUVS_NVIDIA_DRIVER_DIR"))
    candidates = [explicit] if explicit else ([] if lib_dirs else ["/usr/local/nvidia"])
    for root in candidates:
        for sub in ("lib64", "lib", ""):
            lib = os.path.join(root, sub, "libcuda.so.1")
            if os.path.exists(lib):
                return root.rstrip("/") or "/", [lib], True
        if explicit:
            raise EnvironmentUnavailable(f"GPUVS_NVIDIA_DRIVER_DIR={root}: no libcuda.so.1 in it, its lib64 or lib")
    folder = (None if lib_dirs else ldconfig_dir("libcuda.so.1")) or next(
        (d for d in (lib_dirs or SYSTEM_LIB_DIRS) if os.path.exists(f"{d}/libcuda.so.1")), None)
    if not folder:
        raise EnvironmentUnavailable("--gpus devices: the NVIDIA driver's libcuda.so.1 was not found (ldconfig -p, "
                                     "/usr/local/nvidia); set GPUVS_NVIDIA_DRIVER_DIR to the driver's folder")
    libs = sorted({p for pattern in DRIVER_LIBS for p in glob.glob(f"{folder}/{pattern}")})
    return folder, libs, False


def ldconfig_dir(soname: str) -> str | None:
    exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith(soname + " ") and "=>" in line and ("x86-64" in line or "AArch64" in line
                                                                   or "64bit" in line):
            return os.path.dirname(line.split("=>", 1)[1].strip())
    return None


def cdi_spec(dirs: tuple[str, ...] = CDI_DIRS) -> str | None:
    """A CDI spec file that declares nvidia.com/gpu devices, if any."""
    for d in dirs:
        for path in sorted(glob.glob(f"{d}/*.yaml") + glob.glob(f"{d}/*.json")):
            try:
                with open(path) as fh:
                    text = fh.read()
            except OSError:
                continue
            if "nvidia.com/gpu" in text or re.search(r"vendor:\s*nvidia\.com", text) and "class: gpu" in text:
                return path
    return None


def toolkit_installed(runtimes: list[str] | None = None) -> bool:
    if runtimes and "nvidia" in runtimes:
        return True
    return any(shutil.which(n) for n in ("nvidia-container-runtime-hook", "nvidia-container-toolkit",
                                          "nvidia-container-runtime"))
