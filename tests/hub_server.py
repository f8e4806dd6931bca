"""A stand-in for the Hugging Face Hub on 127.0.0.1: the routes ``huggingface_hub`` uses to
download a model repository (``snapshot_download``), serving local folders.

* ``GET /api/models/ORG/NAME/revision/REV`` -- the repository's info at a revision (its commit);
* ``GET /api/models/ORG/NAME/tree/REV`` -- the files of that commit (recursive listing);
* ``HEAD``/``GET /ORG/NAME/resolve/REV/FILE`` -- a file's metadata (commit, ETag, size) and bytes;

unknown repositories, revisions and files answer 404 with the Hub's ``X-Error-Code``. A
repository's revisions are branch or tag names and commits, each a folder whose contents are the
files of that commit (the commit id is a hash of the folder's files).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager


def _commit_of(folder: str) -> str:
    digest = hashlib.sha1()
    for name in sorted(os.listdir(folder)):
        digest.update(name.encode())
        with open(os.path.join(folder, name), "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()


class FakeHub:
    """Repositories served by :func:`serve_hub`: ``hub.add("org/name", folder, branch="main")``
    publishes ``folder``'s files as a commit of that branch (tags work the same way)."""

    def __init__(self) -> None:
        self.refs: dict[str, dict[str, str]] = {}  # repo -> ref or commit -> commit
        self.commits: dict[str, dict[str, bytes]] = {}  # commit -> {file: bytes}
        self.requests: list[str] = []
        self.url = ""

    def add(self, repo: str, folder: str, branch: str = "main") -> str:
        """Publish the files of ``folder`` (read now) as the head of ``branch``; returns the
        commit id."""
        commit = _commit_of(folder)
        files = {}
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as fh:
                files[name] = fh.read()
        self.commits[commit] = files
        refs = self.refs.setdefault(repo, {})
        refs[branch] = commit
        refs[commit] = commit
        return commit


def _handler(hub: FakeHub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _error(self, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, payload: object) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _commit(self, repo: str, revision: str) -> str | None:
            if repo not in hub.refs:
                self._error("RepoNotFound", f"Repository {repo} not found")
                return None
            commit = hub.refs[repo].get(revision)
            if commit is None:
                self._error("RevisionNotFound", f"Invalid rev id: {revision}")
            return commit

        def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
            self._serve()

        def do_GET(self) -> None:  # noqa: N802
            self._serve()

        def _serve(self) -> None:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            hub.requests.append(f"{self.command} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6:
                repo, kind, revision = "/".join(parts[2:4]), parts[4], parts[5]
                commit = self._commit(repo, revision)
                if commit is None:
                    return
                files = hub.commits[commit]
                if kind == "revision":
                    self._json(
                        {
                            "id": repo,
                            "modelId": repo,
                            "sha": commit,
                            "private": False,
                            "siblings": [{"rfilename": n} for n in files],
                        }
                    )
                elif kind == "tree":
                    self._json(
                        [
                            {
                                "type": "file",
                                "path": n,
                                "size": len(b),
                                "oid": hashlib.sha1(b).hexdigest(),
                            }
                            for n, b in files.items()
                        ]
                    )
                else:
                    self._error("EntryNotFound", f"no route {path}")
                return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                commit = self._commit(repo, revision)
                if commit is None:
                    return
                data = hub.commits[commit].get(name)
                if data is None:
                    self._error("EntryNotFound", f"{name} not found")
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", commit)
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)
                return
            self._error("EntryNotFound", f"no route {path}")

    return Handler


@contextmanager
def serve_hub(hub: FakeHub) -> Iterator[FakeHub]:
    """Serve ``hub`` on 127.0.0.1 (a free port) until the block ends; ``hub.url`` is its
    endpoint (``HF_ENDPOINT``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
