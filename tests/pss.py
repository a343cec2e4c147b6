"""The Pod Security Standards, baseline and restricted, as a check of a pod spec.

That is what Pod Security admission enforces on Kubernetes 1.23 and later (kubernetes.io's pod-security-standards).
The test cluster runs 1.20, which has no such admission.
So the tests hold gpuvs's pods to the rules here, and run them for real on the cluster."""

from __future__ import annotations

from typing import Any

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def violations(spec: dict[str, Any], level: str = "restricted") -> list[str]:
    """What in a pod spec (the API's camelCase form) breaks the standard of `level` (baseline or restricted)."""
    out: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{key}: true")
    pod_sc = spec.get("securityContext") or {}
    if (pod_sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("pod seccompProfile Unconfined")
    for v in spec.get("volumes", []):
        kind = next(k for k in v if k != "name")
        if kind == "hostPath":
            out.append(f"volume {v['name']}: hostPath")
        elif level == "restricted" and kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: {kind}")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name}: hostPort")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{name}: seccompProfile Unconfined")
        adds = set((sc.get("capabilities") or {}).get("add") or [])
        if adds - BASELINE_CAPS:
            out.append(f"{name}: capabilities added beyond baseline: {sorted(adds - BASELINE_CAPS)}")
        if level != "restricted":
            continue
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile is not RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities do not drop ALL")
        if adds - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities added: {sorted(adds)}")
    return out
