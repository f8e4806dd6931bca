"""HierarCaps: the local copy, else a verified cache, else a download (docs/data.md)."""

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

log = logging.getLogger(__name__)

CSV_URL = "https://huggingface.co/datasets/tau-vailab/HierarCaps/resolve/main/hierarcaps_test.csv"
CSV_SHA256 = "3474564194fd2a85e1d8f4dbe6e040c795e94677b2982cfb161b14908cae33b0"
COCO_IMAGES_URL = "http://images.cocodataset.org/val2014/"
CSV_NAME, SUMS_NAME, IMAGES_DIR = "hierarcaps_test.csv", "SHA256SUMS", "images"
WORKERS, RETRIES, TIMEOUT_S, RETRY_BACKOFF_S = 8, 3, 30.0, 1.0
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


def _download(url: str, dest: str, *, image: bool, expected: str | None = None) -> str:
    """``url`` written atomically to ``dest`` after :data:`RETRIES` attempts at most; returns its
    sha256. ``image``: it must decode; ``expected``: it must have that sum (not retried)."""
    last, unreachable = "", True
    for attempt in range(RETRIES):
        time.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1) if attempt else 0)
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "asymvlm-hierarcaps/1"})
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            last, unreachable = f"HTTP {exc.code} {exc.reason}", False
            if exc.code in (408, 429) or exc.code >= 500:
                continue
            break  # 404 & co.: asking again changes nothing
        except OSError as exc:  # URLError, timeouts, a connection cut mid-body
            reason = getattr(exc, "reason", None) or exc
            last, unreachable = f"{type(reason).__name__}: {reason}", True
            if isinstance(reason, socket.gaierror):
                break  # the host name does not resolve: offline
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


def locate_hierarcaps() -> str | None:
    """The HierarCaps test folder: the local copy, else ``$ASYMVLM_CACHE/hierarcaps`` completed
    and verified; None after one warning when there is no network (docs/data.md)."""
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
        try:
            csv_url = os.environ.get("ASYMVLM_HIERARCAPS_CSV_URL") or CSV_URL
            _download(csv_url, csv_path, image=False, expected=CSV_SHA256)
        except _Unreachable as exc:
            return unavailable(str(exc))
    rels = []
    for row, url in enumerate(read_csv(csv_path, ("image_url",))["image_url"], 1):
        if not _SAFE_NAME.match(name := url.rstrip("/").rsplit("/", 1)[-1]):
            raise HierarCapsError(f"{csv_path}: row {row}: bad image_url {url!r}")
        rels.append(f"{IMAGES_DIR}/{name}")
    rels = list(dict.fromkeys(rels))
    lines = (storage.read_bytes(os.path.join(root, SUMS_NAME)) or b"").decode().splitlines()
    recorded = dict(line.split("  ", 1)[::-1] for line in lines if "  " in line)
    good: dict[str, str] = {}
    for rel in rels:  # a recorded sum must match; without one (a first download) it decodes
        path = os.path.join(root, rel)
        digest = _sha256(path) if os.path.isfile(path) else None
        if digest and (recorded.get(rel) == digest or rel not in recorded and _decodes(path)):
            good[rel] = digest
    stop = threading.Event()  # set by the first unreachable file: the ones not started stay

    def fetch(rel: str) -> tuple[str, str | Exception | None]:  # sha256 or the error
        if stop.is_set():
            return rel, None
        url = prefix + rel.removeprefix(f"{IMAGES_DIR}/")
        try:
            return rel, _download(
                url, os.path.join(root, rel), image=True, expected=recorded.get(rel)
            )
        except (_Unreachable, HierarCapsError) as exc:
            if isinstance(exc, _Unreachable):
                stop.set()
            return rel, exc

    if bad := [rel for rel in rels if rel not in good]:
        log.info(f"downloading HierarCaps ({len(bad):,} of {len(rels):,} images) into {root}")
        with ThreadPoolExecutor(WORKERS) as pool:
            fetched = dict(pool.map(fetch, bad))
        good.update((rel, v) for rel, v in fetched.items() if isinstance(v, str))
        missing = [v for v in fetched.values() if not isinstance(v, str)]
        if errors := sorted(str(e) for e in missing if isinstance(e, HierarCapsError)):
            raise HierarCapsError(
                f"HierarCaps download incomplete: {len(missing):,} of {len(rels):,} images "
                f"failed ({'; '.join(errors[:5])}{'; ...' if len(errors) > 5 else ''}); the "
                f"good images stay in {root} and the next call fetches only the missing ones"
            )
        if missing:
            reason = next(str(e) for e in missing if isinstance(e, _Unreachable))
            return unavailable(f"{reason}; {len(missing):,} images still missing")
        log.info(f"HierarCaps ready in {root}: {len(bad):,} images downloaded")
    sums = {CSV_NAME: CSV_SHA256, **good}
    if sums != recorded:
        text = "".join(f"{sums[r]}  {r}\n" for r in sorted(sums))
        storage.write_text(os.path.join(root, SUMS_NAME), text)
    return root
