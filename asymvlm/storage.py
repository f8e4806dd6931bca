"""One storage layer: local paths and object-store URIs, resolved in one place.

Every stage reads and writes through these functions, whether ``ROOT`` is a local folder, a
``file://`` URI, ``s3://bucket/prefix`` (through s3fs, so ``AWS_ENDPOINT_URL(_S3)`` and the
standard AWS credential chain apply) or any URI that :func:`pyarrow.fs.FileSystem.from_uri`
understands (``gs://``, ``abfs://``, ``hdfs://`` ...):

* :func:`filesystem` / :func:`fsspec_filesystem`: ``(filesystem, path)`` for a root;
* :func:`write_json` / :func:`read_json` and the atomic writers: write to a hidden temporary
  name, then rename, so a crash never leaves half a file under the final name;
* :class:`OutputLock`: one writer per output folder.

Object stores stumble (throttling -- ``503 SlowDown`` --, dropped connections, timeouts): every
request is retried with exponential backoff and full jitter, by the clients' own retry policies
set here (botocore's ``standard`` mode for s3fs, pyarrow's ``AwsStandardS3RetryStrategy`` for
Ray's checkpoints and Tune's state), up to :func:`attempts` attempts
(``$ASYMVLM_STORAGE_ATTEMPTS``); a request that still fails is a :class:`StorageError` naming
the URI and the error. What is written becomes visible whole or not at all: every file is
written to a hidden temporary name and renamed (one object PUT on object stores), and the
readers that decide "done" look at a marker written last.

One writer at a time (:class:`OutputLock`): a job holds ``ROOT/<split>`` while it writes. On a
local disk that is an OS lock (``flock``) on ``ROOT/<split>/_LOCK``, released by the kernel when
the process ends, however it ends. On object stores (``s3://`` ...) it is a lease object
``ROOT/<split>/_LEASE.json`` (owner id, host, pid, expiry) renewed by a background thread every
``LEASE_RENEW`` seconds and valid for ``LEASE_TTL`` seconds: a writer that finds an unexpired
lease of another owner is refused, an expired one (its holder died) is taken over. Leases assume
clocks synchronised to well within ``LEASE_TTL``; two writers starting within the same second on
an empty output are separated by a write-wait-reread handshake (``LEASE_SETTLE``), and a job that
finds its lease taken stops before its next write (:meth:`OutputLock.check`).
"""

from __future__ import annotations

import contextlib
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

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from asymvlm.errors import AsymVLMError, LockError

try:
    import fcntl
except ImportError:  # not POSIX: local outputs use the lease object too
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "OutputLock",
    "StorageError",
    "absolute",
    "attempts",
    "display",
    "filesystem",
    "fsspec_filesystem",
    "atomic_write_bytes",
    "atomic_write_table",
    "is_remote",
    "list_names",
    "join",
    "read_json",
    "write_json",
]

logger = logging.getLogger(__name__)

LOCK_NAME = "_LOCK"
LEASE_NAME = "_LEASE.json"
LEASE_TTL = 120.0
LEASE_RENEW = 30.0
LEASE_SETTLE = 1.0

join = posixpath.join

#: Attempts of one object-store request, the first included (``$ASYMVLM_STORAGE_ATTEMPTS``).
DEFAULT_ATTEMPTS = 10


class StorageError(AsymVLMError, OSError):
    """A storage request that failed for good (after its retries); the message names the URI."""


def attempts() -> int:
    """Attempts of one object-store request before it fails (``$ASYMVLM_STORAGE_ATTEMPTS``,
    default :data:`DEFAULT_ATTEMPTS`)."""
    raw = os.environ.get("ASYMVLM_STORAGE_ATTEMPTS", "")
    try:
        return max(1, int(raw)) if raw else DEFAULT_ATTEMPTS
    except ValueError:
        raise StorageError(
            f"$ASYMVLM_STORAGE_ATTEMPTS={raw!r}: expected a number of attempts (>= 1)"
        ) from None


@contextmanager
def named_failures(uri: str) -> Iterator[None]:
    """Turn a storage request's final failure into a :class:`StorageError` naming ``uri``
    (a missing file stays a ``FileNotFoundError``, which callers ask about)."""
    try:
        yield
    except (FileNotFoundError, StorageError):
        raise
    except OSError as exc:
        retried = f" (after {attempts()} attempts)" if is_remote(uri) else ""
        raise StorageError(
            f"{uri}: {' '.join(str(exc).split()) or type(exc).__name__}{retried}"
        ) from exc


