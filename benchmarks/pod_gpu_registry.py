"""A read-only image registry on 127.0.0.1 for the GPU machine's one-node cluster (benchmarks/pod_gpu.sh).

    python benchmarks/pod_gpu_registry.py PORT ARCHIVE.tar [ARCHIVE.tar ...]
It serves one-layer `docker save` archives through the registry API v2, so that the pod's start-up includes a real pull.
Each repository and tag is the archive's RepoTags without the registry part (k8s.gcr.io/pause:3.2 is pause:3.2)."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import tarfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
BLOBS: dict[str, bytes] = {}
MANIFESTS: dict[tuple[str, str], bytes] = {}


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def load(path: str) -> None:
    with tarfile.open(path) as tar:
        (entry,) = json.load(tar.extractfile("manifest.json"))
        config = tar.extractfile(entry["Config"]).read()
        layers = [gzip.compress(tar.extractfile(name).read(), 6, mtime=0) for name in entry["Layers"]]
    for blob in [config, *layers]:
        BLOBS[_digest(blob)] = blob
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": _digest(b),
                    "size": len(b)} for b in layers]}).encode()
    BLOBS[_digest(manifest)] = manifest
    for tag in entry["RepoTags"]:
        name, _, ref = tag.rpartition(":")
        repo = name.split("/", 1)[1] if "/" in name and ("." in name.split("/")[0] or
                                                         name.split("/")[0] == "localhost") else name
        MANIFESTS[(repo, ref)] = manifest
        MANIFESTS[(repo, _digest(manifest))] = manifest
        print(f"registry: {repo}:{ref} {_digest(manifest)}", flush=True)


class Handler(BaseHTTPRequestHandler):
    def _answer(self, body: bytes | None, kind: str = "application/octet-stream", digest: str | None = None) -> None:
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            return self._answer(b"{}", "application/json")
        if path.startswith("/v2/") and "/manifests/" in path:
            repo, _, ref = path[4:].partition("/manifests/")
            body = MANIFESTS.get((repo, ref))
            return self._answer(body, MANIFEST, _digest(body) if body else None)
        if path.startswith("/v2/") and "/blobs/" in path:
            digest = path.rpartition("/blobs/")[2]
            return self._answer(BLOBS.get(digest), digest=digest)
        return self._answer(None)

    do_HEAD = do_GET

    def log_message(self, fmt: str, *args) -> None:
        print("registry: " + fmt % args, flush=True)


def main(argv: list[str]) -> int:
    port, archives = int(argv[0]), argv[1:]
    for path in archives:
        load(path)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
