"""HierarCaps for the demo: the local copy, else a verified cache, else a download
(docs/data.md)."""

from __future__ import annotations

import csv
import hashlib
import http.client
import io
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from asymvlm import storage
from asymvlm.data import demo_sets
from asymvlm.errors import AsymVLMError

__all__ = [
    "COCO_IMAGES_URL",
    "CSV_NAME",
    "CSV_SHA256",
    "CSV_URL",
    "HierarCapsChecksumError",
    "HierarCapsError",
    "SUMS_NAME",
    "default_cache_dir",
    "locate_hierarcaps",
]

log = logging.getLogger(__name__)

#: The test csv of the public HierarCaps release (Hugging Face hub, ``tau-vailab/HierarCaps``).
CSV_URL = "https://huggingface.co/datasets/tau-vailab/HierarCaps/resolve/main/hierarcaps_test.csv"
#: Its sha256; read at call time (tests serving a smaller csv replace it).
CSV_SHA256 = "3474564194fd2a85e1d8f4dbe6e040c795e94677b2982cfb161b14908cae33b0"
#: The prefix of every ``image_url`` of the csv (COCO's own server).
COCO_IMAGES_URL = "http://images.cocodataset.org/val2014/"
CSV_NAME = "hierarcaps_test.csv"
SUMS_NAME = "SHA256SUMS"
IMAGES_DIR = "images"

ENV_LOCAL = "ASYMVLM_HIERARCAPS"
ENV_CACHE = "ASYMVLM_CACHE"
ENV_CSV_URL = "ASYMVLM_HIERARCAPS_CSV_URL"
ENV_IMAGES_URL = "ASYMVLM_COCO_IMAGES_URL"

WORKERS = 8  #: download (and hashing) threads
RETRIES = 3  #: attempts per file for transient failures (network, 408/429/5xx, bad content)
TIMEOUT_S = 30.0  #: socket timeout of one request
RETRY_BACKOFF_S = 1.0  #: sleep before attempt k+1 is RETRY_BACKOFF_S * 2**(k-1)

_USER_AGENT = "asymvlm-hierarcaps-fetch/1"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CHUNK = 1 << 16


class HierarCapsError(AsymVLMError, RuntimeError):
    """The download failed in a way a retry will not fix; names the file(s) and URL(s)."""


class HierarCapsChecksumError(HierarCapsError):
    """A downloaded file does not match its expected sha256 (not kept)."""


class _Unreachable(Exception):
    """The server could not be reached (connection, DNS, timeout) after every retry."""


# -- paths and settings -------------------------------------------------------------------------
def default_cache_dir() -> str:
    """``$ASYMVLM_CACHE``, else ``~/.cache/asymvlm`` (HierarCaps goes into ``hierarcaps/``)."""
    return os.path.expanduser(os.environ.get(ENV_CACHE) or os.path.join("~", ".cache", "asymvlm"))


def _sources(base_urls: Mapping[str, str] | None) -> tuple[str, str]:
    """(csv URL, image prefix ending in "/"): ``base_urls``, else the environment, else public."""
    given = dict(base_urls or {})
    unknown = sorted(set(given) - {"csv", "images"})
    if unknown:
        raise ValueError(f"base_urls: unknown key(s) {unknown}; expected 'csv' and/or 'images'")
    csv_url = given.get("csv") or os.environ.get(ENV_CSV_URL) or CSV_URL
    images = given.get("images") or os.environ.get(ENV_IMAGES_URL) or COCO_IMAGES_URL
    return csv_url, images.rstrip("/") + "/"


def _hint(reason: str, root: str) -> str:
    return (
        f"HierarCaps is not available ({reason}): set {ENV_LOCAL} to a copy "
        f"({CSV_NAME} + {IMAGES_DIR}/), or allow network access so that it is downloaded "
        f"into {root}"
    )


