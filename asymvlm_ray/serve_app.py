"""What the entry points of the Serve applications share (``pipelines/serve.py``,
``pipelines/search.py``): their flags, and running the application until Ctrl-C or SIGTERM,
which delete it."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from asymvlm.entry import ArgumentParser


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
