"""The agent's HTTP server and its routes: /healthz, /readyz, /metrics, /runs, and the status page at /.

A route is one function of (the agent, the path, the query) returning a Response: ROUTES maps to it.
A thread per connection, MAX_CONNECTIONS at once; the probes are answered in the overflow even when all are held.
The reads are open and say nothing of the cluster's address (public.py); docs/deploy.md has each route."""

from __future__ import annotations

import json
import math
import re
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Callable, Protocol
from urllib.parse import parse_qs, urlsplit

from gpuvs.agent import auth, metrics
from gpuvs.agent.ledger import RunRecord
from gpuvs.agent.public import Scrubber
from gpuvs.agent.runs import log
from gpuvs.agent.state import State

MAX_CONNECTIONS = 32  # connections served at once (a thread each)
MAX_BODY = 65536  # bytes of a POST's body (it is read and ignored)
REFUSED_LOG_EVERY_S = 10.0  # connections refused while full: one line at most this often
OVERFLOW_MAX = 256  # sockets waiting in the overflow at once; one more pushes the oldest out (with its 503)
OVERFLOW_HEAD = 8192  # bytes of a request's head read in the overflow; more is refused
HEALTH = ("/healthz", "/readyz")  # answered in the overflow too: the probes never wait for a slot
_LENGTH = re.compile(r"[0-9]{1,10}")


@dataclass
class Asked:
    """What a request for a run got: the run queued (created), the run already queued or running, or none and how
    long until one may start (wait_s: --min-interval since the last run ended)."""

    run: RunRecord | None
    created: bool
    wait_s: float = 0.0


class Agent(Protocol):
    """What the routes ask of the agent (service.Agent; the server never imports it)."""

    state: State
    registry: Any
    started: threading.Event
    token: auth.TokenFile
    public: Scrubber

    def alive(self) -> bool: ...
    def runs(self, limit: int = 50) -> list[RunRecord]: ...
    def run(self, run_id: str) -> RunRecord | None: ...
    def request_run(self, trigger: str) -> Asked: ...
    def status_page(self) -> str: ...


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    why: str = ""  # an error's one line, for the log


def _json(status: int, data: Any, **headers: str) -> Response:
    return Response(status, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), headers=headers)


def _error(status: int, why: str, **headers: str) -> Response:
    out = _json(status, {"error": why}, **headers)
    out.why = why
    return out