# -- local checks -------------------------------------------------------------------------------
def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _decodes(source: str | bytes) -> bool:
    """Whether ``source`` (a path or the file's bytes) is an image that decodes completely."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as im:
            im.load()
        return True
    except Exception:
        return False


def _image_names(csv_path: str) -> list[str]:
    """The image file names the csv names (last path component of ``image_url``), in order."""
    names: list[str] = []
    with open(csv_path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "image_url" not in reader.fieldnames:
            raise HierarCapsError(f"{csv_path}: no 'image_url' column")
        for line, row in enumerate(reader, start=2):
            name = (row.get("image_url") or "").rstrip("/").rsplit("/", 1)[-1]
            if not _SAFE_NAME.match(name):
                raise HierarCapsError(
                    f"{csv_path}: line {line}: bad image_url {row['image_url']!r}"
                )
            names.append(name)
    return list(dict.fromkeys(names))


def _read_sums(root: str) -> dict[str, str]:
    """``SHA256SUMS`` as {relative path: sha256} (malformed lines skipped)."""
    sums: dict[str, str] = {}
    try:
        with open(os.path.join(root, SUMS_NAME), encoding="utf-8") as fh:
            for line in fh:
                parts = line.strip().split(maxsplit=1)
                if len(parts) == 2 and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
                    sums[parts[1].lstrip("*")] = parts[0]
    except OSError:
        pass
    return sums


def _write_sums(root: str, sums: dict[str, str]) -> None:
    text = "".join(f"{sums[rel]}  {rel}\n" for rel in sorted(sums))
    storage.write_text(os.path.join(root, SUMS_NAME), text)


def _check_images(
    root: str, names: list[str], recorded: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """({relative path: sha256} of the good images, names of the missing or damaged ones): good
    is matching the recorded sum, or without one (a first download) decoding."""

    def check(name: str) -> tuple[str, str | None]:
        path = os.path.join(root, IMAGES_DIR, name)
        if not os.path.isfile(path):
            return name, None
        digest = _sha256(path)
        expected = recorded.get(f"{IMAGES_DIR}/{name}")
        if expected is not None:
            return name, digest if digest == expected else None
        return name, digest if _decodes(path) else None

    good: dict[str, str] = {}
    bad: list[str] = []
    with ThreadPoolExecutor(WORKERS) as pool:
        for name, digest in pool.map(check, names):
            if digest is None:
                bad.append(name)
            else:
                good[f"{IMAGES_DIR}/{name}"] = digest
    return good, bad


# -- downloads ----------------------------------------------------------------------------------
def _download(url: str, dest: str, *, image: bool, expected: str | None = None) -> str:
    """Download ``url`` to ``dest`` atomically, with :data:`RETRIES` attempts; returns its sha256.
    ``image``: it must decode; ``expected``: it must have that sum (not retried)."""
    last, unreachable = "", True
    for attempt in range(1, RETRIES + 1):
        if attempt > 1:
            time.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 2))
        request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
                body = resp.read()  # a short body raises IncompleteRead
        except urllib.error.HTTPError as exc:
            last, unreachable = f"HTTP {exc.code} {exc.reason}", False
            if exc.code not in (408, 429) and exc.code < 500:
                break  # 404 & co.: the server said no; asking again changes nothing
            continue
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            text = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
            last, unreachable = text, True
            if isinstance(reason, socket.gaierror):
                break  # the host name does not resolve: offline (or a wrong URL)
            continue
        digest = hashlib.sha256(body).hexdigest()
        if expected is not None and digest != expected:
            raise HierarCapsChecksumError(
                f"{url}: sha256 mismatch: expected {expected}, got {digest} "
                f"({os.path.basename(dest)} not kept)"
            )
        if image and not _decodes(body):
            last, unreachable = "the body is not a decodable image", False
            continue
        storage.write_bytes(dest, body)
        return digest
    if unreachable:
        raise _Unreachable(f"{url}: {last}")
    raise HierarCapsError(f"{os.path.basename(dest)}: {url}: {last}")


def _fetch_images(
    root: str, names: list[str], prefix: str, recorded: dict[str, str]
) -> tuple[dict[str, str], list[HierarCapsError], list[str]]:
    """Download ``names`` in threads: ({rel path: sha256} fetched, errors, unreachable reasons);
    the first unreachable file stops the files not started."""
    stop = threading.Event()
    fetched: dict[str, str] = {}
    errors: list[HierarCapsError] = []
    unreachable: list[str] = []
    lock = threading.Lock()

    def fetch(name: str) -> None:
        if stop.is_set():
            return
        rel = f"{IMAGES_DIR}/{name}"
        try:
            digest = _download(
                prefix + name, os.path.join(root, rel), image=True, expected=recorded.get(rel)
            )
        except _Unreachable as exc:
            stop.set()
            with lock:
                unreachable.append(str(exc))
        except HierarCapsError as exc:
            with lock:
                errors.append(exc)
        else:
            with lock:
                fetched[rel] = digest

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(fetch, names))
    return fetched, errors, unreachable


def _ensure(root: str, csv_url: str, prefix: str, download: bool) -> str | None:
    """The cache folder ``root``, completed and verified; None (after one warning) when it
    cannot be completed (no network, or ``download`` false)."""
    csv_path = os.path.join(root, CSV_NAME)
    expected_csv = CSV_SHA256
    csv_ok = os.path.isfile(csv_path) and _sha256(csv_path) == expected_csv
    if not csv_ok:
        if not download:
            log.warning(_hint("no local copy, no complete cached copy, downloads disabled", root))
            return None
        os.makedirs(root, exist_ok=True)
        try:
            _download(csv_url, csv_path, image=False, expected=expected_csv)
        except _Unreachable as exc:
            log.warning(_hint(f"no local copy and no network: {exc}", root))
            return None

    names = _image_names(csv_path)
    recorded = _read_sums(root)
    good, bad = _check_images(root, names, recorded)
    if bad and not download:
        reason = f"{len(bad):,} of {len(names):,} cached images missing or damaged"
        log.warning(_hint(f"{reason}, downloads disabled", root))
        return None
    if bad:
        os.makedirs(os.path.join(root, IMAGES_DIR), exist_ok=True)
        what = f"{len(names):,}" if len(bad) == len(names) else f"{len(bad):,} of {len(names):,}"
        log.info("downloading HierarCaps (%s images) into %s", what, root)
        start = time.monotonic()
        fetched, errors, unreachable = _fetch_images(root, bad, prefix, recorded)
        good.update(fetched)
        missing = len(bad) - len(fetched)
        if errors:
            messages = sorted(str(e) for e in errors)
            shown = "; ".join(messages[:5]) + ("; ..." if len(messages) > 5 else "")
            changed = [e for e in errors if isinstance(e, HierarCapsChecksumError)]
            error = HierarCapsChecksumError if changed else HierarCapsError
            raise error(
                f"HierarCaps download incomplete: {missing:,} of {len(names):,} images failed "
                f"({shown}); the {len(good):,} good images stay in {root} and the next call "
                "fetches only the missing ones"
                + (f" (if the source changed, delete {root} to start afresh)" if changed else "")
            )
        if unreachable:
            reason = f"no network: {unreachable[0]}; {missing:,} images still missing"
            log.warning(_hint(f"no local copy and {reason}", root))
            return None
        size = sum(os.path.getsize(os.path.join(root, rel)) for rel in fetched)
        log.info(
            "HierarCaps ready in %s: %s images downloaded (%.1f MB) in %.1f s",
            root,
            f"{len(fetched):,}",
            size / 1e6,
            time.monotonic() - start,
        )
    sums = {CSV_NAME: expected_csv, **good}
    if sums != recorded:
        _write_sums(root, sums)
    return root


def locate_hierarcaps(
    cache_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    base_urls: Mapping[str, str] | None = None,
) -> str | None:
    """The HierarCaps test folder (``hierarcaps_test.csv`` + ``images/``): the local copy, else
    ``<cache_dir>/hierarcaps`` completed and verified (docs/data.md); None after one warning
    when it cannot be completed."""
    local = demo_sets.find_hierarcaps()
    if local:
        return local
    csv_url, prefix = _sources(base_urls)
    base = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()
    root = os.path.abspath(os.path.join(os.path.expanduser(base), "hierarcaps"))
    return _ensure(root, csv_url, prefix, download)
