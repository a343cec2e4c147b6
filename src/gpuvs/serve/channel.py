"""A client's side: a channel to a gpuvs serve target and its stub, in plain text or over TLS.

With a token, it is sent as `authorization: Bearer TOKEN` on every call."""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass

import grpc

from gpuvs.errors import UsageError
from gpuvs.serve import nlp_pb2_grpc

_TARGET = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def check_target(target: str) -> str:
    """HOST:PORT (or [IPv6]:PORT); UsageError otherwise."""
    m = _TARGET.match(target or "")
    if not m or not 0 < int(m.group(2)) < 65536:
        raise UsageError(f"--target {target!r} is not HOST:PORT (for example 127.0.0.1:50051)")
    return target


@dataclass(frozen=True)
class Access:
    """How a client reaches the server: TLS (tls, or a CA file to trust instead of the system's),
    the name its certificate is checked against when it is not the target's host, and the token."""
    tls: bool = False
    tls_ca: str = ""
    server_name: str = ""
    token_file: str = ""

    @property
    def secure(self) -> bool:
        return self.tls or bool(self.tls_ca)

    def token(self) -> str:
        from gpuvs.serve.security import read_token

        return read_token(self.token_file) if self.token_file else ""


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    pass


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d):
        return _Details(d.method, d.timeout, [*(d.metadata or ()), self._header], d.credentials,
                        d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


def channel(target: str, timeout_s: float = 10.0, max_message_bytes: int = 64 << 20, own_connection: bool = False,
            access: Access = Access()) -> grpc.Channel:
    """A ready channel; ConnectionError when nothing answers within timeout_s (UsageError for an
    unreadable CA or token file). own_connection: a TCP connection of its own (load clients)."""
    from gpuvs.serve.security import read_secret

    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes)]
    if own_connection:
        options.append(("grpc.use_local_subchannel_pool", 1))
    if access.server_name:
        options.append(("grpc.ssl_target_name_override", access.server_name))
    token = access.token()
    if access.secure:
        ca = read_secret(access.tls_ca, "CA certificate") if access.tls_ca else None
        chan = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca), options=options)
    else:
        chan = grpc.insecure_channel(target, options=options)
    try:
        grpc.channel_ready_future(chan).result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        chan.close()
        how = " over TLS (is the server's certificate trusted? --tls-ca)" if access.secure else ""
        raise ConnectionError(f"nothing answers at {target}{how} (waited {timeout_s:g} s): "
                              "is gpuvs serve running there?") from None
    return grpc.intercept_channel(chan, _Token(token)) if token else chan


def connect(target: str, timeout_s: float = 10.0, max_message_bytes: int = 64 << 20,
            own_connection: bool = False, access: Access = Access()) -> tuple[grpc.Channel, nlp_pb2_grpc.NlpStub]:
    """A ready channel and the Nlp stub on it (see channel)."""
    chan = channel(target, timeout_s, max_message_bytes, own_connection, access)
    return chan, nlp_pb2_grpc.NlpStub(chan)
