"""Faults on demand for the tests: an S3 endpoint that stumbles.

:class:`FlakyProxy` is an HTTP proxy on 127.0.0.1 in front of an S3 server (moto): every request
is forwarded as it is, except -- while a fault window is open -- a share of them, which get a
``503 SlowDown`` S3 error document or a connection dropped without an answer, the two things an
object store under load does. The window is opened from the test (:meth:`FlakyProxy.fail`) or,
when the proxy runs as a process of its own (``python -m tests.faults --listen PORT --upstream
URL``), by ``POST /__faults__?share=0.3&seconds=15`` on the proxy; ``GET /__faults__`` gives its
counts (requests, failed, by kind, the paths failed) as JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: Headers that belong to one connection, not to the request (RFC 9110 section 7.6.1).
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
    }
)
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
CONTROL = "/__faults__"


class FlakyProxy:
    """A proxy to ``upstream`` (``http://host:port``) listening on 127.0.0.1 (``port`` 0: any
    free port); ``url`` is its address. Deterministic for a given ``seed``."""

    def __init__(
        self, upstream: str, port: int = 0, seed: int = 0, modes: tuple[str, ...] = ("503", "drop")
    ) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.modes = modes
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.share, self.until = 0.0, 0.0
        self.counts: dict[str, Any] = {
            "requests": 0,
            "failed": 0,
            "503": 0,
            "drop": 0,
            "failed_paths": [],
        }
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread: threading.Thread | None = None

    # -- the window ---------------------------------------------------------------------------
    def fail(self, share: float, seconds: float) -> None:
        """Fail ``share`` of the requests for the next ``seconds``."""
        with self._lock:
            self.share, self.until = float(share), time.monotonic() + float(seconds)

    def _fault(self, path: str) -> str | None:
        """The fault of the request for ``path`` now coming in (None: forward it)."""
        with self._lock:
            self.counts["requests"] += 1
            if time.monotonic() >= self.until or self._rng.random() >= self.share:
                return None
            mode = self._rng.choice(self.modes)
            self.counts["failed"] += 1
            self.counts[mode] += 1
            if len(self.counts["failed_paths"]) < 1000:
                self.counts["failed_paths"].append(urlsplit(path).path)
            return mode

    # -- serving ------------------------------------------------------------------------------
    def start(self) -> FlakyProxy:
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FlakyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _control(self) -> None:
                if self.command == "POST":
                    query = parse_qs(urlsplit(self.path).query)
                    proxy.fail(float(query["share"][0]), float(query["seconds"][0]))
                body = json.dumps(proxy.counts).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes | None:
                """The request's body: ``Content-Length`` bytes, or the chunks of a chunked one
                (the AWS C++ SDK behind pyarrow sends parts so), joined."""
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()  # the CRLF after a chunk
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _forward(self) -> None:
                if self.path.startswith(CONTROL):
                    return self._control()
                body = self._body()
                fault = proxy._fault(self.path)
                if fault == "drop":  # the connection goes, no answer
                    self.close_connection = True
                    self.connection.close()
                    return None
                if fault == "503":
                    self.send_response(503, "Slow Down")
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(_SLOW_DOWN)))
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(_SLOW_DOWN)
                    return None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():  # a HEAD's length is the object's
                    if key.lower() not in _HOP and (
                        key.lower() != "content-length" or self.command == "HEAD"
                    ):
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                return None

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815

        return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="an S3 endpoint that stumbles on demand")
    parser.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--upstream", required=True, help="the S3 server, http://host:port")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    proxy = FlakyProxy(args.upstream, port=args.listen, seed=args.seed)
    try:
        proxy.server.serve_forever()
    finally:
        proxy.server.server_close()


if __name__ == "__main__":
    main()