# Every other boto3 client of the process (MLflow's artifact uploads to S3 among them) retries
# the same way: AWS's standard mode, as many attempts.
os.environ.setdefault("AWS_RETRY_MODE", "standard")
os.environ.setdefault(
    "AWS_MAX_ATTEMPTS", os.environ.get("ASYMVLM_STORAGE_ATTEMPTS") or str(DEFAULT_ATTEMPTS)
)

#: Rounds of s3fs's own retry loop around botocore's retries (it retries a body that broke off
#: while it was read, which botocore does not): the second round is the last.
S3FS_ROUNDS = 2


def _s3fs_options() -> dict[str, Any]:
    """s3fs's settings: ``AWS_ENDPOINT_URL``, and botocore's standard retry mode (exponential
    backoff, full jitter) for :func:`attempts` attempts."""
    options: dict[str, Any] = {
        "config_kwargs": {"retries": {"mode": "standard", "max_attempts": attempts()}}
    }
    endpoint = _endpoint()
    if endpoint:
        options["endpoint_url"] = endpoint
    return options


def _bounded(fs: Any) -> Any:
    """An s3fs filesystem with its own retry loop bounded to :data:`S3FS_ROUNDS` rounds."""
    fs.retries = S3FS_ROUNDS
    return fs


def is_remote(root: str) -> bool:
    """True for an object-store or other non-local URI (``s3://``, ``gs://`` ...)."""
    root = os.fspath(root)
    return "://" in root and not root.lower().startswith("file://")


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def fsspec_filesystem(url: str | os.PathLike) -> tuple[Any, str]:
    """``(fsspec filesystem, path)`` for a local path or URL; s3 honours ``AWS_ENDPOINT_URL``."""
    import fsspec

    url = os.fspath(url)
    options: dict[str, Any] = {}
    if fsspec.utils.get_protocol(url) in ("s3", "s3a"):
        options = _s3fs_options()
    fs, path = fsspec.core.url_to_fs(url, **options)
    return (_bounded(fs) if options else fs), path


def filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """Return ``(filesystem, path)`` for a local path or a URI (``file://``, ``s3://``, ...).

    ``s3://`` goes through s3fs (wrapped for pyarrow) so that ``AWS_ENDPOINT_URL`` and fsspec's
    s3 configuration apply; other schemes use :func:`pyarrow.fs.FileSystem.from_uri`.
    """
    root = os.fspath(root)
    if "://" not in root:
        return pafs.LocalFileSystem(), os.path.abspath(root).replace(os.sep, "/")
    scheme, rest = root.split("://", 1)
    if scheme.lower() == "s3":
        import s3fs

        fs = _bounded(s3fs.S3FileSystem(**_s3fs_options()))
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), rest.rstrip("/")
    fs, path = pafs.FileSystem.from_uri(root)
    return fs, path.rstrip("/") or path


def display(root: str, path: str) -> str:
    """How a filesystem path is shown in messages: with the root's scheme if it had one."""
    root = os.fspath(root)
    if "://" in root and not root.lower().startswith("file://"):
        return f"{root.split('://', 1)[0]}://{path}"
    return path


def tmp_name(path: str) -> str:
    """Hidden temporary name in the same folder (never matched by :func:`list_parquet`)."""
    folder, name = posixpath.split(path)
    return join(folder, f".{name}.tmp-{uuid.uuid4().hex}")


def atomic_write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to a temporary name next to ``path``, then rename it onto ``path``."""
    tmp = tmp_name(path)
    try:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
    except BaseException:
        remove_quietly(fs, tmp)
        raise


def atomic_write_table(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write ``table`` to a temporary name next to ``path``, then rename it onto ``path``."""
    tmp = tmp_name(path)
    try:
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, path)
    except BaseException:
        remove_quietly(fs, tmp)
        raise


def remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        if fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)
    except Exception:  # best-effort cleanup while another error propagates
        pass


