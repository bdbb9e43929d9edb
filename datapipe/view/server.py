"""The HTTP server of ``datapipe view``: the standard library's threaded server, read-only and local.

- It binds 127.0.0.1 unless told otherwise (``--host``). On loopback a request must name this server
  in its Host header (127.0.0.1, localhost or [::1] and the port), so a web page that rebinds its own
  domain name to 127.0.0.1 cannot read the run. Bound to any other address, every request must carry
  the random token printed at start (``?token=``; the first such request sets a same-site cookie, so
  links need not carry it); without it, 403.
- GET and HEAD only; nothing the server does writes (the SQL connection is ``audit.sql``'s confined one).
- Every response forbids scripts but the server's own file (``Content-Security-Policy``), framing,
  inline styles, forms to elsewhere and sniffing a text file as HTML; pages are rendered server-side
  by Jinja2 with autoescaping, so document text is always text.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from datapipe.errors import DatapipeError

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
COOKIE = "datapipe_view_token"
STATIC = {
    "view.css": "text/css; charset=utf-8",
    "view.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


class ViewError(DatapipeError):
    """The server cannot start (a port in use, an address that is not this machine's)."""


@dataclass
class Response:
    status: int = 200
    body: bytes | Iterator[bytes] = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    done: Callable[[], None] | None = None  # run once the response is sent, or not (frees a streamed query)


@dataclass
class Request:
    path: str  # percent-decoded
    params: dict[str, str]


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class Handler(BaseHTTPRequestHandler):
    server: ViewServer
    protocol_version = "HTTP/1.1"
    server_version = "datapipe-view"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        if self.server.verbose:
            sys.stderr.write("view: " + format % args + "\n")

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's names)
        self._serve(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(head=False)

    def _refuse_method(self) -> None:
        self.close_connection = True  # its body, if any, is not read: the connection cannot carry another request
        headers = {"Allow": "GET, HEAD", "Connection": "close"}
        self._send(Response(405, b"read-only: GET and HEAD only\n", "text/plain; charset=utf-8", headers))

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method  # noqa: N815

    def _serve(self, head: bool) -> None:
        refusal = self._refusal()
        if refusal is not None:
            self._send(Response(403, refusal.encode() + b"\n", "text/plain; charset=utf-8"), head)
            return
        split = urlsplit(self.path)
        params = dict(parse_qsl(split.query, keep_blank_values=True))
        extra: dict[str, str] = {}
        if self.server.token is not None and "token" in params:
            params.pop("token")
            extra["Set-Cookie"] = f"{COOKIE}={self.server.token}; HttpOnly; SameSite=Strict; Path=/"
        try:
            response = self.server.app.handle(Request(unquote(split.path), params))
        except Exception:  # a bug: the page says so, the server goes on
            traceback.print_exc()
            response = Response(500, b"internal error: see the terminal that runs datapipe view\n", "text/plain; charset=utf-8")
        response.headers.update(extra)
        self._send(response, head)

    def _refusal(self) -> str | None:
        """Why this request is refused (None: it is not)."""
        token = self.server.token
        if token is None:
            host = (self.headers.get("Host") or "").lower()
            if host not in self.server.host_names:
                return f"refused: Host {host!r} is not this server (open http://{self.server.url_host}/)"
            return None
        given = dict(parse_qsl(urlsplit(self.path).query)).get("token")
        if given is None:
            cookie = SimpleCookie(self.headers.get("Cookie") or "")
            given = cookie[COOKIE].value if COOKIE in cookie else None
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            return "refused: this server needs the token it printed when it started (?token=...)"
        return None

    def _send(self, response: Response, head: bool = False) -> None:
        try:
            self._write(response, head)
        finally:
            if response.done is not None:  # a streamed query's connection and lock, whatever happened
                response.done()

    def _write(self, response: Response, head: bool) -> None:
        body = response.body
        self.send_response(response.status)
        for k, v in {**HEADERS, **response.headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Type", response.content_type)
        if isinstance(body, bytes):
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        self.send_header("Transfer-Encoding", "chunked")  # a CSV download: rows as they come
        self.end_headers()
        if head:
            return
        try:
            for chunk in body:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):  # the browser went away: stop the query
            self.close_connection = True
            return
        except Exception as exc:  # the query failed midway: end the body with the reason
            message = f"\nerror: {exc}\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(message), message))
        self.wfile.write(b"0\r\n\r\n")


class ViewServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, app: Any, host: str, port: int, verbose: bool = False) -> None:
        self.app, self.verbose = app, verbose
        self.token: str | None = None if is_loopback(host) else secrets.token_urlsafe(24)
        if ":" in host:
            self.address_family = socket.AF_INET6
        try:
            super().__init__((host, port), Handler)
        except OSError as exc:
            if exc.errno == 98:
                raise ViewError(f"port {port} on {host} is in use: --port N for another, --port 0 for any free one") from None
            raise ViewError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound_port = self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url_host = f"{shown}:{bound_port}"
        self.host_names = {f"{h}:{bound_port}" for h in ("127.0.0.1", "localhost", "[::1]", shown)}

    @property
    def url(self) -> str:
        url = f"http://{self.url_host}/"
        return url + (f"?token={self.token}" if self.token else "")


def static_file(name: str) -> Response:
    if name not in STATIC:
        return Response(404, b"not found\n", "text/plain; charset=utf-8")
    data = resources.files("datapipe.view").joinpath("static").joinpath(name).read_bytes()
    return Response(200, data, STATIC[name], {"Cache-Control": "max-age=3600"})


def serve_in_thread(server: ViewServer) -> threading.Thread:
    """Run ``server`` in a daemon thread (tests, the bench); ``server.shutdown()`` stops it."""
    thread = threading.Thread(target=server.serve_forever, name="datapipe-view", daemon=True)
    thread.start()
    return thread
