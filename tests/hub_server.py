"""A stand-in for the Hugging Face Hub on 127.0.0.1 (``http.server``): the routes and headers
``huggingface_hub`` downloads by."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import pathlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class FakeHub:
    """``hub.add("org/name", folder, branch="main")`` publishes ``folder``'s files as a commit
    of that branch; ``hub.requests`` lists the paths asked for."""

    def __init__(self) -> None:
        self.url, self.requests = "", []
        self.routes: dict[str, tuple[bytes, str]] = {}
        self.revisions: dict[str, set[str]] = {}

    def add(self, repo: str, folder: str, branch: str = "main") -> str:
        """Publish the files of ``folder`` (read now) as the head of ``branch``; its commit id."""
        data = {n: pathlib.Path(folder, n).read_bytes() for n in sorted(os.listdir(folder))}
        commit = hashlib.sha1(b"".join(n.encode() + b for n, b in data.items())).hexdigest()
        tree = [{"type": "file", "path": n, "size": len(b), "oid": commit} for n, b in data.items()]
        self.routes[f"/api/models/{repo}/tree/{commit}"] = (json.dumps(tree).encode(), commit)
        for rev in (branch, commit):
            self.revisions.setdefault(repo, set()).add(rev)
            info = json.dumps({"id": repo, "sha": commit}).encode()
            self.routes[f"/api/models/{repo}/revision/{rev}"] = (info, commit)
            for name, body in data.items():
                self.routes[f"/{repo}/resolve/{rev}/{name}"] = (body, commit)
        return commit


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.hub.requests.append(f"{self.command} {path}")
        body, commit = self.hub.routes.get(path, (b"", ""))
        self.send_response(200 if commit else 404)
        if commit:
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
        else:
            parts = path.strip("/").split("/")
            api = parts[0] == "api"
            revisions = self.hub.revisions.get("/".join(parts[2:4] if api else parts[:2]))
            revision = (parts[5:6] if api else parts[3:4]) or [""]
            code = "EntryNotFound" if revision[0] in (revisions or ()) else "RevisionNotFound"
            self.send_header("X-Error-Code", code if revisions else "RepoNotFound")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_HEAD = do_GET


@contextmanager
def serve_hub(monkeypatch) -> Iterator[FakeHub]:
    """A :class:`FakeHub` on a free port, ``huggingface_hub``'s Hub until the block ends."""
    from huggingface_hub import constants

    hub = FakeHub()
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
