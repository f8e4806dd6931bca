"""One storage layer: local paths and URIs (``file://``, ``s3://`` ...) through fsspec, wrapped
as a pyarrow filesystem for Arrow and Ray; atomic writes (:func:`atomic_path`) and one writer per
output folder (:class:`OutputLock`). A request that fails for good is a :class:`StorageError`."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import posixpath
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsspec
import pyarrow.fs as pafs

from asymvlm.errors import AsymVLMError, LockError

logger = logging.getLogger(__name__)

LOCK_NAME, LEASE_NAME = "_LOCK", "_LEASE.json"  # a flock locally, a lease on object stores
join = posixpath.join


class StorageError(AsymVLMError, OSError):
    """A storage request that failed for good (after its retries); the message names the URI."""


def attempts() -> int:
    """Attempts of one object-store request (``$ASYMVLM_STORAGE_ATTEMPTS``, default 10)."""
    raw = os.environ.get("ASYMVLM_STORAGE_ATTEMPTS") or "10"
    if not raw.isdigit() or int(raw) < 1:
        raise StorageError(f"$ASYMVLM_STORAGE_ATTEMPTS={raw!r}: expected a number of attempts")
    return int(raw)


@contextmanager
def named_failures(uri: str) -> Iterator[None]:
    """A request's final failure as a :class:`StorageError` naming ``uri`` (not a missing file);
    botocore's own errors (no credentials, an endpoint that does not answer) included."""
    try:
        yield
    except (FileNotFoundError, StorageError):
        raise
    except Exception as exc:
        botocore = sys.modules.get("botocore.exceptions")  # loaded if s3fs made the request
        if not isinstance(exc, (OSError, *((botocore.BotoCoreError,) if botocore else ()))):
            raise
        detail = " ".join(str(exc).split()) or type(exc).__name__
        if botocore and isinstance(exc, botocore.NoCredentialsError):  # not retried
            detail += " (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        elif is_remote(uri):
            detail += f" (after {attempts()} attempts)"
        raise StorageError(f"{uri}: {detail}") from exc


def is_remote(root: str) -> bool:
    """True for an object-store or other non-local URI (``s3://``, ``gs://`` ...)."""
    root = os.fspath(root)
    return "://" in root and not root.lower().startswith("file://")


