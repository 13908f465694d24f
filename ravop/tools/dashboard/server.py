"""The dashboard's HTTP server. Read-only: the one action, cancelling a graph, needs the admin token given
when the server was started (sent as `Authorization: Bearer TOKEN`); without one configured it is refused.
It binds to 127.0.0.1 unless told otherwise.

GET  /                               the page (static/index.html)
GET  /static/NAME                    its script and style sheet
GET  /metrics                        Prometheus metrics of the token's graphs and the live workers
                                     (ravop.tools.graph_metrics)
GET  /api/status                     `ravop status --json`, plus admin: whether cancelling is enabled
GET  /api/graphs/REF/dag             subgraphs and edges with their states (`ravop.tools.status.subgraph_dag`)
GET  /api/graphs/REF/losses          training and validation losses, at most ~1,000 points (`loss_points`)
GET  /api/graphs/REF/failures        failures, newest first (`ravop.tools.status.failures`)
POST /api/graphs/REF/cancel          cancel the graph (admin token required)
REF is a graph id or name of the dashboard's token.
"""
import hmac
import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import unquote, urlsplit

import redis
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ...client import training_losses
from ...core.errors import RavopError
from ...store.lookup import GraphNotFound, find_graph
from .. import status
from ..graph_metrics import GraphCollector
from . import loss_points

log = logging.getLogger("ravop.tools.dashboard")
_STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8"}


def _static_files():
    """name -> (content type, bytes) of the shipped static files, read once."""
    files = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if suffix in _STATIC_TYPES:
            files[entry.name] = (_STATIC_TYPES[suffix], entry.read_bytes())
    return files


class Dashboard:
    """Serves the dashboard of `token`'s graphs and all workers of the server `client` talks to."""

    def __init__(self, client, token, host="127.0.0.1", port=0, admin_token=None):
        self.client, self.token, self.admin_token = client, token, admin_token
        self.static = _static_files()
        self.metrics = GraphCollector(client, token).registry()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self._thread = None

    @property
    def url(self):
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self):
        """Serve on a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="ravop-dashboard", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self):
        self.httpd.serve_forever()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def is_admin(self, header):
        if not self.admin_token or not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer "):].encode(), self.admin_token.encode())

    # ------------------------------------------------------------------------------------------ endpoints

    def get(self, path):
        """(status, body object) of a GET on an /api path."""
        if path == "/api/status":
            return HTTPStatus.OK, {**status.cluster(self.client, self.token), "admin": bool(self.admin_token)}
        keys, what = self._graph(path)
        if what == "dag":
            dag = status.subgraph_dag(self.client, keys)
            return (HTTPStatus.OK, dag) if dag else (HTTPStatus.NOT_FOUND, {"error": "graph is gone"})
        if what == "losses":
            return HTTPStatus.OK, loss_points.curve(training_losses.read(self.client, keys))
        if what == "failures":
            return HTTPStatus.OK, {"failures": status.failures(self.client, keys)}
        return HTTPStatus.NOT_FOUND, {"error": f"no endpoint {path}"}

    def post(self, path, authorization):
        keys, what = self._graph(path)
        if what != "cancel":
            return HTTPStatus.NOT_FOUND, {"error": f"no endpoint {path}"}
        if not self.is_admin(authorization):
            why = "this dashboard is read-only (start it with --admin-token)" if not self.admin_token else \
                "a valid admin token is required"
            return HTTPStatus.FORBIDDEN, {"error": why}
        return HTTPStatus.OK, {"graph": keys.graph_id,
                               "cancelled": status.cancel(self.client, keys, origin="the dashboard")}

    def _graph(self, path):
        parts = path.split("/")
        if len(parts) != 5 or parts[:3] != ["", "api", "graphs"]:
            return None, None
        return find_graph(self.client, self.token, unquote(parts[3])), parts[4]


def _handler(dashboard):
    class Handler(BaseHTTPRequestHandler):
        server_version = "ravop-dashboard"

        def do_GET(self):
            path = urlsplit(self.path).path
            if path == "/":
                path = "/static/index.html"
            if path == "/metrics":
                try:
                    self._send(HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(dashboard.metrics))
                except (RavopError, redis.RedisError) as exc:
                    self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain", str(exc).encode())
                return
            if path.startswith("/static/"):
                found = dashboard.static.get(path[len("/static/"):])
                if found is None:
                    self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found")
                else:
                    self._send(HTTPStatus.OK, *found)
                return
            self._api(lambda: dashboard.get(path))

        def do_POST(self):
            path = urlsplit(self.path).path
            self._api(lambda: dashboard.post(path, self.headers.get("Authorization")))

        def _api(self, call):
            try:
                code, body = call()
            except GraphNotFound as exc:
                code, body = HTTPStatus.NOT_FOUND, {"error": str(exc)}
            except (RavopError, ValueError) as exc:
                code, body = HTTPStatus.BAD_REQUEST, {"error": str(exc)}
            except redis.RedisError as exc:
                code, body = HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"Redis: {exc}"}
            self._send(code, "application/json", json.dumps(body).encode())

        def _send(self, code, content_type, body):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):  # noqa: A002 - the base class's signature
            log.debug("%s " + format, self.address_string(), *args)

    return Handler
