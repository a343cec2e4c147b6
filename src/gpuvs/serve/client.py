"""A client's side: a channel to a gpuvs serve target and its stub."""

from __future__ import annotations

import re

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


def connect(target: str, timeout_s: float = 10.0, max_message_bytes: int = 64 << 20,
            own_connection: bool = False) -> tuple[grpc.Channel, nlp_pb2_grpc.NlpStub]:
    """A ready channel and stub; ConnectionError when nothing answers within timeout_s.
    own_connection: a TCP connection of its own (load clients), not one shared with other channels."""
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes)]
    if own_connection:
        options.append(("grpc.use_local_subchannel_pool", 1))
    channel = grpc.insecure_channel(target, options=options)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        channel.close()
        raise ConnectionError(f"nothing answers at {target} (waited {timeout_s:g} s): is gpuvs serve running there?") from None
    return channel, nlp_pb2_grpc.NlpStub(channel)
