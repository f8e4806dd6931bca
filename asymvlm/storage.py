"""One storage layer: local paths and URIs (``file://``, ``s3://`` ...) through fsspec, wrapped
as a pyarrow filesystem for Arrow and Ray, and atomic writes (:func:`atomic_path`); one writer per
output folder is :mod:`asymvlm.output_lock`. A request failing for good: :class:`StorageError`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.fs as pafs

from asymvlm.errors import AsymVLMError

logger = logging.getLogger(__name__)

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


def is_empty_folder(uri: str) -> bool:
    """Whether ``uri`` holds nothing (no file, no folder; a missing folder holds nothing)."""
    fs, path = filesystem(uri)
    with named_failures(uri):
        return not fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))


def download_dir(uri: str, local: str) -> str:
    """Copy the files under folder ``uri`` into the local folder ``local``; returns ``local``."""
    fs, path = fsspec_filesystem(uri)
    with named_failures(uri):
        fs.get(path.rstrip("/") + "/", local, recursive=True)
    return local


def upload_dir(local: str, uri: str) -> str:
    """Copy the files of the local folder ``local`` to ``uri``; returns ``uri``."""
    if not is_remote(uri) and os.path.abspath(uri) == os.path.abspath(local):
        return uri
    for path in Path(local).rglob("*"):
        if path.is_file():
            write_bytes(uri_join(uri, *path.relative_to(local).parts), path.read_bytes())
    return uri
