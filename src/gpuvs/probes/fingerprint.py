"""Environment capture: what a result must carry so that two results can be compared honestly.
Works with no GPU, no NVML and no torch; every probe that fails leaves its field out."""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

from gpuvs import __version__

# Who took a fingerprint: gpuvs's worker where the job ran (every fingerprint take() makes), or gpuvs from outside
# (the command workload's bare mode, where the image has no Python: environments say what they could read).
TAKEN_INSIDE = "gpuvs's worker, inside"
# The image's own software, read from its files (software.py): dotted keys into the fingerprint's "software".
IMAGE_FIELDS = ("software.cuda", "software.cudnn", "software.frameworks")
# Fields whose difference between arms matters when the user did not ask to vary them.
KEY_FIELDS = ("gpu_name", "driver", "cuda", "torch", "cudnn", "cpu_model", "gpu_count") + IMAGE_FIELDS + (
    "software.driver_libs",)
# The key fields that come with the software of an image (not with the machine).
SOFTWARE_FIELDS = ("torch", "cuda", "cudnn") + IMAGE_FIELDS
# The key fields that come with the device a run is given: a CPU run in a pod without a GPU sees none.
DEVICE_FIELDS = ("gpu_name", "driver", "gpu_count")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_info() -> dict[str, Any]:
    model = None
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    mem_kib = None
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    return {"cpu_model": model or platform.processor() or None, "cpu_count": os.cpu_count(),
            "cpu_usable": usable, "memory_mib": mem_kib // 1024 if mem_kib else None}


def cgroup_limits(root: str = "/sys/fs/cgroup") -> dict[str, Any]:
    """CPU and memory limits as seen from inside (cgroup v2, else v1). None = unlimited."""
    out: dict[str, Any] = {}
    cpu_max = _read(f"{root}/cpu.max")
    if cpu_max is not None:
        out["cgroup"] = "v2"
        quota, _, period = cpu_max.partition(" ")
        out["cpu_limit"] = None if quota == "max" else round(int(quota) / int(period or 100000), 3)
        mem = _read(f"{root}/memory.max")
        out["memory_limit_mib"] = None if mem in (None, "max") else int(mem) // (1 << 20)
        out["cpuset"] = _read(f"{root}/cpuset.cpus.effective")
        pids = _read(f"{root}/pids.max")
        out["pids_limit"] = None if pids in (None, "max") else int(pids)
    else:
        quota = _read(f"{root}/cpu/cpu.cfs_quota_us") or _read(f"{root}/cpu,cpuacct/cpu.cfs_quota_us")
        period = _read(f"{root}/cpu/cpu.cfs_period_us") or _read(f"{root}/cpu,cpuacct/cpu.cfs_period_us")
        if quota is not None:
            out["cgroup"] = "v1"
            out["cpu_limit"] = None if int(quota) <= 0 else round(int(quota) / int(period or 100000), 3)
        mem = _read(f"{root}/memory/memory.limit_in_bytes")
        if mem is not None:
            out["memory_limit_mib"] = None if int(mem) >= (1 << 62) else int(mem) // (1 << 20)
    try:
        st = os.statvfs("/dev/shm")
        out["shm_mib"] = st.f_blocks * st.f_frsize // (1 << 20)
    except OSError:
        out["shm_mib"] = None
    return out


def rlimits(names: tuple[str, ...] = ("nofile", "nproc", "memlock", "stack")) -> dict[str, list[int | None]]:
    """This process's ulimits, [soft, hard], None = unlimited (a container's --ulimit shows here)."""
    import resource

    out = {}
    for name in names:
        soft, hard = resource.getrlimit(getattr(resource, f"RLIMIT_{name.upper()}"))
        out[name] = [None if v == resource.RLIM_INFINITY else v for v in (soft, hard)]
    return out


def container_info() -> dict[str, Any]:
    out: dict[str, Any] = {"in_container": False}
    containerenv = _read("/run/.containerenv")
    if containerenv is not None:
        out.update(in_container=True, engine="podman")
        for line in containerenv.splitlines():
            key, _, value = line.partition("=")
            if key in ("image", "name", "engine"):
                out[f"container_{key}"] = value.strip('"')
    elif os.path.exists("/.dockerenv"):
        out.update(in_container=True, engine="docker")
    if os.environ.get("GPUVS_CONTAINER_IMAGE"):
        out.update(in_container=True, container_image=os.environ["GPUVS_CONTAINER_IMAGE"])
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        out["in_pod"] = True
        out["pod_name"] = os.environ.get("HOSTNAME")
    if os.environ.get("GPUVS_POD_NAME"):  # set by gpuvs's pod environment (downward API)
        out.update(in_pod=True, pod_name=os.environ["GPUVS_POD_NAME"],
                   pod_namespace=os.environ.get("GPUVS_POD_NAMESPACE"), pod_limits=pod_limits(),
                   pod_process=process_security())
    out["node_name"] = os.environ.get("GPUVS_NODE_NAME") or os.environ.get("NODE_NAME") or socket.gethostname()
    return out


def process_security() -> dict[str, Any]:
    """What the worker runs as, from the kernel's own account (/proc/self/status): uid and gid, its effective
    capabilities (a hex mask, 0 when all are dropped), no_new_privs (allowPrivilegeEscalation false) and the
    seccomp mode (2: a filter, as RuntimeDefault sets)."""
    status = {}
    for line in (_read("/proc/self/status") or "").splitlines():
        key, _, value = line.partition(":")
        status[key] = value.split()
    number = lambda key: int(status[key][0]) if status.get(key) else None  # noqa: E731
    return {"uid": os.getuid(), "gid": os.getgid(), "cap_eff": (status.get("CapEff") or [None])[0],
            "no_new_privs": number("NoNewPrivs"), "seccomp": number("Seccomp")}


def pod_limits() -> dict[str, Any]:
    """The pod's limits as its container sees them (downward API): CPU in cores, memory in MiB (the node's
    allocatable where no limit was set), GPUs asked for and the resource name they were asked as."""
    def number(key: str) -> int | None:
        try:
            return int(os.environ[key])
        except (KeyError, ValueError):
            return None

    millis = number("GPUVS_POD_CPU_LIMIT")
    return {"cpu": None if millis is None else millis / 1000, "memory_mib": number("GPUVS_POD_MEMORY_LIMIT"),
            "gpus": number("GPUVS_POD_GPUS"), "gpu_resource": os.environ.get("GPUVS_POD_GPU_RESOURCE")}


def nvml_info() -> dict[str, Any]:
    """GPUs as NVML sees them. {'nvml': False, 'nvml_error': ...} where it is absent."""
    try:
        import pynvml
    except ImportError:
        return {"nvml": False, "nvml_error": "nvidia-ml-py is not installed", "gpus": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        return {"nvml": False, "nvml_error": str(exc) or type(exc).__name__, "gpus": []}
    try:
        gpus, refused = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            except Exception:  # a GPU of the machine this container was not handed (no device node): not ours
                refused.append(i)
                continue
            gpu = {"index": i, "name": _s(pynvml.nvmlDeviceGetName(h)), "uuid": _s(pynvml.nvmlDeviceGetUUID(h)),
                   "memory_mib": mem.total // (1 << 20)}
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                gpu["compute_capability"] = f"{major}.{minor}"
            except Exception:
                pass
            try:
                gpu["pci_bus_id"] = _s(pynvml.nvmlDeviceGetPciInfo(h).busId)
            except Exception:
                pass
            gpu.update(_limits(pynvml, h))
            gpus.append(gpu)
        info: dict[str, Any] = {"nvml": True, "gpus": gpus, "driver": _s(pynvml.nvmlSystemGetDriverVersion())}
        if refused:
            info["nvml_refused"] = refused
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion()
            info["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            pass
        return info
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _limits(pynvml: Any, h: Any) -> dict[str, Any]:
    """What a node can be misconfigured with: the enforced power limit, the top SM clock, the PCIe link
    it trained to (a degraded link shows as a lower generation or width). Fields NVML refuses are left out."""
    probes = {"power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
              "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
              "pcie_gen": lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
              "pcie_width": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)}
    out: dict[str, Any] = {}
    for key, probe in probes.items():
        try:
            out[key] = probe()
        except Exception:
            pass
    return out


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def framework_info(import_torch: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not import_torch and "torch" not in sys.modules:
        return out
    try:
        import torch
    except ImportError:
        out["torch"] = None
        return out
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["cuda_available"] = bool(torch.cuda.is_available())
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        out["cudnn"] = None
    try:  # the installed version, without importing it (that costs seconds where a job does not use it)
        from importlib.metadata import version

        out["torchvision"] = version("torchvision")
    except Exception:
        pass
    return out


def take(import_torch: bool = True) -> dict[str, Any]:
    """The whole fingerprint as one flat-ish dict (see KEY_FIELDS for the flat comparison keys)."""
    fp: dict[str, Any] = {"gpuvs": __version__, "taken_by": TAKEN_INSIDE, "python": platform.python_version(),
                          "os": f"{platform.system()} {platform.release()}", "hostname": socket.gethostname(),
                          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                          "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"), "pid": os.getpid()}
    fp.update(cpu_info())
    fp["limits"] = cgroup_limits()
    fp["limits"]["rlimits"] = rlimits()
    fp.update(container_info())
    fp.update(nvml_info())
    fp.update(framework_info(import_torch))
    try:
        from gpuvs.probes import software

        fp["software"] = software.here()
    except Exception as exc:  # a probe never fails a trial
        fp["software"] = {"error": f"{type(exc).__name__}: {exc}"}
    gpus = fp.get("gpus") or []
    fp["gpu_count"] = len(gpus)
    fp["gpu_name"] = gpus[0]["name"] if gpus else None
    return fp


def field(fp: dict[str, Any], key: str) -> Any:
    """A fingerprint field by its key; a dotted key reads nested dicts ("software.cuda")."""
    value: Any = fp
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def recorded(fp: dict[str, Any], key: str) -> bool:
    """Whether a fingerprint holds the field at all (None included: a probe that looked and found nothing, a GPU
    name where there is no GPU); a field its taker never looked at is absent."""
    value: Any = fp
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def differences(a: dict[str, Any], b: dict[str, Any], fields: tuple[str, ...] = KEY_FIELDS,
                recorded_only: bool = True) -> dict[str, tuple]:
    """Key fields that differ between two fingerprints: {field: (a, b)}. With `recorded_only`, only fields both
    recorded: a field one of them does not hold is not a difference (a fingerprint taken from outside, of a command
    run bare, holds fewer: no CPU model of a container's, no torch beside a job gpuvs did not import it for)."""
    return {f: (x, y) for f in fields if (x := field(a, f)) != (y := field(b, f))
            and not (recorded_only and not (recorded(a, f) and recorded(b, f)))}


def gpu_count() -> int:
    """GPUs this process can use: NVML first (cheap), the CUDA driver as a fallback (where NVML is not
    handed in, e.g. a container given only the compute libraries); 0 where neither sees one. No framework
    is imported: the command line asks this of every run, and a job that never uses PyTorch should not pay
    its import (seconds and about 500 MB) to learn there is no GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    info = nvml_info()
    if info.get("nvml"):
        count = len(info["gpus"])
        if visible is not None:
            count = min(count, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
        return count
    return cuda_driver_count()


def cuda_driver_count() -> int:
    """Devices the CUDA driver (libcuda) shows this process, as torch.cuda.device_count() would (it honours
    CUDA_VISIBLE_DEVICES); 0 where there is no driver or it fails to start."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        try:
            if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
                return 0
        except AttributeError:
            return 0
        return count.value
    return 0