def write_json(root: str, relative: str, payload: dict[str, Any]) -> None:
    """Atomically write a JSON file at ``ROOT/relative``."""
    fs, base = filesystem(root)
    path = join(base, relative)
    with named_failures(display(root, path)):
        fs.create_dir(posixpath.dirname(path), recursive=True)
        atomic_write_bytes(fs, path, json.dumps(payload, indent=2, sort_keys=True).encode())


def read_json(root: str, relative: str) -> dict[str, Any] | None:
    """``ROOT/relative`` parsed as JSON, or None if the file does not exist."""
    fs, base = filesystem(root)
    with named_failures(display(root, join(base, relative))):
        raw = read_bytes(fs, join(base, relative))
    return None if raw is None else json.loads(raw.decode())


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The whole file at ``path``, or None if there is none.

    Object stores are read with one plain GET through fsspec when possible: no listing cache
    (other processes write these files) and no ETag precondition, so a file replaced by another
    writer while it is read (a renewed lease, a rewritten record) gives the old or the new
    content, never an error.
    """
    inner = getattr(getattr(fs, "handler", None), "fs", None)
    try:
        if inner is not None and hasattr(inner, "cat_file"):
            if hasattr(inner, "invalidate_cache"):
                inner.invalidate_cache(path)
            return inner.cat_file(path)
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with fs.open_input_stream(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return None


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
    """Exclusive hold of ``ROOT/folder`` by one writer (see the module docstring).

    ``with OutputLock(root, "test"):`` raises :class:`~asymvlm.errors.LockError` naming the
    output and the holder when another writer has it. ``wait`` > 0 retries for that many seconds
    first (for short critical sections such as the manifest update). :meth:`check` raises when an
    object-store lease was lost (taken over after it could not be renewed in time).
    """

    def __init__(
        self,
        root: str,
        folder: str,
        *,
        name: str = "",
        wait: float = 0.0,
        ttl: float | None = None,
        renew_every: float | None = None,
        settle: float | None = None,
        log=None,
    ) -> None:
        self.root, self.folder = os.fspath(root), folder
        self.fs, base = filesystem(self.root)
        self.dir = join(base, folder) if folder else base
        suffix = f".{name}" if name else ""
        self.local = isinstance(self.fs, pafs.LocalFileSystem) and fcntl is not None
        stem, ext = posixpath.splitext(LEASE_NAME)
        self.path = join(self.dir, LOCK_NAME + suffix if self.local else stem + suffix + ext)
        self.shown = display(self.root, self.dir)
        self.wait = wait
        self.ttl = LEASE_TTL if ttl is None else ttl
        self.renew_every = LEASE_RENEW if renew_every is None else renew_every
        self.settle = LEASE_SETTLE if settle is None else settle
        self.owner = uuid.uuid4().hex
        self._log = log or logger.warning
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: str | None = None
        self._expires = 0.0
        self._since = 0.0

    # -- public ------------------------------------------------------------------------------
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
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)  # closing the descriptor drops the flock
            return
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
            self._log(f"could not remove {display(self.root, self.path)}: {exc}")

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- local: flock ------------------------------------------------------------------------
    def _info(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.time(),
        }

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
        os.pwrite(fd, json.dumps(self._info()).encode(), 0)
        self._fd = fd

    # -- object stores: a renewed lease ------------------------------------------------------
    def _read_lease(self) -> dict[str, Any] | None:
        raw = read_bytes(self.fs, self.path)  # the lease may be rewritten while it is read
        if raw is None:
            return None
        try:
            info = json.loads(raw.decode())
        except ValueError:
            return {}
        return info if isinstance(info, dict) else {}

    def _write_lease(self) -> None:
        self._expires = time.time() + self.ttl
        info = {
            **self._info(),
            "since": self._since,
            "expires": self._expires,
            "expires_utc": _when(self._expires),
            "ttl": self.ttl,
        }
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
            self._log(
                f"taking over the expired lease on {self.shown} ({_holder(current)}, "
                + (
                    f"expired at {_when(expires)})"
                    if isinstance(expires, int | float)
                    else "unreadable lease)"
                )
            )
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
    and ``~`` resolved), an object-store URI as it is without a trailing slash."""
    location = os.fspath(location)
    if is_remote(location):
        return location.rstrip("/") or location
    return os.path.abspath(os.path.expanduser(location.removeprefix("file://")))


