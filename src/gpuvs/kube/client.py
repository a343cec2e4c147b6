"""A connection to a Kubernetes cluster through the official `kubernetes` client.

A kubeconfig (a file, KUBECONFIG, ~/.kube/config) with an optional context, or the in-cluster service account.
Every way of not reaching the cluster becomes one UsageError line: bad input, nothing started.
The client is imported here only, and only when a pod environment is used."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from gpuvs.errors import UsageError

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_CACHE: dict[tuple, "Cluster"] = {}
_LOCK = threading.Lock()


def client_module():
    try:
        import kubernetes
    except ImportError:
        raise UsageError("--env pod needs the kubernetes Python client: pip install kubernetes") from None
    return kubernetes


@dataclass
class Cluster:
    """An API client, the namespace gpuvs works in, and where it came from (for messages)."""

    api: Any  # kubernetes.client.ApiClient
    core: Any  # kubernetes.client.CoreV1Api
    namespace: str
    source: str  # "kubeconfig PATH (context C)" or "in-cluster service account"
    host: str

    def authz(self):
        return client_module().client.AuthorizationV1Api(self.api)


def api_message(exc: BaseException) -> str:
    """The API server's own message of an ApiException (its JSON Status), else the exception's text."""
    body = getattr(exc, "body", None)
    if body:
        try:
            data = json.loads(body)
            if isinstance(data, dict) and data.get("message"):
                return str(data["message"])
        except (TypeError, ValueError):
            pass
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status:
        return f"{status} {reason or ''}".strip()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(os.path.join(SA_DIR, "token"))


def connect(kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None,
            timeout: float = 10.0) -> Cluster:
    """A checked connection (the API answered /version within `timeout`), cached per process."""
    key = (kubeconfig, context, namespace, os.environ.get("KUBECONFIG"))
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    k8s = client_module()
    cfg = k8s.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    default_ns = "default"
    if kubeconfig is None and not os.path.exists(path.split(os.pathsep)[0]) and _in_cluster():
        k8s.config.load_incluster_config(client_configuration=cfg)
        source = "in-cluster service account"
        try:
            with open(os.path.join(SA_DIR, "namespace")) as f:
                default_ns = f.read().strip() or default_ns
        except OSError:
            pass
    else:
        if kubeconfig and not os.path.isfile(kubeconfig):
            raise UsageError(f"--kubeconfig {kubeconfig}: no such file")
        if not kubeconfig and not any(os.path.isfile(p) for p in path.split(os.pathsep)):
            raise UsageError(f"no cluster: no kubeconfig at {path} and gpuvs is not running in a pod; give "
                             "--kubeconfig PATH (or set KUBECONFIG)")
        try:
            k8s.config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
            contexts, active = k8s.config.list_kube_config_contexts(config_file=path)
        except k8s.config.ConfigException as exc:
            raise UsageError(f"kubeconfig {path}{f' (context {context})' if context else ''}: "
                             f"{str(exc).splitlines()[0]}") from None
        except Exception as exc:  # a file that is not YAML, a missing certificate file, ...
            raise UsageError(f"kubeconfig {path} cannot be used: {type(exc).__name__}: "
                             f"{(str(exc).splitlines() or [''])[0]}") from None
        chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
        default_ns = ((chosen or {}).get("context") or {}).get("namespace") or default_ns
        source = f"kubeconfig {path} (context {(chosen or {}).get('name')})"
    cfg.retries = 1
    api = k8s.client.ApiClient(cfg)
    cluster = Cluster(api=api, core=k8s.client.CoreV1Api(api), namespace=namespace or default_ns, source=source,
                      host=cfg.host)
    try:
        k8s.client.VersionApi(api).get_code(_request_timeout=timeout)
    except k8s.client.exceptions.ApiException as exc:
        if exc.status in (401, 403):
            raise UsageError(f"the cluster at {cfg.host} refused gpuvs's credentials from {source}: "
                             f"{api_message(exc)}") from None
        raise UsageError(f"the cluster at {cfg.host} answered {api_message(exc)}") from None
    except Exception as exc:  # connection refused, TLS, DNS, timeout
        reason = str(getattr(exc, "reason", "") or exc).splitlines()[0][:200]
        raise UsageError(f"no cluster reachable at {cfg.host} ({source}): {reason}") from None
    with _LOCK:
        _CACHE[key] = cluster
    return cluster


def forget() -> None:
    """Drop the cached connections: the next connect() reaches the cluster afresh (a long-lived caller, after the
    API server was unreachable)."""
    with _LOCK:
        _CACHE.clear()


def check_namespace(cluster: Cluster) -> None:
    """UsageError for a namespace that does not exist (a user who may not read namespaces is let through:
    creating the pod will then say)."""
    ApiException = client_module().client.exceptions.ApiException
    try:
        cluster.core.read_namespace(cluster.namespace, _request_timeout=10)
    except ApiException as exc:
        if exc.status == 404:
            raise UsageError(f"--namespace {cluster.namespace}: no such namespace on {cluster.host}") from None
        if exc.status != 403:
            raise UsageError(f"namespace {cluster.namespace}: {api_message(exc)}") from None


def node_info(cluster: Cluster, name: str) -> Any:
    ApiException = client_module().client.exceptions.ApiException
    try:
        return cluster.core.read_node(name, _request_timeout=10)
    except ApiException as exc:
        if exc.status == 404:
            nodes = ", ".join(n.metadata.name for n in list_nodes(cluster)) or "none"
            raise UsageError(f"--node {name}: no such node (nodes: {nodes})") from None
        raise UsageError(f"--node {name}: {api_message(exc)}") from None


def list_nodes(cluster: Cluster) -> list[Any]:
    try:
        return list(cluster.core.list_node(_request_timeout=10).items)
    except Exception:  # no permission to list nodes: callers say what they could not see
        return []


def allocatable(node: Any, resource: str) -> int:
    value = ((node.status and node.status.allocatable) or {}).get(resource)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def can_i(cluster: Cluster, verb: str, resource: str, subresource: str | None = None) -> bool | None:
    """SelfSubjectAccessReview: may gpuvs do this in its namespace? None when the question itself failed."""
    k8s = client_module()
    attrs = k8s.client.V1ResourceAttributes(namespace=cluster.namespace, verb=verb, resource=resource,
                                             subresource=subresource)
    body = k8s.client.V1SelfSubjectAccessReview(spec=k8s.client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=attrs))
    try:
        return bool(cluster.authz().create_self_subject_access_review(body, _request_timeout=10).status.allowed)
    except Exception:
        return None
