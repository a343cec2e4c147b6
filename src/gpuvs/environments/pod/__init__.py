"""The pod environment: the same worker, in a Kubernetes pod, through the official client.

The pod runs `PYTHON -m gpuvs.trial.inside`, its spec in GPUVS_SPEC; gpuvs's package comes as a ConfigMap's zip.
It is labelled gpuvs=1 (trial_labels()), never privileged, and deleted on every exit path (docs/pod.md).
Everything the trial reports comes from the pod's log, status and events (podrun.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from gpuvs import __version__
from gpuvs.environments import register
from gpuvs.environments.environment import Environment, WorkerStream
from gpuvs.environments.container import CPUS, IMAGE, MEMORY, MOUNT, PYTHON, SHM_SIZE
from gpuvs.environments.host import ENV_VAR, env_vars
from gpuvs.errors import GpuvsError, UsageError
from gpuvs.probes.fingerprint import SOFTWARE_FIELDS
from gpuvs.kube import SLOW_TAINT, SLOW_TOLERATION
from gpuvs.kube import package as pkg
from gpuvs.params import Param
from gpuvs.spec import RunSpec, gpus_asked

PKG_DIR = "/gpuvs"  # not under /opt or /usr, which a --mount of the node's own may cover read-only
PKG_KEY = pkg.KEY
GPU_RESOURCE = "nvidia.com/gpu"
DEADLINE_EXTRA_S = 60  # activeDeadlineSeconds = trial timeout + the start-up waits + this
NO_TIMEOUT_DEADLINE_S = 24 * 3600
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(b|k|m|g|t|Ki|Mi|Gi|Ti|K|M|G|T)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
POD_SECURITY = ("baseline", "restricted")

PARAMS = (
    IMAGE,
    Param("image_pull_policy", str, None, "imagePullPolicy of the pod (default: the cluster's)",
          choices=("Always", "IfNotPresent", "Never")),
    Param("kubeconfig", str, None, "kubeconfig file (default: KUBECONFIG, ~/.kube/config, else in-cluster)"),
    Param("context", str, None, "kubeconfig context"),
    Param("namespace", str, None, "namespace (default: the context's, else default)"),
    Param("gpu_resource", str, GPU_RESOURCE, "resource name of a GPU in limits (another vendor, a MIG profile)"),
    CPUS,
    Param("cpu_request", float, None, "CPU request (default: the limit, when --cpus is given)", min=0.001),
    MEMORY,
    Param("memory_request", str, None, "memory request, e.g. 2g (default: the limit)"),
    Param("ephemeral_storage", str, None, "ephemeral-storage limit (writable layer, logs, emptyDirs), e.g. 10g"),
    SHM_SIZE,
    Param("node", str, None, "run on this node (a node selector on its host name)"),
    Param("bypass_scheduler", bool, False, "with --node: set the pod's nodeName, so that no scheduler is needed"),
    Param("node_selector", str, None, "node selector KEY=VALUE", multiple=True),
    Param("toleration", str, None, "toleration KEY[=VALUE][:EFFECT]", multiple=True),
    Param("runtime_class", str, None, "runtimeClassName of the pod (e.g. nvidia)"),
    Param("priority_class", str, None, "priorityClassName of the pod (gpuvs agent: gpuvs-trial, which any real job "
          "preempts; a preempted trial fails with that reason)"),
    Param("service_account", str, None, "service account of the pod (default: none mounted)"),
    Param("label", str, None, "extra pod label KEY=VALUE", multiple=True),
    Param("pod_security", str, "baseline", "the pod's security context: baseline (the image's own user, root in "
          "most GPU images; no privilege escalation, every capability dropped, RuntimeDefault seccomp) or restricted "
          "(also runAsNonRoot: the restricted Pod Security Standard; the image's user must be a non-root uid, or "
          "give --run-as-user)", choices=POD_SECURITY),
    Param("run_as_user", int, None, "run the container as this uid (runAsUser), e.g. for an image whose user is "
          "root or a name under --pod-security restricted", min=0),
    Param("cap_add", str, None, "a Linux capability to give the container (none by default: all are dropped)",
          multiple=True),
    Param("host_network", bool, False, "run the pod in the node's network namespace (off by default)"),
    MOUNT,
    ENV_VAR,
    PYTHON,
    Param("package", str, "configmap", "how gpuvs reaches the pod: configmap (a zip on PYTHONPATH) or image "
          "(installed in the image)", choices=("configmap", "image")),
    Param("schedule_timeout", float, 30.0, "seconds a pod may stay unschedulable before the trial fails", min=0.1),
    Param("start_timeout", float, 300.0, "seconds from creation to a running container (image pull included)",
          min=0.1),
    Param("num_nodes", int, 1, "run one trial as N pods, one per node (a workload of one process per device: "
          "collective, cnn-train), each with --num-gpus ranks, torch.distributed across them (NCCL on GPUs, gloo on "
          "the CPU); the first pod's figures are the trial's", min=1, max=1024),
    Param("gang_nodes", str, None, "with --num-nodes: place the pods only on these nodes (comma-separated; a "
          "required node affinity, kubernetes.io/hostname In the names; gpuvs fleet --pairs pins each pair so)",
          multiple=True),
    Param("node_lost_timeout", float, 60.0, "seconds the pod's node may be not Ready (or the API server silent) "
          "before the trial fails",
          min=0.1),
)


@dataclass
class PodSettings:
    """The pod options of one run, checked (no cluster needed)."""

    image: str
    pull_policy: str | None = None
    gpu_resource: str = GPU_RESOURCE
    limits: dict[str, str] = field(default_factory=dict)  # cpu, memory
    requests: dict[str, str] = field(default_factory=dict)
    shm_size: str | None = None
    node: str | None = None
    bypass_scheduler: bool = False
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    runtime_class: str | None = None
    priority_class: str | None = None
    service_account: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    pod_security: str = "baseline"
    run_as_user: int | None = None
    cap_add: list[str] = field(default_factory=list)
    host_network: bool = False
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)  # (node path, path inside, read-only)
    env_vars: dict[str, str] = field(default_factory=dict)
    python: str = "python3"
    package: str = "configmap"
    schedule_timeout: float = 30.0
    start_timeout: float = 300.0
    node_lost_timeout: float = 60.0
    num_nodes: int = 1
    gang_nodes: list[str] = field(default_factory=list)  # with num_nodes: only these nodes (node affinity In)
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    memory: str | None = None  # --memory as given (the limit's quantity is in limits)


def quantity(option: str, value: Any) -> str:
    """A memory size as a Kubernetes quantity: 4g / 4G -> 4Gi (as for a container: one letter is binary),
    Ki/Mi/Gi/Ti and plain bytes as given."""
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise UsageError(f"--{option.replace('_', '-')}: {value!r} is not a size; expected e.g. 512m, 4g, 4Gi")
    number, unit = m.groups()
    if unit is None or unit == "b":
        return number
    return number + (unit if len(unit) == 2 else unit.upper() + "i")


def _kv(option: str, items: Any, key_re: re.Pattern, value_re: re.Pattern) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = str(item).partition("=")
        if not sep or not key_re.match(key) or not value_re.match(value):
            raise UsageError(f"--{option.replace('_', '-')}: expected KEY=VALUE with a Kubernetes label key and "
                             f"value (letters, digits, - _ ., at most 63), got {item!r}")
        out[key] = value
    return out


def toleration(item: str) -> dict[str, str]:
    """KEY[=VALUE][:EFFECT] as a toleration (without VALUE: operator Exists)."""
    rest, sep, effect = str(item).rpartition(":") if ":" in str(item) else (str(item), "", "")
    if sep and effect not in EFFECTS:
        raise UsageError(f"--toleration {item}: the effect must be one of {', '.join(EFFECTS)}")
    key, eq, value = rest.partition("=")
    if not key or not _LABEL_KEY.match(key) or (eq and not _LABEL_VALUE.match(value)):
        raise UsageError(f"--toleration: expected KEY[=VALUE][:EFFECT], got {item!r}")
    out = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def parse_options(options: dict[str, Any]) -> PodSettings:
    """Check every pod option before anything talks to a cluster."""
    image = options.get("image")
    if not image:
        raise UsageError("--env pod needs --image IMAGE (an image with Python 3.10+ and the workload's framework)")
    s = PodSettings(image=str(image), pull_policy=options.get("image_pull_policy") or None,
                    gpu_resource=str(options.get("gpu_resource") or GPU_RESOURCE),
                    node=options.get("node") or None, runtime_class=options.get("runtime_class") or None,
                    priority_class=options.get("priority_class") or None,
                    service_account=options.get("service_account") or None, python=options.get("python") or "python3",
                    package=str(options.get("package") or "configmap"),
                    bypass_scheduler=bool(options.get("bypass_scheduler")),
                    host_network=bool(options.get("host_network")), kubeconfig=options.get("kubeconfig") or None,
                    context=options.get("context") or None, namespace=options.get("namespace") or None,
                    memory=options.get("memory") or None)
    for key in ("schedule_timeout", "start_timeout", "node_lost_timeout"):
        if options.get(key) is not None:
            setattr(s, key, float(options[key]))
    if not _LABEL_KEY.match(s.gpu_resource) or "/" not in s.gpu_resource:
        raise UsageError(f"--gpu-resource {s.gpu_resource}: expected an extended resource name like "
                         f"{GPU_RESOURCE} or nvidia.com/mig-1g.10gb")
    if options.get("cpus") is not None:
        s.limits["cpu"] = f"{float(options['cpus']):g}"
    if options.get("memory"):
        s.limits["memory"] = quantity("memory", options["memory"])
    if options.get("ephemeral_storage"):
        s.limits["ephemeral-storage"] = quantity("ephemeral_storage", options["ephemeral_storage"])
    if options.get("cpu_request") is not None:
        s.requests["cpu"] = f"{float(options['cpu_request']):g}"
    if options.get("memory_request"):
        s.requests["memory"] = quantity("memory_request", options["memory_request"])
    if options.get("shm_size"):
        s.shm_size = quantity("shm_size", options["shm_size"])
    for name in (s.node, s.runtime_class, s.service_account, s.priority_class):
        if name is not None and not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name):
            raise UsageError(f"{name!r} is not a Kubernetes object name (lower-case letters, digits, - and .)")
    if options.get("num_nodes") is not None:
        s.num_nodes = int(options["num_nodes"])
    if s.num_nodes > 1 and (s.node or s.bypass_scheduler):
        raise UsageError(f"--num-nodes {s.num_nodes} places one pod on each of {s.num_nodes} nodes: it cannot be "
                         "given with --node or --bypass-scheduler (one node); use --node-selector to choose among nodes")
    s.gang_nodes = [n.strip() for item in options.get("gang_nodes") or [] for n in str(item).split(",") if n.strip()]
    for name in s.gang_nodes:
        if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name):
            raise UsageError(f"--gang-nodes: {name!r} is not a Kubernetes node name (lower-case letters, digits, - and .)")
    if s.gang_nodes and len(s.gang_nodes) < s.num_nodes:
        raise UsageError(f"--gang-nodes names {len(s.gang_nodes)} node(s): --num-nodes {s.num_nodes} needs at least "
                         f"{s.num_nodes} (one pod per node)")
    if s.bypass_scheduler and not s.node:
        raise UsageError("--bypass-scheduler needs --node NAME (the node the pod is bound to)")
    s.node_selector = _kv("node_selector", options.get("node_selector"), _LABEL_KEY, _LABEL_VALUE)
    s.tolerations = [toleration(t) for t in options.get("toleration") or []]
    if not any(t.get("key") == SLOW_TAINT for t in s.tolerations):  # a node gpuvs tainted slow is measured again
        s.tolerations.append(dict(SLOW_TOLERATION))
    s.labels = _kv("label", options.get("label"), _LABEL_KEY, _LABEL_VALUE)
    if any(k == "gpuvs" or k.startswith("gpuvs.") or k in OWN_APP_LABELS for k in s.labels):
        raise UsageError("--label: the gpuvs, gpuvs.*, gpuvs.io/* and app.kubernetes.io/{name,component,managed-by,"
                         "version} labels are set by gpuvs itself")
    for cap in options.get("cap_add") or []:
        if not re.match(r"^(CAP_)?[A-Z_]+$", str(cap)):
            raise UsageError(f"--cap-add {cap}: expected a capability name like SYS_PTRACE")
        s.cap_add.append(str(cap).removeprefix("CAP_"))
    for item in options.get("mount") or []:
        parts = str(item).split(":")
        if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]) or \
                (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise UsageError(f"--mount: expected NODE_PATH:PATH_INSIDE[:ro|rw] with absolute paths, got {item!r}")
        s.mounts.append((parts[0], parts[1], len(parts) == 3 and parts[2] == "ro"))
    s.env_vars = env_vars(options.get("env_var"))
    s.pod_security = str(options.get("pod_security") or "baseline")
    if s.pod_security not in POD_SECURITY:
        raise UsageError(f"--pod-security {s.pod_security}: expected one of {', '.join(POD_SECURITY)}")
    if options.get("run_as_user") is not None:
        s.run_as_user = int(options["run_as_user"])
    if s.pod_security == "restricted":
        beyond = [f"--mount {m[0]}:{m[1]} (a hostPath volume)" for m in s.mounts]
        beyond += ["--host-network"] if s.host_network else []
        beyond += [f"--cap-add {c}" for c in s.cap_add if c != "NET_BIND_SERVICE"]
        beyond += ["--run-as-user 0"] if s.run_as_user == 0 else []
        if beyond:
            raise UsageError(f"--pod-security restricted forbids {', '.join(beyond)}: drop it, or give "
                             "--pod-security baseline")
    return s


def _label_value(text: str) -> str:
    """Any text as a label value: allowed characters only, at most 63, alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return value.strip("-_.")


