"""One storage layer: local paths and URIs (``file://``, ``s3://`` ...) through fsspec, wrapped
as a pyarrow filesystem for Arrow and Ray.

``s3://`` goes through s3fs: ``AWS_ENDPOINT_URL(_S3)``, the AWS credential chain, and botocore's
``standard`` retries (exponential backoff, jitter) for :func:`attempts` attempts; a request that
still fails is a :class:`StorageError` naming the URI. Every file is written to a hidden
temporary name and renamed (:func:`atomic_path`). :class:`OutputLock`: one writer per output
folder (a ``flock`` on local disks, a renewed lease object on object stores).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import posixpath
import socket
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

LOCK_NAME = "_LOCK"
LEASE_NAME = "_LEASE.json"  # on object stores; ``_LOCK`` with a flock on local disks
LEASE_TTL = 120.0
LEASE_RENEW = 30.0
LEASE_SETTLE = 1.0
#: Attempts of one object-store request, the first included (``$ASYMVLM_STORAGE_ATTEMPTS``).
DEFAULT_ATTEMPTS = 10
#: Rounds of s3fs's own retry loop around botocore's (it retries a body broken off mid-read).
S3FS_ROUNDS = 2

join = posixpath.join


class StorageError(AsymVLMError, OSError):
    """A storage request that failed for good (after its retries); the message names the URI."""


def attempts() -> int:
    """Attempts of one object-store request (``$ASYMVLM_STORAGE_ATTEMPTS``, default 10)."""
    raw = os.environ.get("ASYMVLM_STORAGE_ATTEMPTS", "")
    try:
        return max(1, int(raw)) if raw else DEFAULT_ATTEMPTS
    except ValueError:
        raise StorageError(
            f"$ASYMVLM_STORAGE_ATTEMPTS={raw!r}: expected a number of attempts (>= 1)"
        ) from None


@contextmanager
def named_failures(uri: str) -> Iterator[None]:
    """A request's final failure as a :class:`StorageError` naming ``uri`` (a missing file
    stays a ``FileNotFoundError``)."""
    try:
        yield
    except (FileNotFoundError, StorageError):
        raise
    except OSError as exc:
        retried = f" (after {attempts()} attempts)" if is_remote(uri) else ""
        raise StorageError(
            f"{uri}: {' '.join(str(exc).split()) or type(exc).__name__}{retried}"
        ) from exc


def is_remote(root: str) -> bool:
    """True for an object-store or other non-local URI (``s3://``, ``gs://`` ...)."""
    root = os.fspath(root)
    return "://" in root and not root.lower().startswith("file://")


def fsspec_filesystem(url: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """``(fsspec filesystem, path)`` for a local path or URL (s3: endpoint and retries)."""
    url = os.fspath(url)
    if fsspec.utils.get_protocol(url) not in ("s3", "s3a"):
        return fsspec.core.url_to_fs(url)
    retries = {"mode": "standard", "max_attempts": attempts()}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, Any] = {"config_kwargs": {"retries": retries}}
    if endpoint:
        options["endpoint_url"] = endpoint
    fs, path = fsspec.core.url_to_fs(url, **options)
    fs.retries = S3FS_ROUNDS
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
    if not is_remote(uri):
        return filesystem(uri)[1], None
    fs, path = filesystem(uri)
    return path, fs


def display(root: str, path: str) -> str:
    """How a filesystem path is shown in messages: with the root's scheme if it had one."""
    return f"{os.fspath(root).split('://', 1)[0]}://{path}" if is_remote(root) else path


@contextmanager
def atomic_path(uri: str) -> Iterator[tuple[pafs.FileSystem, str]]:
    """``(filesystem, hidden temporary path)`` beside ``uri`` to write; renamed onto ``uri``
    when the block ends, deleted when it fails. The one atomic write of the project."""
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
    """The whole file at ``uri``, or None if there is none. On object stores one plain GET
    without cache: a file rewritten while it is read gives the old or the new content."""
    fs, path = fsspec_filesystem(uri)
    try:
        with named_failures(uri):
            fs.invalidate_cache(path)
            return fs.cat_file(path)
    except (FileNotFoundError, IsADirectoryError):
        return None


def read_text(uri: str) -> str:
    """The text at ``uri``; FileNotFoundError if there is none."""
    raw = read_bytes(uri)
    if raw is None:
        raise FileNotFoundError(uri)
    return raw.decode("utf-8")


def write_json(root: str, relative: str, payload: dict[str, Any]) -> None:
    """Atomically write a JSON file at ``ROOT/relative``."""
    write_text(uri_join(root, relative), json.dumps(payload, indent=2, sort_keys=True))


def read_json(root: str, relative: str) -> dict[str, Any] | None:
    """``ROOT/relative`` parsed as JSON, or None if the file does not exist."""
    raw = read_bytes(uri_join(root, relative))
    return None if raw is None else json.loads(raw.decode())


# -- one writer at a time ----------------------------------------------------------------------
def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _holder(info: dict[str, Any] | None) -> str:
    """``pid 123 on host-a since ...`` from a lock file's / lease's JSON (or "unknown")."""
    if not info:
        return "holder unknown"
    text = f"pid {info.get('pid', '?')} on {info.get('host', '?')}"
    if isinstance(info.get("since"), int | float):
        text += f", since {_when(info['since'])}"
    return text


class OutputLock:
    """Exclusive hold of ``ROOT/folder`` by one writer: a ``flock`` on ``_LOCK`` locally (the
    kernel drops it with its process); on object stores a ``_LEASE.json`` renewed every
    ``renew_every`` s, valid ``ttl`` s, taken over once expired, with a write-wait-reread
    handshake (``settle``) between writers starting together.

    Another holder is a :class:`~asymvlm.errors.LockError` naming it; ``wait`` > 0 retries that
    many seconds first; :meth:`check` raises once the lease was lost.
    """

    def __init__(
        self,
        root: str,
        folder: str,
        *,
        name: str = "",
        wait: float = 0.0,
        ttl: float = LEASE_TTL,
        renew_every: float = LEASE_RENEW,
        settle: float = LEASE_SETTLE,
        log=None,
    ) -> None:
        self.root, self.wait, self.ttl = os.fspath(root), wait, ttl
        self.renew_every, self.settle = renew_every, settle
        self.fs, base = filesystem(self.root)
        self.dir = join(base, folder) if folder else base
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        suffix = f".{name}" if name else ""
        self.path = join(self.dir, f"{LOCK_NAME}{suffix}" if self.local else f"_LEASE{suffix}.json")
        self.shown, self.uri = display(self.root, self.dir), display(self.root, self.path)
        self.owner = uuid.uuid4().hex
        self._log = log or logger.warning
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: str | None = None
        self._expires = self._since = 0.0

    def acquire(self) -> OutputLock:
        deadline = time.monotonic() + self.wait
        while True:
            try:
                self._acquire_local() if self.local else self._acquire_lease()
                return self
            except LockError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(0.2, left))

    def check(self) -> None:
        """Raise :class:`LockError` if this writer no longer holds the output."""
        if self._lost is not None:
            raise LockError(
                f"{self.shown}: this job lost its write lease ({self._lost}); stopped before "
                "writing more -- re-run it once the other writer is done"
            )

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor drops the flock
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            current = self._read_lease()
            if current is not None and current.get("owner") == self.owner:
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
                raw = os.pread(fd, 4096, 0)
                info = json.loads(raw.decode()) if raw.strip() else None
            except (OSError, ValueError):
                info = None
            os.close(fd)
            raise LockError(
                f"{self.shown} is being written by another job ({_holder(info)}); wait for it "
                "to finish or choose another --output"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**self._info(), "since": time.time()}).encode(), 0)
        self._fd = fd

    def _read_lease(self) -> dict[str, Any] | None:
        raw = read_bytes(self.uri)  # the lease may be rewritten while it is read
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
        info["expires_utc"] = _when(self._expires)
        with self.fs.open_output_stream(self.path) as out:
            out.write(json.dumps(info, indent=2).encode())

    def _acquire_lease(self) -> None:
        self.fs.create_dir(self.dir, recursive=True)
        current = self._read_lease()
        now = time.time()
        if current is not None and current.get("owner") != self.owner:
            expires = current.get("expires")
            if isinstance(expires, int | float) and expires > now:
                raise LockError(
                    f"{self.shown} is being written by another job ({_holder(current)}); its "
                    f"lease expires at {_when(expires)} ({expires - now:.0f} s from now) unless "
                    "renewed -- wait for it to finish or choose another --output"
                )
            self._log(f"taking over the expired lease on {self.shown} ({_holder(current)})")
        self._since = time.time()
        self._write_lease()
        if self.settle > 0:
            time.sleep(self.settle)
        current = self._read_lease()
        if current is None or current.get("owner") != self.owner:
            raise LockError(
                f"{self.shown} is being written by another job ({_holder(current)}), which "
                "took the lease at the same time; wait for it to finish or choose another --output"
            )
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew, name="lease-renewal", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                current = self._read_lease()
                if current is None or current.get("owner") != self.owner:
                    self._lost = f"now held by {_holder(current)}"
                    self._log(f"{self.shown}: lease lost ({self._lost})")
                    return
                self._write_lease()
            except Exception as exc:  # network trouble: retry until the lease would expire
                self._log(f"{self.shown}: could not renew the lease ({exc})")
                if time.time() >= self._expires:
                    self._lost = "it expired while it could not be renewed"
                    return


# -- whole files and folders by URI -------------------------------------------------------------
def absolute(location: str) -> str:
    """A location in the one spelling every record uses: a local path absolute (``file://``
    and ``~`` resolved), an object-store URI without a trailing slash."""
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


def uri_of(fs: pafs.FileSystem, path: str) -> str:
    """The URI of ``path`` on ``fs`` (inverse of :func:`filesystem`)."""
    if isinstance(fs, pafs.PyFileSystem):
        return fs.handler.fs.unstrip_protocol(path)
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    scheme = {"gcs": "gs"}.get(fs.type_name, fs.type_name)
    return f"{scheme}://{path.lstrip('/')}"
