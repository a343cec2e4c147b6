"""Who may start a run: POST /runs carries `Authorization: Bearer TOKEN`, TOKEN the content of --token-file.

In the cluster that file is the Secret gpuvs-agent-token, which `gpuvs deploy` makes (docs/deploy.md).
It is read at each POST, so a rotated Secret counts without a restart; no file or an empty one refuses everyone.
The token is compared in constant time (hmac.compare_digest), and never written to the log or to an answer."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

SCHEME = "bearer"


@dataclass(frozen=True)
class TokenFile:
    path: str | None

    def read(self) -> bytes | None:
        """The token, or None when there is none (no --token-file, no such file, an empty one)."""
        if not self.path:
            return None
        try:
            token = Path(self.path).read_bytes().strip()
        except OSError:
            return None
        return token or None


def check(authorization: str | None, token: bytes | None) -> str:
    """'ok', 'off' (the agent has no token: nobody may), 'missing' (no bearer token sent) or 'wrong'."""
    if token is None:
        return "off"
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != SCHEME or not given.strip():
        return "missing"
    try:
        sent = given.strip().encode("latin-1")  # how http.client decodes a header's bytes
    except UnicodeEncodeError:
        return "wrong"
    return "ok" if hmac.compare_digest(sent, token) else "wrong"