def fsspec_filesystem(url: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """``(fsspec filesystem, path)`` for a local path or URL (s3: endpoint and retries)."""
    url = os.fspath(url)
    if fsspec.utils.get_protocol(url) not in ("s3", "s3a"):
        return fsspec.core.url_to_fs(url)
    options: dict[str, Any] = {
        "config_kwargs": {"retries": {"mode": "standard", "max_attempts": attempts()}}
    }
    if endpoint := os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
        options["endpoint_url"] = endpoint
    fs, path = fsspec.core.url_to_fs(url, **options)
    fs.retries = 2  # s3fs's own loop around botocore's: it retries a body broken off mid-read
    return fs, path


def filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """``(pyarrow filesystem, path)`` for a local path or a URI: the fsspec one, wrapped."""
    root = os.fspath(root)
    if not is_remote(root):
        local = os.path.abspath(root.removeprefix("file://"))
        return pafs.LocalFileSystem(), local.replace(os.sep, "/")
    fs, path = fsspec_filesystem(root)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path.rstrip("/")


def ray_storage(uri: str) -> tuple[str, pafs.FileSystem | None]:
    """``(storage_path, storage_filesystem)`` for Ray's ``RunConfig`` and ``Checkpoint``."""
    fs, path = filesystem(uri)
    return path, fs if is_remote(uri) else None


def uri_of(fs: pafs.FileSystem, path: str) -> str:
    """The URI of ``path`` on a filesystem of :func:`filesystem` (its inverse)."""
    if isinstance(fs, pafs.PyFileSystem):
        return fs.handler.fs.unstrip_protocol(path)
    return path


def display(root: str, path: str) -> str:
    """How a filesystem path is shown in messages: with the root's scheme if it had one."""
    return f"{os.fspath(root).split('://', 1)[0]}://{path}" if is_remote(root) else path


@contextmanager
def atomic_path(uri: str) -> Iterator[tuple[pafs.FileSystem, str]]:
    """``(filesystem, hidden temporary path)`` to write, renamed onto ``uri`` at the block's end."""
    fs, path = filesystem(uri)
    folder, name = posixpath.split(path)
    tmp = join(folder, f".{name}.tmp-{uuid.uuid4().hex}")
    with named_failures(uri):
        fs.create_dir(folder, recursive=True)
    try:
        yield fs, tmp
        with named_failures(uri):
            fs.move(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):  # cleanup while the error propagates
            fs.delete_file(tmp)
        raise


def write_bytes(uri: str, data: bytes) -> str:
    """Atomically write ``data`` to ``uri``; returns ``uri``."""
    with atomic_path(uri) as (fs, tmp), named_failures(uri), fs.open_output_stream(tmp) as out:
        out.write(data)
    return uri


def write_text(uri: str, text: str) -> str:
    """Atomically write ``text`` (UTF-8) to ``uri``; returns ``uri``."""
    return write_bytes(uri, text.encode("utf-8"))


def read_bytes(uri: str) -> bytes | None:
    """The whole file at ``uri`` by one uncached GET (None: there is none)."""
    fs, path = fsspec_filesystem(uri)
    try:
        with named_failures(uri):
            fs.invalidate_cache(path)
            return fs.cat_file(path)
    except (FileNotFoundError, IsADirectoryError):
        return None


def read_text(uri: str) -> str:
    """The text at ``uri``; FileNotFoundError if there is none."""
    if (raw := read_bytes(uri)) is None:
        raise FileNotFoundError(uri)
    return raw.decode("utf-8")


def write_json(root: str, relative: str, payload: dict[str, Any]) -> None:
    """Atomically write a JSON file at ``ROOT/relative``."""
    write_text(uri_join(root, relative), json.dumps(payload, indent=2, sort_keys=True))


def read_json(root: str, relative: str) -> Any:
    """``ROOT/relative`` parsed as JSON, or None if the file does not exist."""
    raw = read_bytes(uri_join(root, relative))
    return None if raw is None else json.loads(raw.decode())


def absolute(location: str) -> str:
    """A local path made absolute, an object-store URI without a trailing slash."""
    location = os.fspath(location)
    if is_remote(location):
        return location.rstrip("/") or location
    return os.path.abspath(os.path.expanduser(location.removeprefix("file://")))


def uri_join(root: str, *parts: str) -> str:
    """``root/part/...`` for local paths and URIs alike (empty parts skipped)."""
    return "/".join([os.fspath(root).rstrip("/"), *(p.strip("/") for p in parts if p)])


def exists(uri: str) -> bool:
    """Whether a file or folder exists at ``uri``."""
    fs, path = filesystem(uri)
    with named_failures(uri):
        return fs.get_file_info(path).type != pafs.FileType.NotFound


def list_names(uri: str) -> list[str]:
    """The names of the files directly in folder ``uri``, sorted, hidden ones left out."""
    fs, path = filesystem(uri)
    with named_failures(uri):
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    names = (i.base_name for i in infos if i.type == pafs.FileType.File)
    return sorted(n for n in names if not n.startswith("."))


def upload_dir(local: str, uri: str) -> str:
    """Copy the files of the local folder ``local`` to ``uri``; returns ``uri``."""
    if not is_remote(uri) and os.path.abspath(uri) == os.path.abspath(local):
        return uri
    for folder, _, files in os.walk(local):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), local)
            with open(os.path.join(folder, name), "rb") as fh:
                write_bytes(uri_join(uri, *rel.split(os.sep)), fh.read())
    return uri


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _holder(info: dict[str, Any] | None) -> str:
    """``pid 123 on host-a, since ...`` from a lock's or lease's JSON."""
    if not info:
        return "holder unknown"
    since = info.get("since")
    when = f", since {_when(since)}" if isinstance(since, int | float) else ""
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}{when}"