def uri_join(root: str, *parts: str) -> str:
    """``root/part/...`` for local paths (made absolute) and URIs alike."""
    root = os.fspath(root)
    if "://" in root:
        return "/".join([root.rstrip("/"), *[p.strip("/") for p in parts if p]])
    return os.path.join(os.path.abspath(root), *parts)


def exists(uri: str) -> bool:
    """Whether a file or folder exists at ``uri``."""
    fs, path = filesystem(uri)
    with named_failures(uri):
        return fs.get_file_info(path).type != pafs.FileType.NotFound


def list_names(uri: str) -> list[str]:
    """The names of the files directly in folder ``uri``, sorted (none when it does not exist;
    hidden ones -- temporary names of writes under way -- left out)."""
    fs, path = filesystem(uri)
    with named_failures(uri):
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    names = (posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)
    return sorted(n for n in names if not n.startswith("."))


def write_text(uri: str, text: str) -> str:
    """Atomically write ``text`` (UTF-8) to ``uri``; returns ``uri``."""
    fs, path = filesystem(uri)
    with named_failures(uri):
        fs.create_dir(posixpath.dirname(path), recursive=True)
        atomic_write_bytes(fs, path, text.encode("utf-8"))
    return uri


def read_text(uri: str) -> str:
    fs, path = filesystem(uri)
    with named_failures(uri):
        raw = read_bytes(fs, path)
    if raw is None:
        raise FileNotFoundError(uri)
    return raw.decode("utf-8")


def upload_dir(local: str, uri: str) -> str:
    """Copy the files of the local folder ``local`` to ``uri`` (a no-op when they are the same
    local folder); returns ``uri``."""
    if not is_remote(uri) and os.path.abspath(uri) == os.path.abspath(local):
        return uri
    fs, base = filesystem(uri)
    for folder, _, files in os.walk(local):
        rel = os.path.relpath(folder, local)
        target = base if rel == "." else join(base, *rel.split(os.sep))
        with named_failures(display(uri, target)):
            fs.create_dir(target, recursive=True)
        for name in files:
            with (
                open(os.path.join(folder, name), "rb") as fh,
                named_failures(display(uri, join(target, name))),
            ):
                atomic_write_bytes(fs, join(target, name), fh.read())
    return uri


def uri_of(fs: pafs.FileSystem, path: str) -> str:
    """The URI of ``path`` on ``fs`` (inverse of :func:`filesystem` for the usual stores)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    name = fs.type_name
    if isinstance(fs, pafs.PyFileSystem):  # fsspec behind pyarrow (s3fs)
        protocol = getattr(getattr(fs.handler, "fs", None), "protocol", "s3")
        name = protocol[0] if isinstance(protocol, tuple | list) else protocol
    scheme = {"s3": "s3", "s3a": "s3", "gcs": "gs", "gs": "gs", "abfs": "abfs", "hdfs": "hdfs"}
    return f"{scheme.get(name, name)}://{path.lstrip('/')}"


def ray_storage(uri: str) -> tuple[str, pafs.FileSystem | None]:
    """``(storage_path, storage_filesystem)`` for Ray Train/Tune ``RunConfig``: a local folder as
    an absolute path; ``s3://`` as ``bucket/prefix`` on a pyarrow S3 filesystem with the
    retries of :func:`attempts` (AWS's standard strategy: exponential backoff, jitter) and
    pointed at ``AWS_ENDPOINT_URL`` when one is set (MinIO, a test server); any other URI as it
    is (Ray resolves it with pyarrow)."""
    uri = os.fspath(uri)
    if not is_remote(uri):
        return (os.path.abspath(uri.removeprefix("file://")), None)
    scheme, rest = uri.split("://", 1)
    if scheme.lower() not in ("s3", "s3a"):
        return uri.rstrip("/"), None
    options: dict[str, Any] = {"retry_strategy": pafs.AwsStandardS3RetryStrategy(attempts())}
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    endpoint = _endpoint()
    if not region and not endpoint:  # AWS itself: the bucket's region, as Ray would find it
        with contextlib.suppress(OSError):
            options["region"] = pafs.resolve_s3_region(rest.split("/", 1)[0])
    if endpoint:
        from urllib.parse import urlparse

        parsed = urlparse(endpoint)
        options.update(
            endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "https"
        )
    return rest.rstrip("/"), pafs.S3FileSystem(**options)
