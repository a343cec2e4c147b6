"""The agent's HTTP server (the standard library's threading server) and its routes:

    GET  /healthz       liveness: 200 while the agent's loop is alive (a broken store does not fail it: the agent
                        stays up and says what is wrong, rather than restarting in a loop that hides it)
    GET  /readyz        readiness: 200 once the agent has started (its store opened or its error recorded), with
                        what it knows of the API server and the store; 503 before
    GET  /metrics       Prometheus's exposition format (metrics.py)
    GET  /runs          the latest runs, newest first (JSON; ?limit=N, at most 500)
    GET  /runs/ID       one run (JSON)
    POST /runs          a run now: 202 with the queued run, or 409 with the one already queued or running
    GET  /, /status     the status page (gpuvs.report.status.render_status_page over the agent's store, read-only):
                        the nodes that need a look first, each node's speed over time, the latest validate runs

A route is one function of (the agent, the request's path and query) returning a Response; ROUTES maps
(method, path or path prefix ending in /) to it, so a new page is one function and one entry."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Protocol
from urllib.parse import parse_qs, urlsplit

from gpuvs.agent import metrics
from gpuvs.agent.ledger import RunRecord
from gpuvs.agent.state import State


class Agent(Protocol):
    """What the routes ask of the agent (service.Agent; the server never imports it)."""

    state: State
    registry: Any
    started: threading.Event

    def alive(self) -> bool: ...
    def runs(self, limit: int = 50) -> list[RunRecord]: ...
    def run(self, run_id: str) -> RunRecord | None: ...
    def request_run(self, trigger: str) -> tuple[RunRecord, bool]: ...
    def status_page(self) -> str: ...


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"


def _json(status: int, data: Any) -> Response:
    return Response(status, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def healthz(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    ok = agent.alive()
    return Response(200 if ok else 503, b"ok\n" if ok else b"the agent's loop has stopped\n", "text/plain")


def readyz(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    s = agent.state
    with s.lock:
        body = {"ready": agent.started.is_set(), "api_reachable": s.api_ok, "api_error": s.api_error,
                "store_ok": s.store_ok, "store_error": s.store_error}
    return _json(200 if agent.started.is_set() else 503, body)


def metrics_route(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    return Response(200, metrics.exposition(agent.registry), metrics.CONTENT_TYPE)


def runs_list(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    try:
        limit = max(1, min(500, int((query.get("limit") or ["50"])[0])))
    except ValueError:
        return _json(400, {"error": "limit: expected a whole number"})
    return _json(200, [r.to_dict() for r in agent.runs(limit)])


def run_one(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    run_id = path.removeprefix("/runs/")
    found = agent.run(run_id)
    return _json(200, found.to_dict()) if found else _json(404, {"error": f"no run {run_id}"})


def run_now(agent: Agent, path: str, query: dict[str, list[str]]) -> Response:
    run, created = agent.request_run("api")
    return _json(202 if created else 409, run.to_dict() if created else
                 {"error": "a run is already queued or running", "run": run.to_dict()})


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


def handler(agent: Agent) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuvs-agent"

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            fn = route(method, url.path.rstrip("/") or "/") or route(method, url.path)
            if fn is None:
                known = any(p == url.path for _, p in ROUTES)
                resp = _json(405 if known else 404, {"error": f"{method} {url.path}: "
                                                     + ("method not allowed" if known else "no such route")})
            else:
                try:
                    resp = fn(agent, url.path.rstrip("/") or "/", parse_qs(url.query))
                except Exception as exc:  # one request's failure is its 500, never the server's end
                    resp = _json(500, {"error": f"{type(exc).__name__}: {exc}"})
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            self.send_header("Content-Length", str(len(resp.body)))
            self.end_headers()
            self.wfile.write(resp.body)

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(min(length, 65536))
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: not logged
            return

    return Handler


class Server:
    def __init__(self, agent: Agent, host: str, port: int):
        self.httpd = ThreadingHTTPServer((host, port), handler(agent))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="gpuvs-agent-http", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
