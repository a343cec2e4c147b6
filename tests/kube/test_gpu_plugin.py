"""The device-plugin fixture (tests/fixtures/gpu_device_plugin/plugin.py) over real gRPC on unix sockets.

A registration server stands where the kubelet's is; the cluster tests run it against real kubelets.
What it registers, and what Allocate answers in fake and --real mode and with replicas.
It registers again when the kubelet's folder is wiped, and SIGTERM removes its socket."""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from conftest import ROOT, missing_part

HERE = ROOT / "tests" / "fixtures" / "gpu_device_plugin"
sys.path.insert(0, str(HERE))
import deviceplugin_pb2 as pb  # noqa: E402
import deviceplugin_pb2_grpc as pb_grpc  # noqa: E402

GPUS = sorted(p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p))


class Kubelet(pb_grpc.RegistrationServicer):
    """The kubelet's Registration service on <folder>/kubelet.sock."""

    def __init__(self, folder: Path):
        self.folder, self.requests = folder, []
        self.server = None
        self.start()

    def start(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.folder / 'kubelet.sock'}")
        self.server.start()

    def Register(self, request, context):
        self.requests.append(request)
        return pb.Empty()

    def wait(self, n: int, timeout: float = 20) -> pb.RegisterRequest:
        deadline = time.monotonic() + timeout
        while len(self.requests) < n:
            assert time.monotonic() < deadline, f"no registration #{n}"
            time.sleep(0.05)
        return self.requests[n - 1]

    def restart(self):
        """What a kubelet restart does to the folder: everything removed, kubelet.sock made again."""
        self.server.stop(None).wait()
        for f in self.folder.iterdir():
            f.unlink()
        self.start()


def plugin(folder: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "plugin.py"), "--dir", str(folder), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stub(folder: Path, endpoint: str) -> pb_grpc.DevicePluginStub:
    return pb_grpc.DevicePluginStub(grpc.insecure_channel(f"unix://{folder / endpoint}"))


def test_fake_devices_allocate_and_register_again_after_a_kubelet_restart(tmp_path):
    kubelet = Kubelet(tmp_path)
    p = plugin(tmp_path, "--count", "3")
    try:
        req = kubelet.wait(1)
        assert (req.version, req.resource_name) == ("v1beta1", "nvidia.com/gpu")
        ids = [d.ID for d in next(stub(tmp_path, req.endpoint).ListAndWatch(pb.Empty())).devices]
        assert ids == ["fake-gpu-0", "fake-gpu-1", "fake-gpu-2"]
        answer = stub(tmp_path, req.endpoint).Allocate(pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devicesIDs=["fake-gpu-2", "fake-gpu-0"])]))
        c = answer.container_responses[0]
        assert dict(c.envs) == {"NVIDIA_VISIBLE_DEVICES": "fake-gpu-2,fake-gpu-0",
                                "CUDA_VISIBLE_DEVICES": "fake-gpu-2,fake-gpu-0"}
        assert [(d.container_path, d.host_path) for d in c.devices] == [("/dev/nvidia2", "/dev/null"),
                                                                        ("/dev/nvidia0", "/dev/null")]
        with pytest.raises(grpc.RpcError) as err:
            stub(tmp_path, req.endpoint).Allocate(pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devicesIDs=["fake-gpu-9"])]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        kubelet.restart()
        again = kubelet.wait(2)
        assert again.endpoint == req.endpoint and (tmp_path / req.endpoint).exists()
    finally:
        p.terminate()
        out = p.communicate(timeout=20)[0]
        kubelet.server.stop(None)
    assert p.returncode == 0 and "stopped" in out
    assert not (tmp_path / req.endpoint).exists()  # its socket goes with it