def healthz(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    ok = agent.alive()
    return Response(200 if ok else 503, b"ok\n" if ok else b"the agent's loop has stopped\n", "text/plain")


def readyz(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    s = agent.state
    with s.lock:
        body = {"ready": agent.started.is_set(), "api_reachable": s.api_ok, "api_error": s.api_error,
                "store_ok": s.store_ok, "store_error": s.store_error}
    return _json(200 if agent.started.is_set() else 503, agent.public(body))


def metrics_route(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    return Response(200, metrics.exposition(agent.registry), metrics.CONTENT_TYPE)


def runs_list(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    try:
        limit = max(1, min(500, int((query.get("limit") or ["50"])[0])))
    except ValueError:
        return _error(400, "limit: expected a whole number")
    return _json(200, agent.public([r.to_dict() for r in agent.runs(limit)]))


def run_one(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    run_id = path.removeprefix("/runs/")
    found = agent.run(run_id)
    return _json(200, agent.public(found.to_dict())) if found else _error(404, f"no run {run_id[:100]}")


def run_now(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    asked = agent.request_run("api")
    if asked.created and asked.run is not None:
        return _json(202, agent.public(asked.run.to_dict()))
    if asked.run is not None:
        return _json(409, {"error": "a run is already queued or running", "run": agent.public(asked.run.to_dict())})
    wait = max(1, math.ceil(asked.wait_s))
    out = _error(429, f"the last run ended less than --min-interval ago: try again in {wait} s",
                 **{"Retry-After": str(wait)})
    out.body = (json.dumps({"error": out.why, "retry_after_s": wait}, indent=2, sort_keys=True) + "\n").encode()
    return out


def status_page(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    return Response(200, agent.status_page().encode(), "text/html; charset=utf-8")


ROUTES: dict[tuple[str, str], Callable[[Agent, str, dict[str, list[str]]], Response]] = {
    ("GET", "/healthz"): healthz,
    ("GET", "/readyz"): readyz,
    ("GET", "/metrics"): metrics_route,
    ("GET", "/runs"): runs_list,
    ("GET", "/runs/"): run_one,
    ("POST", "/runs"): run_now,
    ("GET", "/"): status_page,
    ("GET", "/status"): status_page,
}


def route(method: str, path: str) -> Callable | None:
    if (method, path) in ROUTES:
        return ROUTES[(method, path)]
    for (m, prefix), fn in ROUTES.items():
        if (m == method and prefix != "/" and prefix.endswith("/") and path.startswith(prefix)
                and len(path) > len(prefix)):  # "/" is the status page, not every path's prefix
            return fn
    return None


def authorize(agent: Agent, authorization: str | None) -> Response | None:
    """None when the request may write; else its refusal (what is missing, never what the token is)."""
    verdict = auth.check(authorization, agent.token.read())
    if verdict == "ok":
        return None
    if verdict == "off":
        return _error(403, "POST /runs is off: the agent has no token (gpuvs agent --token-file; docs/deploy.md)")
    challenge = 'Bearer realm="gpuvs-agent"' + (', error="invalid_token"' if verdict == "wrong" else "")
    return _error(401, "POST /runs needs Authorization: Bearer TOKEN" if verdict == "missing" else
                  "POST /runs: the bearer token is not the agent's", **{"WWW-Authenticate": challenge})


def _printable(text: str, limit: int = 120) -> str:
    return text.encode("unicode_escape").decode("ascii")[:limit]


def handler(agent: Agent, timeout_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def version_string(self) -> str:  # the Server header: no Python version
            return "gpuvs-agent"
        timeout = timeout_s  # each read and write; the server closes the whole connection at timeout_s too
        server: Server

        def _line(self, message: str) -> None:
            log(f"HTTP {self.client_address[0]}: {message}")

        def _send(self, resp: Response, method: str, path: str) -> None:
            if (resp.status >= 400 and resp.status != 409) and not self.server.was_cut(self.request):
                self._line(f"{method} {_printable(path)}: {resp.status} {resp.why}".rstrip())
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            self.send_header("Content-Length", str(len(resp.body)))
            for k, v in resp.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(resp.body)

        def _serve(self, method: str) -> None:
            if self.server.was_cut(self.request):  # its time ran out while it was read: never acted on
                self.close_connection = True
                return
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            fn = route(method, path) or route(method, url.path)
            if fn is None:
                known = any(p == url.path for _, p in ROUTES)
                resp = _error(405 if known else 404, f"{method} {_printable(url.path)}: "
                              + ("method not allowed" if known else "no such route"))
            else:
                resp = authorize(agent, self.headers.get("Authorization")) if method == "POST" else None
                if resp is None:
                    try:
                        resp = fn(agent, path, parse_qs(url.query))
                    except Exception as exc:  # one request's failure is its 500, never the server's end
                        resp = _error(500, agent.public(f"{type(exc).__name__}: {exc}"))
            self._send(resp, method, url.path)

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            raw = self.headers.get("Content-Length")
            length = 0
            if raw is not None:
                if not _LENGTH.fullmatch(raw.strip()):
                    self.close_connection = True
                    return self._send(_error(400, f"Content-Length {_printable(raw, 40)!r}: expected a whole "
                                             f"number of bytes, 0 to {MAX_BODY}"), "POST", urlsplit(self.path).path)
                length = int(raw.strip())
                if length > MAX_BODY:
                    self.close_connection = True
                    return self._send(_error(413, f"Content-Length {length}: at most {MAX_BODY} bytes"), "POST",
                                      urlsplit(self.path).path)
            if length and len(self.rfile.read(length)) < length:  # gone, or cut at its time: not acted on
                self.close_connection = True
                if not self.server.was_cut(self.request):
                    self._line(f"POST {_printable(urlsplit(self.path).path)}: closed before its body was whole")
                return None
            self._serve("POST")

        def log_error(self, format: str, *args: Any) -> None:  # bad request lines and headers, timeouts: one line
            message = format % args if args else format
            if message.startswith("Request timed out"):  # its own read timed out: unless the server's cut did
                if not self.server.claim(self.request):
                    return
                message = f"no whole request within {timeout_s:g} s: closed"
            elif self.server.was_cut(self.request):
                return
            self._line(_printable(message, 300))

        def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: not logged
            return

    return Handler


class Overflow:
    """The connections that found every slot taken, on one thread with a selector: each one's request head is read
    without blocking; GET /healthz and /readyz are answered, anything else (or nothing by its deadline) gets the
    503. No socket waits on another, so a pile of idle ones does not delay a probe."""

    def __init__(self, server: Server):
        self.server = server
        self.selector = selectors.DefaultSelector()
        self.waiting: dict[socket.socket, tuple[float, bytearray]] = {}  # socket -> (deadline, head so far)
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)  # a full pipe means a wake-up is pending already
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="gpuvs-agent-http-overflow", daemon=True)

    def add(self, request: socket.socket) -> None:
        with self.lock:
            if self.closed:
                self.server.refuse(request)
                return
            oldest = next(iter(self.waiting)) if len(self.waiting) >= OVERFLOW_MAX else None
            request.setblocking(False)
            self.waiting[request] = (time.monotonic() + self.server.timeout_s, bytearray())
            self.selector.register(request, selectors.EVENT_READ)
        if oldest is not None:
            self._end(oldest, None)
        self._wake()

    def _wake(self) -> None:
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    def _end(self, request: socket.socket, answer: Response | None) -> None:
        """Answer (or refuse, with None) and close it, once."""
        with self.lock:
            if self.waiting.pop(request, None) is None:
                return
            self.selector.unregister(request)
        if answer is None:
            self.server.refuse(request)
            return
        head = f"HTTP/1.0 {answer.status} {HTTPStatus(answer.status).phrase}\r\n"
        try:
            request.setblocking(True)
            request.settimeout(1.0)  # a few hundred bytes: the socket's buffer takes them at once
            request.sendall((head + f"Content-Type: {answer.content_type}\r\nContent-Length: {len(answer.body)}"
                             "\r\nConnection: close\r\n\r\n").encode() + answer.body)
            request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.server.shutdown_request(request)

    def _read(self, request: socket.socket) -> None:
        with self.lock:
            entry = self.waiting.get(request)
        if entry is None:
            return
        try:
            chunk = request.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away
            with self.lock:
                self.waiting.pop(request, None)
                self.selector.unregister(request)
            self.server.shutdown_request(request)
            return
        head = entry[1]
        head += chunk
        line, newline, _ = bytes(head).partition(b"\n")
        parts = line.decode("latin-1").split()
        path = urlsplit(parts[1]).path.rstrip("/") if len(parts) >= 2 else ""
        health = len(parts) == 3 and parts[0] == "GET" and path in HEALTH
        if (newline and not health) or len(head) > OVERFLOW_HEAD:
            self._end(request, None)
        elif health and (b"\r\n\r\n" in head or b"\n\n" in head):  # the head whole: nothing left unread
            fn = ROUTES[("GET", path)]
            try:
                answer = fn(self.server.agent, path, {})
            except Exception as exc:  # as a request's 500 in a slot
                answer = _error(500, f"{type(exc).__name__}")
            self._end(request, answer)

    def _loop(self) -> None:
        while True:
            try:
                if not self._turn():
                    return
            except Exception as exc:  # never the overflow's end: its sockets would never be answered
                log(f"HTTP: the overflow: {type(exc).__name__}: {exc}")
                time.sleep(0.1)

    def _turn(self) -> bool:
        """One select and what it found; False once stopped."""
        with self.lock:
            if self.closed:
                return False
            deadlines = [d for d, _ in self.waiting.values()]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 1.0
        for key, _ in self.selector.select(min(wait, 1.0)):
            if key.fileobj is self.wake_r:
                try:
                    self.wake_r.recv(4096)
                except OSError:
                    pass
                continue
            self._read(key.fileobj)  # type: ignore[arg-type]
        now = time.monotonic()
        with self.lock:
            late = [r for r, (d, _) in self.waiting.items() if d <= now]
        for r in late:
            self._end(r, None)
        return True

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.lock:
            self.closed = True
            left = list(self.waiting)
        self._wake()
        self.thread.join(5)
        for r in left:
            self._end(r, None)
        self.selector.close()
        self.wake_r.close()
        self.wake_w.close()


class Server(HTTPServer):
    """The agent's HTTP server: at most max_connections at once, each closed timeout_s after it was accepted."""

    request_queue_size = 128  # the listen backlog: a burst is accepted (and answered, or refused with 503) at once

    def __init__(self, agent: Agent, host: str, port: int, timeout_s: float = 10.0,
                 max_connections: int = MAX_CONNECTIONS):
        self.timeout_s = timeout_s
        self.slots = threading.BoundedSemaphore(max_connections)
        # the open connections: each closed at its deadline (monotonic), and its client's address
        self.deadlines: dict[socket.socket, tuple[float, str]] = {}
        self.cut: set[socket.socket] = set()  # those ended by their time (one line said so; not to be acted on)
        self.lock = threading.Lock()
        self.refused = 0  # connections refused since the last line about it
        self.refused_logged = 0.0
        super().__init__((host, port), handler(agent, timeout_s))
        self.agent = agent
        self.overflow = Overflow(self)
        self.port = self.server_address[1]
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.25},
                                       name="gpuvs-agent-http", daemon=True)

    # -- connections --------------------------------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.overflow.add(request)  # a probe is answered there; the rest get 503
            return
        with self.lock:
            self.deadlines[request] = (time.monotonic() + self.timeout_s, str(client_address[0]))
        try:
            threading.Thread(target=self._work, args=(request, client_address), name="gpuvs-agent-http-conn",
                             daemon=True).start()
        except RuntimeError:  # no thread to be had: as full
            self._done(request)
            self.refuse(request)

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            with self.lock:
                self.deadlines.pop(request, None)  # first: the reaper leaves it alone from here on
            self.shutdown_request(request)
            self._done(request)

    def _done(self, request: Any) -> None:
        with self.lock:
            self.deadlines.pop(request, None)
            self.cut.discard(request)
        self.slots.release()

    def claim(self, request: Any) -> bool:
        """Mark the connection as ended by its time; False when that was done already (one line each)."""
        with self.lock:
            if request in self.cut:
                return False
            self.cut.add(request)
            return True

    def refuse(self, request: Any) -> None:
        body = b'{"error": "the agent serves ' + str(MAX_CONNECTIONS).encode() + b' connections at once: try again"}\n'
        try:
            request.setblocking(False)
            request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        except OSError:
            pass
        self.shutdown_request(request)
        with self.lock:  # the overflow's thread and the accepting one both refuse
            self.refused += 1
        self._refused_line()

    def _refused_line(self) -> None:
        now = time.monotonic()
        with self.lock:
            n = self.refused if self.refused and now - self.refused_logged >= REFUSED_LOG_EVERY_S else 0
            if n:
                self.refused, self.refused_logged = 0, now
        if n:
            log(f"HTTP: {n} connection(s) refused with 503: {MAX_CONNECTIONS} already open (each is "
                f"closed at most {self.timeout_s:g} s after it was accepted)")

    def was_cut(self, request: Any) -> bool:
        with self.lock:
            return request in self.cut

    def service_actions(self) -> None:
        """Between accepts (every poll interval at most): each connection past its deadline is shut down, which
        ends its thread's read or write; one line for each."""
        now = time.monotonic()
        with self.lock:
            late = [(r, peer) for r, (d, peer) in self.deadlines.items() if d <= now and r not in self.cut]
            self.cut.update(r for r, _ in late)
        for r, peer in late:
            log(f"HTTP {peer}: no whole request within {self.timeout_s:g} s: closed")
            try:
                r.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._refused_line()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a broken pipe, a reset, a timeout) is nothing to log; anything else one line."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)) or self.was_cut(request):
            return
        log(f"HTTP {client_address[0]}: {type(exc).__name__}: {exc}")

    # -- life ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self.overflow.start()
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.overflow.stop()
        self.server_close()
        with self.lock:
            open_now = list(self.deadlines)
            self.cut.update(open_now)
        for r in open_now:
            try:
                r.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
