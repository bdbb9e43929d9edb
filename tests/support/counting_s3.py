"""A loopback S3 server (moto) that counts the requests it answers: GET (object reads, ranged or
whole), PUT (object writes, multipart parts and completions), LIST, HEAD and DELETE, and the
bytes read and written. For bench/scaling/scale.py --s3 and tests that measure what a run asks of the store.

    server = CountingS3()            # started; server.url is the endpoint
    before = server.snapshot()
    ...                              # a run against AWS_ENDPOINT_URL=server.url
    used = server.since(before)      # {"GET": n, "PUT": n, "LIST": n, "HEAD": n, ..., "bytes_read": n, "bytes_written": n}
    server.folders                   # Counter: (kind, "/bucket/folder") -> requests, ("bytes_read", folder) -> bytes
    server.client_snapshot()         # Counter: (access key id, kind or "bytes_read"/"bytes_written") -> n

The access key id a request was signed with names its client: give each node of a loopback cluster
its own (``AWS_ACCESS_KEY_ID=node1``; moto accepts any) and the server counts what each node moved.

The counting is a WSGI middleware around moto's own application, so every request the server
answers is counted once, whatever client (boto3, pyarrow's S3 filesystem) sent it.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

KINDS = ("GET", "PUT", "LIST", "HEAD", "DELETE", "OTHER")
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


def client_of(environ: dict[str, Any]) -> str:
    """The access key id a request was signed with (header or presigned query), "?" if unsigned."""
    from urllib.parse import unquote

    m = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", "")) or _CREDENTIAL.search(
        "Credential=" + unquote(environ.get("QUERY_STRING", "")).partition("X-Amz-Credential=")[2]
    )
    return m.group(1) if m else "?"


def request_kind(method: str, path: str, query: str) -> str:
    """What an S3 request is, from its method, path (/bucket/key, path-style) and query string."""
    has_key = len([p for p in path.split("/") if p]) >= 2
    if method == "HEAD":
        return "HEAD"
    if method == "GET":
        return "GET" if has_key and "uploads" not in query else "LIST"
    if method in ("PUT", "POST"):
        return "PUT" if has_key else ("DELETE" if "delete" in query else "OTHER")
    if method == "DELETE":
        return "DELETE"
    return "OTHER"


class _CountingInput:
    def __init__(self, raw: Any) -> None:
        self.raw, self.count = raw, 0

    def read(self, *args: Any) -> bytes:
        data = self.raw.read(*args)
        self.count += len(data)
        return data

    def readline(self, *args: Any) -> bytes:
        data = self.raw.readline(*args)
        self.count += len(data)
        return data

    def __iter__(self) -> Any:
        for line in self.raw:
            self.count += len(line)
            yield line


class _Counting:
    def __init__(
        self,
        app: Callable[..., Iterable[bytes]],
        counts: Counter[str],
        folders: Counter[tuple[str, str]],
        lock: threading.Lock,
        clients: Counter[tuple[str, str]],
    ) -> None:
        self.app, self.counts, self.folders, self.lock, self.clients = app, counts, folders, lock, clients

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        kind = request_kind(environ["REQUEST_METHOD"], path, environ.get("QUERY_STRING", ""))
        # Bytes sent: what the application reads of the request body (chunked uploads have no length).
        environ["wsgi.input"] = stream = _CountingInput(environ["wsgi.input"])
        body = self.app(environ, start_response)
        read = 0
        out = []
        for chunk in body:
            read += len(chunk)
            out.append(chunk)
        if hasattr(body, "close"):
            body.close()
        with self.lock:
            self.counts[kind] += 1
            self.counts["bytes_written"] += stream.count if kind == "PUT" else 0
            self.counts["bytes_read"] += read if kind == "GET" else 0
            # Per folder of the object (a LIST's prefix is in its query: counted under the bucket):
            # what a benchmark needs to tell which files crossed the store.
            folder = path.rsplit("/", 1)[0] if kind in ("GET", "PUT", "HEAD", "DELETE") else path.rstrip("/")
            self.folders[(kind, folder)] += 1
            if kind == "GET":
                self.folders[("bytes_read", folder)] += read
            if kind == "PUT":
                self.folders[("bytes_written", folder)] += stream.count
            client = client_of(environ)
            self.clients[(client, kind)] += 1
            self.clients[(client, "bytes_read")] += read if kind == "GET" else 0
            self.clients[(client, "bytes_written")] += stream.count if kind == "PUT" else 0
        return out


class CountingS3:
    """moto's S3 on 127.0.0.1 (a free port), its requests counted; ``stop()`` shuts it down."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        self.counts: Counter[str] = Counter()
        self.folders: Counter[tuple[str, str]] = Counter()
        self.clients: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        app = _Counting(DomainDispatcherApplication(create_backend_app), self.counts, self.folders, self._lock, self.clients)
        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: self.counts.get(k, 0) for k in (*KINDS, "bytes_read", "bytes_written")}

    def since(self, before: dict[str, int]) -> dict[str, int]:
        now = self.snapshot()
        return {k: now[k] - before.get(k, 0) for k in now}

    def folder_snapshot(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self.folders)

    def client_snapshot(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self.clients)

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)


def serve_for_test(monkeypatch: Any, cache_dir: Any, bucket: str) -> CountingS3:
    """A counting server with this process's AWS settings pointed at it (``monkeypatch`` undoes them),
    datapipe's cache in ``cache_dir`` and ``bucket`` created; the caller stops it."""
    import logging

    import boto3

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = CountingS3()
    for k, v in {
        "AWS_ENDPOINT_URL": server.url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DATAPIPE_CACHE_DIR": str(cache_dir),
    }.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3").create_bucket(Bucket=bucket)
    return server