class OutputLock:
    """Exclusive hold of ``ROOT/folder`` by one writer (docs/data.md): a ``flock`` on ``_LOCK``
    locally, a renewed ``_LEASE.json`` on object stores. Another holder is a :class:`LockError`
    naming it (after retrying ``wait`` s); :meth:`check` raises once the lease was lost."""

    def __init__(
        self,
        root: str,
        folder: str,
        *,
        name: str = "",
        wait: float = 0.0,
        ttl: float = 120.0,
        renew_every: float = 30.0,
        settle: float = 1.0,
        log=None,
    ) -> None:
        self.root, self.wait, self.ttl = root, wait, ttl
        self.renew_every, self.settle = renew_every, settle
        self.fs, base = filesystem(root)
        self.dir = join(base, folder) if folder else base
        self.local = not is_remote(root)
        suffix = f".{name}" if name else ""
        self.path = join(self.dir, f"{LOCK_NAME}{suffix}" if self.local else f"_LEASE{suffix}.json")
        self.shown, self.uri = display(root, self.dir), display(root, self.path)
        self.owner, self._log = uuid.uuid4().hex, log or logger.warning
        self._fd: int | None = None
        self._stop, self._thread = threading.Event(), None
        self._lost: str | None = None
        self._expires = self._since = 0.0

    def _busy(self, info: dict[str, Any] | None, detail: str = "; ") -> LockError:
        return LockError(
            f"{self.shown} is being written by another job ({_holder(info)}){detail}wait for "
            "it to finish or choose another --output"
        )

    def acquire(self) -> OutputLock:
        deadline = time.monotonic() + self.wait
        while True:
            try:
                self._acquire_local() if self.local else self._acquire_lease()
                return self
            except LockError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def check(self) -> None:
        """Raise :class:`LockError` if this writer no longer holds the output."""
        if self._lost is not None:
            raise LockError(
                f"{self.shown}: this job lost its write lease ({self._lost}); stopped before "
                "writing more -- re-run it once the other writer is done"
            )

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            if (self._read_lease() or {}).get("owner") == self.owner:
                self.fs.delete_file(self.path)
        except Exception as exc:  # the lease expires by itself
            self._log(f"could not remove {self.uri}: {exc}")

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _info(self) -> dict[str, Any]:
        return {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid()}

    def _acquire_local(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                info = json.loads(os.pread(fd, 4096, 0).decode() or "null")
            except (OSError, ValueError):
                info = None
            os.close(fd)
            raise self._busy(info) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**self._info(), "since": time.time()}).encode(), 0)
        self._fd = fd

    def _read_lease(self) -> dict[str, Any] | None:
        raw = read_bytes(self.uri)
        if raw is None:
            return None
        try:
            info = json.loads(raw.decode())
        except ValueError:
            return {}
        return info if isinstance(info, dict) else {}

    def _write_lease(self) -> None:
        self._expires = time.time() + self.ttl
        info = {**self._info(), "since": self._since, "expires": self._expires, "ttl": self.ttl}
        with self.fs.open_output_stream(self.path) as out:
            out.write(json.dumps({**info, "expires_utc": _when(self._expires)}).encode())

    def _acquire_lease(self) -> None:
        self.fs.create_dir(self.dir, recursive=True)
        current, now = self._read_lease(), time.time()
        if current is not None and current.get("owner") != self.owner:
            expires = current.get("expires")
            if isinstance(expires, int | float) and expires > now:
                left = f"; its lease expires at {_when(expires)} ({expires - now:.0f} s from now)"
                raise self._busy(current, left + " unless renewed -- ")
            self._log(f"taking over the expired lease on {self.shown} ({_holder(current)})")
        self._since = time.time()
        self._write_lease()
        time.sleep(self.settle)
        current = self._read_lease()
        if current is None or current.get("owner") != self.owner:
            raise self._busy(current, ", which took the lease at the same time; ")
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew, name="lease-renewal", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                current = self._read_lease()
                if current is None or current.get("owner") != self.owner:
                    self._lost = f"now held by {_holder(current)}"
                    return self._log(f"{self.shown}: lease lost ({self._lost})")
                self._write_lease()
            except Exception as exc:  # network trouble: retry until the lease would expire
                self._log(f"{self.shown}: could not renew the lease ({exc})")
                if time.time() >= self._expires:
                    self._lost = "it expired while it could not be renewed"
                    return None