def pod_name(spec: RunSpec) -> str:
    return f"gpuvs-{spec.run_id}"


def deadline_s(spec: RunSpec, s: PodSettings) -> int:
    trial = spec.timeout_s if spec.timeout_s else NO_TIMEOUT_DEADLINE_S
    return int(math.ceil(trial + s.schedule_timeout + s.start_timeout + DEADLINE_EXTRA_S))


# The trial pod's own labels. Until the release before this one they were gpuvs.run_id, gpuvs.arm and
# gpuvs.experiment (no domain prefix); gpuvs=1 stays as the mark every clean-up selector uses, so that pods of
# either release are found and removed (fleet/cluster/sweep.py's sweep also asks for the old experiment key).
RUN_ID, ARM, EXPERIMENT = "gpuvs.io/run-id", "gpuvs.io/arm", "gpuvs.io/experiment"
OLD_EXPERIMENT = "gpuvs.experiment"
OWN_APP_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/managed-by",
                  "app.kubernetes.io/version")


def trial_labels(spec: RunSpec) -> dict[str, str]:
    labels = {"gpuvs": "1", "app.kubernetes.io/name": "gpuvs", "app.kubernetes.io/component": "trial",
              "app.kubernetes.io/managed-by": "gpuvs", "app.kubernetes.io/version": _label_value(__version__),
              RUN_ID: spec.run_id, ARM: _label_value(spec.arm)}
    if spec.experiment_id:
        labels[EXPERIMENT] = _label_value(spec.experiment_id)
    return labels


