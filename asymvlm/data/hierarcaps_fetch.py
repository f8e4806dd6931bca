"""HierarCaps for the demo: the local copy, else a verified cache, else a download
(docs/data.md)."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from asymvlm import storage
from asymvlm.data import demo_sets
from asymvlm.data.sources.captions import read_csv
from asymvlm.errors import AsymVLMError

__all__ = ["HierarCapsChecksumError", "HierarCapsError", "locate_hierarcaps"]

log = logging.getLogger(__name__)

#: The test csv of the public HierarCaps release (Hugging Face hub, ``tau-vailab/HierarCaps``).
CSV_URL = "https://huggingface.co/datasets/tau-vailab/HierarCaps/resolve/main/hierarcaps_test.csv"
#: Its sha256; read at call time (tests serving a smaller csv replace it).
CSV_SHA256 = "3474564194fd2a85e1d8f4dbe6e040c795e94677b2982cfb161b14908cae33b0"
#: The prefix of every ``image_url`` of the csv (COCO's own server).
COCO_IMAGES_URL = "http://images.cocodataset.org/val2014/"
CSV_NAME, SUMS_NAME, IMAGES_DIR = "hierarcaps_test.csv", "SHA256SUMS", "images"

WORKERS = 8  #: download threads
RETRIES = 3  #: attempts per file for transient failures (network, 408/429/5xx, bad content)
TIMEOUT_S = 30.0  #: socket timeout of one request
RETRY_BACKOFF_S = 1.0  #: sleep before attempt k+1 is RETRY_BACKOFF_S * 2**(k-1)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class HierarCapsError(AsymVLMError, RuntimeError):
    """The download failed in a way a retry will not fix; names the file(s) and URL(s)."""


class HierarCapsChecksumError(HierarCapsError):
    """A downloaded file does not match its expected sha256 (not kept)."""


class _Unreachable(Exception):
    """The server could not be reached (connection, DNS, timeout) after every retry."""


def _sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


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
    urls = read_csv(csv_path, ("image_url",))["image_url"]
    names = [u.rstrip("/").rsplit("/", 1)[-1] for u in urls]
    for row, (url, name) in enumerate(zip(urls, names, strict=True), 1):
        if not _SAFE_NAME.match(name):
            raise HierarCapsError(f"{csv_path}: row {row}: bad image_url {url!r}")
    return list(dict.fromkeys(names))


def _download(url: str, dest: str, *, image: bool, expected: str | None = None) -> str:
    """Download ``url`` to ``dest`` (atomically), :data:`RETRIES` attempts; returns its sha256.
    ``image``: it must decode; ``expected``: it must have that sum (not retried)."""
    last, unreachable = "", True
    for attempt in range(RETRIES):
        time.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1) if attempt else 0)
        request = urllib.request.Request(url, headers={"User-Agent": "asymvlm-hierarcaps/1"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
                body = resp.read()  # a short body raises IncompleteRead
        except urllib.error.HTTPError as exc:
            last, unreachable = f"HTTP {exc.code} {exc.reason}", False
            if exc.code not in (408, 429) and exc.code < 500:
                break  # 404 & co.: the server said no; asking again changes nothing
            continue
        except OSError as exc:  # URLError, timeouts, a connection cut mid-body
            reason = getattr(exc, "reason", None) or exc
            last, unreachable = f"{type(reason).__name__}: {reason}", True
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


def _fetch_images(root: str, names: list[str], prefix: str, recorded: dict[str, str]) -> dict:
    """``{relative path: sha256 or the error}`` of ``names`` downloaded in threads; the first
    unreachable file stops the files not started."""
    stop = threading.Event()

    def fetch(name: str) -> tuple[str, str | Exception | None]:
        rel = f"{IMAGES_DIR}/{name}"
        if stop.is_set():
            return rel, None
        try:
            dest = os.path.join(root, rel)
            return rel, _download(prefix + name, dest, image=True, expected=recorded.get(rel))
        except _Unreachable as exc:
            stop.set()
            return rel, exc
        except HierarCapsError as exc:
            return rel, exc

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(fetch, names))


def locate_hierarcaps() -> str | None:
    """The HierarCaps test folder (``hierarcaps_test.csv`` + ``images/``): the local copy, else
    ``$ASYMVLM_CACHE/hierarcaps`` completed and verified, downloading from
    ``$ASYMVLM_HIERARCAPS_CSV_URL`` / ``$ASYMVLM_COCO_IMAGES_URL`` or the public sources; None
    after one warning when there is no network (docs/data.md)."""
    local = demo_sets.find_hierarcaps()
    if local:
        return local
    cache = os.path.expanduser(os.environ.get("ASYMVLM_CACHE") or "~/.cache/asymvlm")
    root = os.path.abspath(os.path.join(cache, "hierarcaps"))
    prefix = (os.environ.get("ASYMVLM_COCO_IMAGES_URL") or COCO_IMAGES_URL).rstrip("/") + "/"

    def unavailable(reason: str) -> None:
        log.warning(
            f"HierarCaps is not available (no local copy and no network: {reason}): set "
            f"ASYMVLM_HIERARCAPS to a copy ({CSV_NAME} + {IMAGES_DIR}/), or allow network access "
            f"so that it is downloaded into {root}"
        )

    csv_path = os.path.join(root, CSV_NAME)
    if not (os.path.isfile(csv_path) and _sha256(csv_path) == CSV_SHA256):
        csv_url = os.environ.get("ASYMVLM_HIERARCAPS_CSV_URL") or CSV_URL
        try:
            _download(csv_url, csv_path, image=False, expected=CSV_SHA256)
        except _Unreachable as exc:
            return unavailable(str(exc))
    names = _image_names(csv_path)
    sums_path = os.path.join(root, SUMS_NAME)
    lines = (storage.read_bytes(sums_path) or b"").decode().splitlines()
    recorded = dict(line.split("  ", 1)[::-1] for line in lines if "  " in line)
    good: dict[str, str] = {}
    for name in names:  # a recorded sum must match; without one (a first download) it decodes
        path, rel = os.path.join(root, IMAGES_DIR, name), f"{IMAGES_DIR}/{name}"
        digest = _sha256(path) if os.path.isfile(path) else None
        if digest and (recorded.get(rel) == digest or rel not in recorded and _decodes(path)):
            good[rel] = digest
    bad = [n for n in names if f"{IMAGES_DIR}/{n}" not in good]
    if bad:
        log.info(f"downloading HierarCaps ({len(bad):,} of {len(names):,} images) into {root}")
        fetched = _fetch_images(root, bad, prefix, recorded)
        errors = sorted(str(e) for e in fetched.values() if isinstance(e, HierarCapsError))
        missing = sum(not isinstance(v, str) for v in fetched.values())
        good.update((rel, v) for rel, v in fetched.items() if isinstance(v, str))
        if errors:
            raise HierarCapsError(
                f"HierarCaps download incomplete: {missing:,} of {len(names):,} images failed "
                f"({'; '.join(errors[:5])}{'; ...' if len(errors) > 5 else ''}); the good "
                f"images stay in {root} and the next call fetches only the missing ones"
            )
        if missing:
            reason = next(str(e) for e in fetched.values() if isinstance(e, _Unreachable))
            return unavailable(f"{reason}; {missing:,} images still missing")
        log.info(f"HierarCaps ready in {root}: {len(bad):,} images downloaded")
    sums = {CSV_NAME: CSV_SHA256, **good}
    if sums != recorded:
        storage.write_text(sums_path, "".join(f"{sums[r]}  {r}\n" for r in sorted(sums)))
    return root
