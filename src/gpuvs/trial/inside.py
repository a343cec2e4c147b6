"""What gpuvs runs inside a container: `python -m gpuvs.trial.inside` is the worker, as on the host.

When a GPU run fails, it checks whether the GPU is visible at all and says in one line what is missing.
`--probe` prints, as one JSON object, what `gpuvs doctor` reports from inside.
Standard library only up to the worker, so an image without numpy or torch still gets a clear answer."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import subprocess
import sys
from typing import Any

CUDA_ERRORS = {
    100: "no CUDA-capable device is detected (CUDA error 100)",
    101: "invalid device ordinal (CUDA error 101)",
    304: "an OS call failed (CUDA error 304): /proc is not remounted for the container's PID namespace",
    999: "unknown error (CUDA error 999)",
    3: "the driver could not be initialised (CUDA error 3)",
    35: "the driver is older than the CUDA runtime (CUDA error 35)",
}


def gpu_check() -> dict[str, Any]:
    """The GPU as this process sees it, without any framework: {'ok', 'problem', 'nodes', 'libcuda',
    'cuinit', 'count', 'names'}."""
    out: dict[str, Any] = {"nodes": sorted(glob.glob("/dev/nvidia*")), "ok": False}
    if "/dev/nvidiactl" not in out["nodes"]:
        out["problem"] = ("no /dev/nvidiactl inside the container: the GPU was not passed in "
                          "(gpuvs doctor --env container shows how GPU access was set up)")
        return out
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["libcuda"] = f"not loadable: {exc}"
        out["problem"] = (f"libcuda.so.1 cannot be loaded inside the container ({exc}): the driver's libraries "
                          f"are not mounted (LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')})")
        return out
    out["libcuda"] = getattr(lib, "_name", "libcuda.so.1")
    rc = lib.cuInit(0)
    out["cuinit"] = rc
    if rc != 0:
        out["problem"] = "cuInit failed inside the container: " + CUDA_ERRORS.get(rc, f"CUDA error {rc}")
        return out
    count = ctypes.c_int(0)
    lib.cuDeviceGetCount(ctypes.byref(count))
    out["count"] = count.value
    names = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        buf = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(dev), i) == 0 and lib.cuDeviceGetName(buf, 256, dev) == 0:
            names.append(buf.value.decode(errors="replace"))
    out["names"] = names
    if count.value == 0:
        out["problem"] = "the driver loads inside the container but reports no GPU"
        return out
    out["ok"] = True
    return out


def probe() -> dict[str, Any]:
    """Everything `gpuvs doctor` shows about the inside of a container."""
    import platform

    out: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable, "modules": {}}
    for name in ("numpy", "torch", "torchvision", "pynvml"):
        try:
            mod = __import__(name)
            out["modules"][name] = getattr(mod, "__version__", "present")
            if name == "torchvision":  # a torchvision built for another torch may import, yet lack its operators
                import torch

                torch.ops.torchvision.nms  # noqa: B018  (raises where the operator library did not load)
        except Exception as exc:  # ImportError, or a broken install
            out["modules"][name] = None
            out.setdefault("module_errors", {})[name] = f"{type(exc).__name__}: {exc}"[:300]
            if not isinstance(exc, ModuleNotFoundError) or exc.name != name:  # there, but cannot be loaded
                out.setdefault("modules_broken", []).append(name)
    out["gpu"] = gpu_check()
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            out["gpu"]["nvidia_smi"] = (r.stdout or r.stderr).strip()[:500]
        except (OSError, subprocess.TimeoutExpired) as exc:
            out["gpu"]["nvidia_smi"] = f"failed: {exc}"
    if out["modules"].get("torch"):
        import torch

        out["gpu"]["torch_cuda"] = bool(torch.cuda.is_available())
        if out["gpu"]["torch_cuda"]:
            out["gpu"]["torch_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    from gpuvs.probes import fingerprint  # standard library only

    out["limits"] = fingerprint.cgroup_limits()
    out["container"] = fingerprint.container_info()
    out["rlimits"] = fingerprint.rlimits()
    from gpuvs.probes import contention  # standard library only (pynvml where there)

    out["machine"] = contention.now()
    out["env"] = {k: os.environ.get(k) for k in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe(), default=str))
        return 0
    if sys.version_info < (3, 10):
        message = (f"the container's Python is {sys.version.split()[0]} ({sys.executable}); gpuvs needs 3.10 or "
                   "newer inside: use another image, or --python PATH")
        print(json.dumps({"type": "error", "kind": "unavailable", "message": message}), flush=True)
        return 4
    keep = os.dup(1)  # the protocol stream; the worker sends fd 1 to stderr
    from gpuvs.trial import worker

    code = worker.main(argv)
    if code in (0, 130):
        return code
    try:
        device = json.loads(os.environ.get("GPUVS_SPEC") or "{}").get("device", "")
    except ValueError:
        device = ""
    if str(device).startswith("cuda"):
        check = gpu_check()
        if not check["ok"]:
            from gpuvs import events
            from gpuvs.errors import EXIT_CODES

            os.write(keep, (events.encode(events.error("unavailable", "GPU not visible inside the container: "
                                                       + check["problem"])) + "\n").encode())
            return EXIT_CODES["unavailable"]
    return code


if __name__ == "__main__":
    sys.exit(main())