def manifest(spec: RunSpec, s: PodSettings, package: bool = True) -> dict[str, Any]:
    """The pod of one run, as the API takes it (plain data: tested without a cluster)."""
    name = pod_name(spec)
    labels = {**s.labels, **trial_labels(spec)}
    limits = dict(s.limits)
    gpus = gpus_asked(spec)
    if gpus:
        limits[s.gpu_resource] = str(gpus)
    field_env = {"GPUVS_NODE_NAME": "spec.nodeName", "GPUVS_POD_NAME": "metadata.name",
                 "GPUVS_POD_NAMESPACE": "metadata.namespace"}
    env: list[dict[str, Any]] = [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field_env.items()]
    env += [{"name": "GPUVS_POD_CPU_LIMIT", "valueFrom": {"resourceFieldRef": {
                "containerName": "worker", "resource": "limits.cpu", "divisor": "1m"}}},
            {"name": "GPUVS_POD_MEMORY_LIMIT", "valueFrom": {"resourceFieldRef": {
                "containerName": "worker", "resource": "limits.memory", "divisor": "1Mi"}}}]
    plain = {"PYTHONUNBUFFERED": "1", "GPUVS_CONTAINER_IMAGE": s.image, "GPUVS_POD_GPUS": str(gpus),
             "GPUVS_POD_GPU_RESOURCE": s.gpu_resource}
    user_pp = s.env_vars.get("PYTHONPATH")
    if package:
        plain["PYTHONPATH"] = f"{PKG_DIR}/{PKG_KEY}" + (f":{user_pp}" if user_pp else "")
    plain.update({k: v for k, v in s.env_vars.items() if k not in plain})
    env += [{"name": k, "value": v} for k, v in plain.items()]
    env.append({"name": "GPUVS_SPEC", "value": spec.to_json()})  # a value, never a shell word
    security: dict[str, Any] = {"privileged": False, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}
    if s.cap_add:
        security["capabilities"]["add"] = list(s.cap_add)
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if s.pod_security == "restricted":
        pod_security["runAsNonRoot"] = True
    if s.run_as_user is not None:
        pod_security["runAsUser"] = s.run_as_user
    container: dict[str, Any] = {"name": "worker", "image": s.image, "command": [s.python, "-m", "gpuvs.trial.inside"],
                                 "env": env, "securityContext": security, "volumeMounts": []}
    if s.pull_policy:
        container["imagePullPolicy"] = s.pull_policy
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if s.requests:
        resources["requests"] = dict(s.requests)
    if resources:
        container["resources"] = resources
    volumes: list[dict[str, Any]] = []
    if package:
        volumes.append({"name": "gpuvs", "configMap": {"name": pkg.name(), "items": [{"key": PKG_KEY, "path": PKG_KEY}]}})
        container["volumeMounts"].append({"name": "gpuvs", "mountPath": PKG_DIR, "readOnly": True})
    for i, (src, dst, ro) in enumerate(s.mounts):
        volumes.append({"name": f"mount-{i}", "hostPath": {"path": src}})
        container["volumeMounts"].append({"name": f"mount-{i}", "mountPath": dst, "readOnly": ro})
    if s.shm_size:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": s.shm_size}})
        container["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never", "activeDeadlineSeconds": deadline_s(spec, s), "terminationGracePeriodSeconds": 5,
        "enableServiceLinks": False, "automountServiceAccountToken": bool(s.service_account),
        "securityContext": pod_security, "containers": [container], "volumes": volumes}
    selector = dict(s.node_selector)
    if s.node and s.bypass_scheduler:
        pod_spec["nodeName"] = s.node
    elif s.node:
        selector["kubernetes.io/hostname"] = s.node
    if selector:
        pod_spec["nodeSelector"] = selector
    if s.gang_nodes:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(s.gang_nodes)}]}]}}}
    if s.tolerations:
        pod_spec["tolerations"] = list(s.tolerations)
    if s.runtime_class:
        pod_spec["runtimeClassName"] = s.runtime_class
    if s.priority_class:
        pod_spec["priorityClassName"] = s.priority_class
    if s.service_account:
        pod_spec["serviceAccountName"] = s.service_account
    if s.host_network:
        pod_spec["hostNetwork"] = True
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": pod_spec}


