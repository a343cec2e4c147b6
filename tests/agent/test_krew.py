"""`kubectl gpuvs` as a krew plugin (deploy/krew, scripts/krew-plugin; docs/deploy.md).

The committed manifest is the one the script writes for this tree, and has what krew's validation asks.
Its archive, installed as krew installs it, is found by kubectl 1.20's plugin discovery and runs gpuvs.
Without gpuvs it says so in one line."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile

import yaml

import gpuvs
from cluster import k8s_build  # noqa: F401  (a session fixture)
from conftest import ROOT, gpuvs_env, missing_part

MANIFEST = ROOT / "deploy/krew/gpuvs.yaml"


def build(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "scripts/krew-plugin"), "--out", str(out), "--manifest",
                        str(tmp_path / "gpuvs.yaml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return out / f"kubectl-gpuvs-v{gpuvs.__version__}.tar.gz", tmp_path / "gpuvs.yaml"


def test_the_committed_manifest_is_the_scripts_for_this_tree_and_valid_for_krew(tmp_path):
    archive, written = build(tmp_path)
    assert written.read_text() == MANIFEST.read_text(), "deploy/krew/gpuvs.yaml is stale: run scripts/krew-plugin"
    again, _ = build(tmp_path / "again")
    assert again.read_bytes() == archive.read_bytes()  # reproducible: the sha256 holds for every build of it
    m = yaml.safe_load(MANIFEST.read_text())
    assert m["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and m["kind"] == "Plugin"
    assert m["metadata"]["name"] == "gpuvs"  # the plugin's name is kubectl-<name>'s
    spec = m["spec"]
    assert spec["version"] == f"v{gpuvs.__version__}" and re.match(r"^v\d+\.\d+\.\d+", spec["version"])
    assert spec["shortDescription"] and len(spec["shortDescription"]) <= 50 and spec["description"]
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    with tarfile.open(archive) as tar:
        members = {t.name: t for t in tar.getmembers()}
    seen = set()
    for p in spec["platforms"]:
        labels = p["selector"]["matchLabels"]
        assert labels["os"] in ("linux", "darwin") and labels["arch"] in ("amd64", "arm64")
        seen.add((labels["os"], labels["arch"]))
        assert p["sha256"] == digest and p["uri"].endswith(archive.name)
        assert p["bin"] == "kubectl-gpuvs" and [f["from"] for f in p["files"]] == ["kubectl-gpuvs"]
        assert members["kubectl-gpuvs"].mode & 0o111  # executable, as krew links it
    assert len(seen) == len(spec["platforms"])  # one platform each


def test_installed_as_krew_does_kubectl_finds_it_and_it_runs_gpuvs(tmp_path, k8s_build):
    from cluster import BIN

    kubectl = BIN / "kubectl"
    if not kubectl.exists():
        missing_part(f"kubectl 1.20 is not in {BIN}: run scripts/test-cluster build (it unpacks Debian's)")
    archive, _ = build(tmp_path)
    store = tmp_path / "krew/store/gpuvs" / f"v{gpuvs.__version__}"  # krew's layout: store/NAME/VERSION, bin/
    store.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(store, filter="data")
    bindir = tmp_path / "krew/bin"
    bindir.mkdir()
    (bindir / "kubectl-gpuvs").symlink_to(store / "kubectl-gpuvs")
    env = gpuvs_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", GPUVS_PYTHON=sys.executable)
    listed = subprocess.run([str(kubectl), "plugin", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert str(bindir / "kubectl-gpuvs") in listed.stdout, listed.stdout + listed.stderr
    r = subprocess.run([str(kubectl), "gpuvs", "deploy", "--dry-run"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(r.stdout) if d]
    assert kinds[0] == "Namespace" and "Deployment" in kinds
    bad = subprocess.run([str(kubectl), "gpuvs", "agent", "--every", "soon"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 2 and "a duration" in bad.stderr  # gpuvs's own exit status and line come through
    none = subprocess.run([str(kubectl), "gpuvs", "--help"], capture_output=True, text=True, timeout=60,
                          env={**env, "GPUVS_PYTHON": "/bin/false"})
    assert none.returncode == 1 and none.stderr.strip().splitlines() == [
        ("kubectl gpuvs: gpuvs is not installed for /bin/false: pip install gpuvs, or set GPUVS_PYTHON to a Python "
         "that has it")]
