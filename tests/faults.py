"""An S3 endpoint that stumbles: :class:`FlakyProxy` forwards requests to moto but, while a fault
window is open (:meth:`FlakyProxy.fail`, or ``POST /__faults__?share=0.3&seconds=15`` to ``python
-m tests.faults --listen PORT --upstream URL``), answers a share of them with a ``503 SlowDown``
or a dropped connection; ``GET /__faults__`` gives the counts as JSON."""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

#: Headers of one connection, not of the request (RFC 9110 section 7.6.1).
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer"}
_SLOW_DOWN = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code></Error>"


class FlakyProxy:
    """A proxy to ``upstream`` (``http://host:port``) on 127.0.0.1 (``port`` 0: any free one) at
    ``url``; deterministic for a given ``seed``."""

    def __init__(self, upstream: str, port: int = 0, seed: int = 0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self._rng, self._lock = random.Random(seed), threading.Lock()
        self.share, self.until = 0.0, 0.0
        self.counts = {"requests": 0, "failed": 0, "503": 0, "drop": 0, "failed_paths": []}
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def fail(self, share: float, seconds: float) -> None:
        """Fail ``share`` of the requests for the next ``seconds``."""
        with self._lock:
            self.share, self.until = share, time.monotonic() + seconds

    def fault(self, path: str) -> str | None:
        """The fault of the request for ``path`` now coming in (None: forward it)."""
        with self._lock:
            self.counts["requests"] += 1
            if time.monotonic() >= self.until or self._rng.random() >= self.share:
                return None
            mode = self._rng.choice(("503", "drop"))
            self.counts["failed"] += 1
            self.counts[mode] += 1
            self.counts["failed_paths"].append(urlsplit(path).path)
            return mode

    def __enter__(self) -> FlakyProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(proxy: FlakyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
            self.send_response(status)
            for key, value in headers:  # a HEAD's length is the object's
                if key.lower() not in _HOP and (key.lower() != "content-length" or self._head):
                    self.send_header(key, value)
            if not self._head:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not self._head:
                self.wfile.write(body)

        def _body(self) -> bytes | None:
            """``Content-Length`` bytes, or the chunks of a chunked body, joined."""
            if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after a chunk
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)

        def _forward(self) -> None:
            self._head = self.command == "HEAD"
            if self.path.startswith("/__faults__"):
                if self.command == "POST":
                    query = parse_qs(urlsplit(self.path).query)
                    proxy.fail(float(query["share"][0]), float(query["seconds"][0]))
                return self._reply(200, json.dumps(proxy.counts).encode(), [])
            body, fault = self._body(), proxy.fault(self.path)
            if fault == "drop":  # the connection goes, no answer
                self.close_connection = True
                return self.connection.close()
            if fault == "503":
                return self._reply(503, _SLOW_DOWN, [("Retry-After", "0")])
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
            finally:
                upstream.close()
            return self._reply(answer.status, data, answer.getheaders())

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815

    return Handler


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="an S3 endpoint that stumbles on demand")
    parser.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--upstream", required=True, help="the S3 server, http://host:port")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    FlakyProxy(args.upstream, port=args.listen, seed=args.seed).server.serve_forever()
