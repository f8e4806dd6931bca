"""What the Serve applications share (``pipelines/serve.py``, ``pipelines/search.py``): their
flags, running the application until Ctrl-C or SIGTERM, which delete it, and the checks of a
request's captions and images (a 400 naming the first one at fault)."""

from __future__ import annotations

import base64
import binascii
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException

from asymvlm.entry import ArgumentParser


def bad_request(message: str) -> HTTPException:
    """A 400 with ``message`` as its detail."""
    return HTTPException(status_code=400, detail=message)


def checked_captions(cfg: Any, captions: list[str]) -> list[str]:
    """``captions`` within ``cfg``'s limits (count, characters), none empty."""
    if len(captions) > cfg.max_captions:
        raise bad_request(f"{len(captions)} captions; at most {cfg.max_captions} a request")
    most = cfg.max_caption_chars
    for i, text in enumerate(captions):
        if not text.strip():
            raise bad_request(f"caption {i}: empty")
        if len(text) > most:
            raise bad_request(f"caption {i}: {len(text)} characters; at most {most}")
    return captions


def decoded_images(cfg: Any, images: list[str]) -> list[bytes]:
    """The bytes of base64 ``images``, within ``cfg``'s limit on their count."""
    if len(images) > cfg.max_images:
        raise bad_request(f"{len(images)} images; at most {cfg.max_images} a request")
    out = []
    for i, text in enumerate(images):
        try:
            out.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise bad_request(f"image {i}: not base64") from None
    return out


def app_parser(description: str, schema: str, source: str, source_help: str) -> ArgumentParser:
    """``--config`` (a YAML of ``schema``'s keys), ``--SOURCE``, ``--set``, ``--no-block``,
    ``--verbose``."""
    parser = ArgumentParser(description=description)
    keys = f"a YAML of {schema} keys (each listed in the docs' Configuration reference)"
    parser.add_argument("--config", help=keys)
    parser.add_argument(f"--{source}", help=source_help)
    override = f"override a {schema} key"
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=override)
    parser.add_argument("--no-block", action="store_true", help="deploy and return")
    parser.add_argument("--verbose", action="store_true")
    return parser


def serve_until_stopped(
    cfg: Any, deploy: Callable[[Any], str], summary: dict[str, Any], routes: str, block: bool
) -> int:
    """Deploy ``cfg`` in the running Ray session, print ``summary`` and the URL as one JSON
    line, and wait (``block``) until a signal; the app is then deleted and the run exits 130
    with one line. A signal during the deployment is noted and acted on after it."""
    import ray
    from ray import serve

    stop: list[int] = []  # our handlers after ray.init's
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    try:
        url = deploy(cfg)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.default_int_handler)  # KeyboardInterrupt
        if stop:
            raise KeyboardInterrupt
        print(json.dumps({"url": url, **summary, "name": cfg.name}), flush=True)
        print(f"serving at {url} ({routes})", file=sys.stderr)
        while block:  # otherwise the app stays up once deployed
            time.sleep(3600)
        return 0
    except BaseException:
        if ray.is_initialized():  # this app only: Serve may host others on the cluster
            serve.delete(cfg.name)
        raise