@register
class PodEnvironment(Environment):
    kind = "pod"
    summary = "a Kubernetes pod (kubeconfig or in-cluster)"
    noun = "a pod"
    rank = 20
    params = PARAMS
    local = False
    gpus_where = "on the cluster's nodes"
    runs_bare = True
    fingerprint_fields = (("in_pod", "in a pod"), ("node_name", "node"), ("container_image", "image"))
    explains = {"env": ("*",), "image": SOFTWARE_FIELDS, "node": ("*",), "node_selector": ("*",),
                "gang_nodes": ("*",), "gpu_resource": ("gpu_count", "gpu_name")}
    fork_refusal = ("cannot hold a zygote: its trials' output would have to pass through the API server's exec "
                    "streams, with no way to hand a child its own pipes or to see its exit status first-hand")

    @classmethod
    def label(cls, options: dict[str, Any]) -> str:
        return ":".join(p for p in (cls.kind, options.get("image") or "") if p)

    @classmethod
    def parse_settings(cls, options: dict[str, Any]) -> PodSettings:
        return parse_options(options)

    def describe(self) -> str:
        return f"pod ({self.settings.image})"

    def cluster(self):
        from gpuvs.kube import client

        s = self.settings
        return client.connect(s.kubeconfig, s.context, s.namespace)

    def gpu_count(self) -> int | None:
        """GPUs allocatable on the node asked for, else on the largest node (None: the cluster cannot say)."""
        from gpuvs.kube import client

        try:
            s = self.settings
            cluster = self.cluster()
            nodes = [client.node_info(cluster, s.node)] if s.node else client.list_nodes(cluster)
        except GpuvsError:
            return None
        return max((client.allocatable(n, s.gpu_resource) for n in nodes), default=0) if nodes else None

    def check(self, spec: RunSpec) -> None:
        """Options, the cluster, namespace and node, then a server-side dry run of the pod itself: a limit,
        a quota or an admission rule the cluster refuses stops the run before any trial."""
        from gpuvs.kube import client

        s = self.settings
        if s.package == "configmap":
            pkg.check_size()
        _, _, index = spec.device.partition(":")
        if index and index != "0":
            raise UsageError(f"device {spec.device}: in a pod the GPUs are the ones the cluster gives it; use "
                             "--device cuda with --num-gpus N")
        cluster = self.cluster()
        client.check_namespace(cluster)
        if s.node:
            node = client.node_info(cluster, s.node)
            gpus = gpus_asked(spec)
            if gpus and client.allocatable(node, s.gpu_resource) < gpus:
                raise UsageError(f"--node {s.node} has {client.allocatable(node, s.gpu_resource)} allocatable "
                                 f"{s.gpu_resource}; {gpus} asked for")
        ApiException = client.client_module().client.exceptions.ApiException
        try:
            cluster.core.create_namespaced_pod(cluster.namespace, manifest(spec, s, s.package == "configmap"),
                                               dry_run="All", _request_timeout=30)
        except ApiException as exc:
            raise UsageError(f"the cluster refuses the pod ({cluster.namespace} on {cluster.host}): "
                             f"{client.api_message(exc)}") from None

    def launch(self, spec: RunSpec) -> WorkerStream:
        return self.start(spec)

    def start(self, spec: RunSpec, entry: tuple[str, ...] | None = None) -> WorkerStream:
        import time

        from gpuvs.environments.pod.podrun import PodLaunched, Waits

        s = self.settings
        cluster = self.cluster()
        body = manifest(spec, s, s.package == "configmap")
        if s.package == "configmap":  # one ConfigMap for every pod with this package (kube/package.py)
            pkg.ensure(cluster, deadline_s(spec, s))
        spec.launched_at = time.time()
        body["spec"]["containers"][0]["env"][-1]["value"] = spec.to_json()  # with the launch time
        if entry is not None:
            body["spec"]["containers"][0]["command"] = [s.python, *entry]
        waits = Waits(schedule=s.schedule_timeout, start=s.start_timeout, node_lost=s.node_lost_timeout)
        if s.num_nodes > 1:  # one pod per node, one worker stream (gang.py)
            from gpuvs.environments.pod import gang

            return gang.GangLaunched(cluster, gang.bodies(body, s.num_nodes, RUN_ID), waits,
                                     memory_limit=self.settings.memory, launched_at=spec.launched_at)
        return PodLaunched(cluster, body, waits, memory_limit=self.settings.memory,
                           launched_at=spec.launched_at)

    def start_bare(self, spec: RunSpec, argv: list[str], workdir: str | None):
        """Bare mode: the command is the pod's own process (kube/podjob.py), its output the pod's log."""
        import time

        from gpuvs.environments.pod.podjob import PodJob, bare_manifest
        from gpuvs.environments.pod.podrun import Waits

        s = self.settings
        cluster = self.cluster()
        spec.launched_at = time.time()
        body = bare_manifest(manifest(spec, s, package=False), argv, workdir)
        waits = Waits(schedule=s.schedule_timeout, start=s.start_timeout, node_lost=s.node_lost_timeout)
        return PodJob(cluster, body, waits, self.settings.memory, spec.launched_at)

    # -- gpuvs doctor ------------------------------------------------------------------------

    def doctor(self, spec: RunSpec, report, timeout: float) -> dict[str, Any] | None:
        from gpuvs.environments.pod.doctor import doctor

        return doctor(self, spec, report, timeout)

