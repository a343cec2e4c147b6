"""A kustomize overlay of deploy/ as `gpuvs deploy --overlay DIR` reads it: its base, more objects, JSON patches.

Only the fields kubectl 1.20's kustomize (v2.0.3) and today's read alike are taken; any other is refused in one line.
What it adds is remembered on the agent's Deployment (annotation gpuvs.io/overlay).
So a later `gpuvs deploy` without --overlay keeps it, and `--delete` removes its objects."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpuvs.errors import UsageError

ANNOTATION = "gpuvs.io/overlay"
KEYS = ("apiVersion", "kind", "bases", "resources", "patchesJson6902")
NONE = "none"  # --overlay none: forget the remembered overlay


@dataclass
class Overlay:
    source: str
    objects: list[dict[str, Any]] = field(default_factory=list)
    patches: list[dict[str, Any]] = field(default_factory=list)  # {"target": {...}, "ops": [RFC 6902 operations]}

    def to_json(self) -> str:
        return json.dumps({"source": self.source, "objects": self.objects, "patches": self.patches},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Overlay:
        try:
            d = json.loads(text)
            return cls(str(d["source"]), list(d["objects"]), list(d["patches"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"the agent's Deployment has an unreadable {ANNOTATION} annotation ({exc}): give "
                             f"--overlay DIR again, or --overlay {NONE}") from None


def _folder(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        return p
    raise UsageError(f"--overlay {path}: no such folder (a kustomization of deploy/, e.g. overlays/test-cluster, "
                     f"or {NONE})")


def _yaml(path: Path, what: str) -> Any:
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"--overlay: {what} {path} cannot be read: {str(exc).splitlines()[0]}") from None


def _base_resources() -> list[str]:
    root = resources.files("gpuvs") / "manifests"
    return list(yaml.safe_load((root / "kustomization.yaml").read_text())["resources"])


def read(path: str) -> Overlay:
    """The overlay in folder `path`: its objects and patches, checked (one line on what is wrong)."""
    root = _folder(path)
    k_file = next((root / n for n in ("kustomization.yaml", "kustomization.yml", "Kustomization")
                   if (root / n).is_file()), None)
    if k_file is None:
        raise UsageError(f"--overlay {path}: no kustomization.yaml there")
    docs = _yaml(k_file, "kustomization")
    k = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else None
    if k is None:
        raise UsageError(f"--overlay {path}: {k_file.name} is not one mapping")
    other = sorted(set(k) - set(KEYS))
    if other:
        raise UsageError(f"--overlay {path}: {', '.join(other)} not read by gpuvs deploy (it reads "
                         f"{', '.join(KEYS[2:])}); apply such an overlay with kubectl apply -k")
    entries = [*(k.get("bases") or []), *(k.get("resources") or [])]
    bases = [e for e in entries if (root / e).is_dir()]
    if len(bases) != 1:
        raise UsageError(f"--overlay {path}: its base must be deploy/, once ({len(bases)} folders named)")
    base = root / bases[0]
    try:
        theirs = yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        theirs = None
    if theirs != _base_resources():
        raise UsageError(f"--overlay {path}: its base {bases[0]} is not gpuvs's deploy/ (its resources differ)")
    out = Overlay(str(path))
    for e in entries:
        if e in bases:
            continue
        for obj in _yaml(root / e, "resource"):
            if not (isinstance(obj, dict) and obj.get("kind") and (obj.get("metadata") or {}).get("name")):
                raise UsageError(f"--overlay {path}: {e} holds something that is not an object with a kind and a name")
            out.objects.append(obj)
    for p in k.get("patchesJson6902") or []:
        target = (p or {}).get("target") or {}
        if not (target.get("kind") and target.get("name") and p.get("path")):
            raise UsageError(f"--overlay {path}: each patchesJson6902 entry needs target (kind, name) and path")
        ops = _yaml(root / p["path"], "patch")
        ops = ops[0] if len(ops) == 1 else ops
        if not (isinstance(ops, list) and all(isinstance(o, dict) and "op" in o and "path" in o for o in ops)):
            raise UsageError(f"--overlay {path}: {p['path']} is not a list of JSON patch operations (op, path)")
        out.patches.append({"target": target, "ops": ops})
    return out


def _matches(m: dict[str, Any], target: dict[str, Any]) -> bool:
    group, _, version = m["apiVersion"].rpartition("/")
    return (m["kind"] == target["kind"] and m["metadata"]["name"] == target["name"]
            and target.get("group", group) == group and target.get("version", version) == version
            and target.get("namespace", m["metadata"].get("namespace")) == m["metadata"].get("namespace"))


def _tokens(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise ValueError(f"path {pointer!r} does not start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    *head, last = _tokens(pointer)
    node = doc
    for t in head:
        node = node[int(t)] if isinstance(node, list) else node[t]
    return node, last


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902's add, remove, replace and test on a copy of doc (ValueError, KeyError, IndexError: not applicable)."""
    doc = copy.deepcopy(doc)
    for o in ops:
        op, where = o["op"], o["path"]
        node, last = _parent(doc, where)
        if op == "add":
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), copy.deepcopy(o["value"]))
            else:
                node[last] = copy.deepcopy(o["value"])
        elif op == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif op == "replace":
            key = int(last) if isinstance(node, list) else last
            node[key]  # noqa: B018  (it must exist: KeyError or IndexError)
            node[key] = copy.deepcopy(o["value"])
        elif op == "test":
            if node[int(last) if isinstance(node, list) else last] != o["value"]:
                raise ValueError(f"test of {where} failed")
        else:
            raise ValueError(f"op {op!r} (gpuvs applies add, remove, replace and test)")
    return doc


def apply(objs: list[dict[str, Any]], overlay: Overlay, before: tuple[str, str]) -> list[dict[str, Any]]:
    """The objects with the overlay's objects inserted before the object `before` (kind, name) and its patches
    applied; one line naming the patch that does not apply."""
    i = next(i for i, m in enumerate(objs) if (m["kind"], m["metadata"]["name"]) == before)
    out = [*objs[:i], *copy.deepcopy(overlay.objects), *objs[i:]]
    for p in overlay.patches:
        t = p["target"]
        at = next((j for j, m in enumerate(out) if _matches(m, t)), None)
        if at is None:
            raise UsageError(f"--overlay {overlay.source}: its patch of {t['kind']}/{t['name']} names no object of "
                             f"deploy/ or the overlay")
        try:
            out[at] = json_patch(out[at], p["ops"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UsageError(f"--overlay {overlay.source}: its patch of {t['kind']}/{t['name']} does not apply: "
                             f"{exc}") from None
    return out
