"""gpuvs's own package in the cluster, shipped once: one immutable ConfigMap per package content (docs/pod.md).

Every trial pod of a run shares it, and so do runs going on at once and later runs with the same package.
Each process using it marks it; the last to release it deletes it, with a resourceVersion precondition.
A mark left by a killed process runs out, and a later run sweeps the ConfigMap."""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import io
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpuvs
from gpuvs.errors import EnvironmentUnavailable, UsageError
from gpuvs.kube.client import Cluster, api_message, client_module

KEY = "gpuvs.zip"  # the zip's key in the ConfigMap, and its file name where it is mounted
LIMIT = 1024 * 1024  # what a ConfigMap may hold (the API server's validation), bytes
REFUSE_ABOVE = 0.9  # of LIMIT
MARK = "gpuvs.io/user."
MARK_MIN_S = 3600.0
CLOCK_GRACE_S = 600.0
LABEL = "gpuvs.package"
TOKEN = uuid.uuid4().hex[:16]  # this process


@functools.lru_cache(maxsize=1)
def package_zip() -> bytes:
    """gpuvs's own package as a zip (no caches), the same bytes for the same files; made once per process."""
    root = Path(gpuvs.__file__).resolve().parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root.parent)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix not in (".pyc", ".so"):
                info = zipfile.ZipInfo(str(rel), date_time=(2020, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, path.read_bytes())
    return buf.getvalue()


def digest() -> str:
    return hashlib.sha256(package_zip()).hexdigest()[:12]


def name() -> str:
    """The package ConfigMap's name: the same for the same package content."""
    return f"gpuvs-pkg-{digest()}"


def check_size() -> int:
    """The zip's size; UsageError (one line) when it comes near what a ConfigMap holds."""
    size = len(package_zip())
    if size > REFUSE_ABOVE * LIMIT:
        raise UsageError(f"gpuvs's package is {size / 1024:.0f} KiB zipped ({size} bytes); a ConfigMap holds at "
                         f"most 1 MiB ({LIMIT} bytes) and gpuvs stops at {REFUSE_ABOVE:.0%} of that: install gpuvs "
                         "in the image and give --package image")
    return size


def body(until: float) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name(), "labels": {"gpuvs": "1", LABEL: digest()},
                         "annotations": {MARK + TOKEN: str(int(until))}},
            "immutable": True, "binaryData": {KEY: base64.b64encode(package_zip()).decode()}}


def live_marks(annotations: dict[str, str] | None, now: float | None = None) -> dict[str, float]:
    """The marks that still hold (past their time plus the clocks' grace, a mark no longer counts)."""
    now = time.time() if now is None else now
    out = {}
    for key, value in (annotations or {}).items():
        if key.startswith(MARK):
            try:
                until = float(value)
            except ValueError:
                continue
            if until + CLOCK_GRACE_S > now:
                out[key[len(MARK):]] = until
    return out


@dataclass
class Held:
    cluster: Cluster
    until: float


_LOCK = threading.Lock()
_HELD: dict[tuple[str, str, str], Held] = {}
_SWEPT: set[tuple[str, str]] = set()
_AT_EXIT = False


def ensure(cluster: Cluster, need_s: float) -> str:
    """The package's ConfigMap exists in the cluster's namespace and this process's mark holds for `need_s` seconds
    more (the longest the pod about to start may live); returns its name. No API call while the mark holds."""
    global _AT_EXIT
    check_size()
    key = (cluster.host, cluster.namespace, name())
    now = time.time()
    with _LOCK:
        held = _HELD.get(key)
        if held is not None and held.until >= now + need_s:
            return key[2]
        if (cluster.host, cluster.namespace) not in _SWEPT:
            _SWEPT.add((cluster.host, cluster.namespace))
            sweep(cluster)
        until = now + max(MARK_MIN_S, 2 * need_s)
        _mark(cluster, until)
        _HELD[key] = Held(cluster, until)
        if not _AT_EXIT:
            atexit.register(release)
            _AT_EXIT = True
    return key[2]


def _mark(cluster: Cluster, until: float) -> None:
    """Add or renew this process's mark; create the ConfigMap with it where there is none."""
    ApiException = client_module().client.exceptions.ApiException
    core, ns = cluster.core, cluster.namespace
    patch = {"metadata": {"annotations": {MARK + TOKEN: str(int(until))}}}
    for _ in range(5):
        try:
            core.patch_namespaced_config_map(name(), ns, patch, _request_timeout=30)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise EnvironmentUnavailable(f"gpuvs's package ConfigMap {name()} in {ns}: {api_message(exc)}") from None
        try:
            core.create_namespaced_config_map(ns, body(until), _request_timeout=30)
            return
        except ApiException as exc:
            if exc.status != 409:  # 409: another run made it in between: mark that one
                raise EnvironmentUnavailable(f"gpuvs's package ConfigMap {name()} could not be created in {ns}: "
                                             f"{api_message(exc)}") from None
    raise EnvironmentUnavailable(f"gpuvs's package ConfigMap {name()} in {ns} kept appearing and disappearing")


def _delete_if_unused(cluster: Cluster, obj: Any) -> bool:
    """Delete a package ConfigMap that no mark holds, unless it changed since `obj` was read (a run marked it)."""
    k8s = client_module()
    if live_marks(obj.metadata.annotations):
        return False
    options = k8s.client.V1DeleteOptions(preconditions=k8s.client.V1Preconditions(
        resource_version=obj.metadata.resource_version, uid=obj.metadata.uid))
    try:
        cluster.core.delete_namespaced_config_map(obj.metadata.name, cluster.namespace, body=options,
                                                  _request_timeout=15)
        return True
    except k8s.client.exceptions.ApiException:  # 409: marked meanwhile, in use; 404: gone already
        return False


def sweep(cluster: Cluster) -> list[str]:
    """Delete the package ConfigMaps of the namespace that no mark holds any more (their runs were killed)."""
    try:
        items = cluster.core.list_namespaced_config_map(cluster.namespace, label_selector=f"gpuvs=1,{LABEL}",
                                                        _request_timeout=30).items
    except Exception:  # may not list: the run goes on; a later one cleans up
        return []
    return [cm.metadata.name for cm in items if _delete_if_unused(cluster, cm)]


def release(timeout_s: float = 30.0) -> list[str]:
    """End of a run: remove this process's marks; delete each ConfigMap no other run marks. Returns the names
    deleted. Safe to call more than once (the next pod marks again)."""
    with _LOCK:
        held = dict(_HELD)
        _HELD.clear()
    deleted = []
    deadline = time.monotonic() + timeout_s
    for (_, ns, cm), h in held.items():
        if time.monotonic() > deadline:
            break
        try:
            obj = h.cluster.core.patch_namespaced_config_map(cm, ns, {"metadata": {"annotations": {MARK + TOKEN: None}}},
                                                             _request_timeout=10)
        except Exception:  # gone, or the API is away: its mark runs out and a later run deletes it
            continue
        if _delete_if_unused(h.cluster, obj):
            deleted.append(cm)
    return deleted