def test_replicas_advertise_each_device_r_times_and_hand_the_physical_one(tmp_path):
    """--replicas 2, as a time-slicing device plugin: four IDs for two devices; replicas of one device asked
    together give that device once; replicas of different devices give both."""
    kubelet = Kubelet(tmp_path)
    p = plugin(tmp_path, "--count", "2", "--replicas", "2")
    try:
        req = kubelet.wait(1)
        s = stub(tmp_path, req.endpoint)
        ids = [d.ID for d in next(s.ListAndWatch(pb.Empty())).devices]
        assert ids == ["fake-gpu-0::0", "fake-gpu-0::1", "fake-gpu-1::0", "fake-gpu-1::1"]

        def allocate(*asked):
            c = s.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devicesIDs=asked)]))
            c = c.container_responses[0]
            return c.envs["NVIDIA_VISIBLE_DEVICES"], [d.container_path for d in c.devices]

        # two pods given one replica each of the same device see the same device
        assert allocate("fake-gpu-1::0") == allocate("fake-gpu-1::1") == ("fake-gpu-1", ["/dev/nvidia1"])
        assert allocate("fake-gpu-0::1", "fake-gpu-0::0") == ("fake-gpu-0", ["/dev/nvidia0"])
        assert allocate("fake-gpu-1::1", "fake-gpu-0::0", "fake-gpu-1::0") == (
            "fake-gpu-1,fake-gpu-0", ["/dev/nvidia1", "/dev/nvidia0"])
        with pytest.raises(grpc.RpcError) as err:
            allocate("fake-gpu-0")  # the plain ID is not advertised under replicas
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        p.terminate()
        out = p.communicate(timeout=20)[0]
        kubelet.server.stop(None)
    assert "registered 4 x nvidia.com/gpu" in out and "(2 devices x 2 replicas)" in out
    r = subprocess.run([sys.executable, str(HERE / "plugin.py"), "--dir", str(tmp_path), "--replicas", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "gpu-plugin: --replicas must be 1 or more"


@pytest.mark.skipif(bool(GPUS), reason="this machine has GPUs: the --real test below runs instead")
def test_real_mode_without_a_gpu_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(HERE / "plugin.py"), "--dir", str(tmp_path), "--real"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "gpu-plugin: --real: no /dev/nvidia<N> on this machine"


@pytest.mark.gpu
@pytest.mark.skipif(not GPUS, reason="no /dev/nvidia<N> here")
def test_real_mode_hands_the_gpu_nodes_and_driver_files(tmp_path):
    kubelet = Kubelet(tmp_path)
    p = plugin(tmp_path, "--real")
    try:
        req = kubelet.wait(1)
        ids = [d.ID for d in next(stub(tmp_path, req.endpoint).ListAndWatch(pb.Empty())).devices]
        assert len(ids) == len(GPUS)
        c = stub(tmp_path, req.endpoint).Allocate(pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devicesIDs=[ids[0]])])).container_responses[0]
        nodes = [d.host_path for d in c.devices]
        assert nodes[0] in GPUS and "/dev/nvidiactl" in nodes and not set(nodes) & (set(GPUS) - {nodes[0]})
        mounts = [m.host_path for m in c.mounts]
        assert any("libcuda.so" in m for m in mounts) and all(m.read_only for m in c.mounts)
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == ids[0]
    finally:
        p.terminate()
        p.communicate(timeout=20)
        kubelet.server.stop(None)


@pytest.mark.skipif(bool(GPUS), reason="this machine has GPUs: NVML would name the devices by UUID")
def test_only_keeps_the_gpus_of_the_given_minors():
    """--real --only, as the GPU cluster kit gives each kubelet its own GPU: in a mount namespace whose /dev holds
    real character devices of the NVIDIA driver's major (195) for minors 0, 3 and 12 (no driver behind them, so
    no NVML: the IDs are the device nodes' names), only the named minors are handed out, in numeric order."""
    if shutil.which("unshare") is None or shutil.which("mknod") is None:
        missing_part("unshare and mknod (util-linux, coreutils)")
    nodes = " && ".join(f"mknod /dev/nvidia{m} c 195 {m}" for m in (0, 3, 12))
    script = (f"mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && {nodes} && mknod /dev/nvidiactl c 195 255"
              f" && exec {sys.executable} {HERE / 'plugin.py'} --real --list --only 12 --only 3")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0 and "unshare failed" in r.stderr:
        missing_part(f"a private mount namespace (unshare -m): {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["nvidia3 /dev/nvidia3", "nvidia12 /dev/nvidia12"]
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script.replace("--only 3", "--only 5")
                        .replace("--only 12 ", "")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().endswith("gpu-plugin: --real: no /dev/nvidia<N> among "
                                                           "/dev/nvidia5 on this machine")


def test_only_without_real_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(HERE / "plugin.py"), "--dir", str(tmp_path), "--only", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "gpu-plugin: --only applies to --real (the machine's GPUs)"
