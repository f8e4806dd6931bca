"""A stand-in for the Hugging Face Hub on 127.0.0.1: ``http.server`` serving a folder laid out
as the Hub's routes that ``huggingface_hub`` downloads by (``api/models/REPO/revision/REV``,
``api/models/REPO/tree/COMMIT``, ``REPO/resolve/REV/FILE``), plus the headers it reads
(``X-Repo-Commit``, ``ETag``, ``X-Error-Code``)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import pathlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class FakeHub:
    """``hub.add("org/name", folder, branch="main")`` publishes ``folder``'s files as a commit
    of that branch; ``hub.requests`` lists the paths asked for."""

    def __init__(self, root: str) -> None:
        self.root, self.url, self.requests = root, "", []

    def add(self, repo: str, folder: str, branch: str = "main") -> str:
        """Publish the files of ``folder`` (read now) as the head of ``branch``; returns the
        commit id."""
        data = {n: pathlib.Path(folder, n).read_bytes() for n in sorted(os.listdir(folder))}
        commit = hashlib.sha1(b"".join(n.encode() + b for n, b in data.items())).hexdigest()
        resolve, api = os.path.join(self.root, repo, "resolve"), f"{self.root}/api/models/{repo}"
        shutil.copytree(folder, os.path.join(resolve, commit), dirs_exist_ok=True)
        if os.path.lexists(os.path.join(resolve, branch)):
            os.remove(os.path.join(resolve, branch))
        os.symlink(commit, os.path.join(resolve, branch))
        os.makedirs(f"{api}/revision", exist_ok=True)
        os.makedirs(f"{api}/tree", exist_ok=True)
        pathlib.Path(api, "revision", branch).write_text(json.dumps({"id": repo, "sha": commit}))
        tree = [{"type": "file", "path": n, "size": len(b), "oid": commit} for n, b in data.items()]
        pathlib.Path(api, "tree", commit).write_text(json.dumps(tree))
        return commit


class _Handler(http.server.SimpleHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, *args) -> None:
        pass

    def _parts(self) -> list[str]:
        return self.path.split("?")[0].strip("/").split("/")

    def send_head(self):
        self.hub.requests.append(f"{self.command} {self.path}")
        return super().send_head()

    def send_error(self, code, message=None, explain=None) -> None:
        parts = self._parts()
        api = parts[:2] == ["api", "models"]
        repo = "/".join(parts[2:4] if api else parts[:2])
        revision = parts[5] if api else (parts[3] if len(parts) > 3 else "")
        where = os.path.join(
            self.hub.root, *(("api/models", repo, "revision") if api else (repo, "resolve"))
        )
        if not os.path.isdir(os.path.join(self.hub.root, repo)):
            self._code = "RepoNotFound"
        elif not os.path.lexists(os.path.join(where, revision)):
            self._code = "RevisionNotFound"
        else:
            self._code = "EntryNotFound"
        super().send_error(code, message, explain)

    def end_headers(self) -> None:
        parts = self._parts()
        if getattr(self, "_code", None):
            self.send_header("X-Error-Code", self._code)
        elif len(parts) > 4 and parts[2] == "resolve":
            path = os.path.join(self.hub.root, *parts)
            commit = os.path.basename(os.path.realpath(os.path.dirname(path)))
            self.send_header("X-Repo-Commit", commit)
            with open(path, "rb") as fh:
                self.send_header("ETag", f'"{hashlib.sha1(fh.read()).hexdigest()}"')
        super().end_headers()


@contextmanager
def serve_hub() -> Iterator[FakeHub]:
    """A :class:`FakeHub` served on 127.0.0.1 (a free port) until the block ends; ``hub.url``
    is its endpoint (``HF_ENDPOINT``)."""
    with tempfile.TemporaryDirectory() as root:
        hub = FakeHub(root)
        handler = type("Handler", (_Handler,), {"hub": hub})
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=root)
        )
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        hub.url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            yield hub
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
