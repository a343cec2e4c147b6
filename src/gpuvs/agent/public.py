"""What the open read routes (GET /runs, /runs/ID, /readyz, errors) may say.

The runs' reasons and the API error come from the Kubernetes client, which names the cluster's address.
Here that address and the kubeconfig's path are taken out; the agent's log and store keep them whole."""

from __future__ import annotations

import os
import re
from typing import Any

ADDRESS = "<address>"
PATH = "<path>"

_PATTERNS = (
    (re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>),]+"), ADDRESS),  # https://host:6443/...
    (re.compile(r"\bhost='[^']*'"), f"host='{ADDRESS}'"),  # urllib3's HTTPSConnectionPool(host='...', port=...)
    (re.compile(r"\bport=\d+"), "port=<port>"),
    (re.compile(r"\[[0-9a-fA-F:.]+\](?::\d+)?"), ADDRESS),  # [fd00::1]:6443
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), ADDRESS),  # 10.0.0.1:6443
    (re.compile(r"\b[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+:\d{2,5}\b"), ADDRESS),  # api.example.com:6443
    (re.compile(r"(?i)(kubeconfig\s+|kubeconfig=)(?:~|/)[^\s,;)]*[^\s,;):]"), rf"\g<1>{PATH}"),
)


class Scrubber:
    """Takes the given paths (the agent's --kubeconfig, $KUBECONFIG's files, ~/.kube/config, the service account's
    folder) and any address out of text."""

    def __init__(self, *paths: str | None):
        known = {p for p in paths if p}
        known |= {p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p}
        known.add(os.path.expanduser("~/.kube/config"))
        known.add("/var/run/secrets/kubernetes.io/serviceaccount")
        self.paths = sorted(known, key=len, reverse=True)  # the longest first: no path is half replaced

    def text(self, text: str) -> str:
        for p in self.paths:
            text = text.replace(p, PATH)
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
        return text

    def __call__(self, data: Any) -> Any:
        """Every string value of a JSON-like structure scrubbed (keys, e.g. node names, are kept)."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {k: self(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self(v) for v in data]
        return data
