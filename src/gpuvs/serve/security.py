"""Who may call the server. On a loopback address, plain text and no token are allowed.

On any other address it needs TLS (--tls-cert, --tls-key) and a token (--token-file), or an explicit --insecure.
--insecure is plain text without a token: only for a network you trust.
With a token, every call must carry `authorization: Bearer TOKEN`, or is refused with UNAUTHENTICATED."""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc

from gpuvs.errors import UsageError

AUTH_HEADER = "authorization"


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_secret(path: str, what: str) -> bytes:
    """A file's bytes; UsageError (one line) when it cannot be read or is empty."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if not data.strip():
        raise UsageError(f"the {what} {path} is empty")
    return data


def read_token(path: str) -> str:
    token = read_secret(path, "token file").decode("utf-8", "replace").strip()
    if any(c.isspace() or not c.isprintable() for c in token):
        raise UsageError(f"the token in {path} must be one line of printable characters without spaces")
    return token


@dataclass
class Security:
    """The server's side: TLS key and certificate (PEM) and token, all optional."""
    tls_cert: str = ""
    tls_key: str = ""
    token_file: str = ""
    insecure: bool = False

    def check(self, host: str) -> None:
        """The listening rule (module docstring); UsageError saying what to add."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise UsageError("--tls-cert and --tls-key go together (the server's certificate and its private key, PEM)")
        if self.insecure and (self.tls_cert or self.token_file):
            raise UsageError("--insecure means plain text and no token: leave out --tls-cert, --tls-key and --token-file")
        if not (is_loopback(host) or self.insecure or (self.tls_cert and self.token_file)):
            raise UsageError(f"listening on {host} (not loopback) needs TLS and a token (--tls-cert, --tls-key, "
                             "--token-file), or --insecure to serve plain text without a token on a trusted network")
        if self.token_file:  # readable now, so that a bad file is one line before anything listens
            read_token(self.token_file)
        self.credentials()

    def credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls_cert:
            return None
        key = read_secret(self.tls_key, "TLS key")
        cert = read_secret(self.tls_cert, "TLS certificate")
        return grpc.ssl_server_credentials([(key, cert)])

    def interceptors(self, on_refused: Callable[[], None]) -> list[grpc.ServerInterceptor]:
        return [TokenCheck(read_token(self.token_file), on_refused)] if self.token_file else []


def _refusal(kind: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler of the same shape as the one refused, that only says UNAUTHENTICATED."""
    def deny(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token: send metadata "
                                                       "'authorization: Bearer TOKEN' (--token-file)")

    def deny_stream(request, context):
        deny(request, context)
        yield  # pragma: no cover - never reached: abort raises

    if kind is not None and kind.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny_stream)
    return grpc.unary_unary_rpc_method_handler(deny)


class TokenCheck(grpc.ServerInterceptor):
    def __init__(self, token: str, on_refused: Callable[[], None]):
        self._expected = f"Bearer {token}".encode()
        self._on_refused = on_refused

    def intercept_service(self, continuation, handler_call_details):
        sent = dict(handler_call_details.invocation_metadata or ()).get(AUTH_HEADER, "")
        if hmac.compare_digest(str(sent).encode(), self._expected):
            return continuation(handler_call_details)
        self._on_refused()
        return _refusal(continuation(handler_call_details))
