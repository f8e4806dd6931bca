"""Caption uncertainty over HTTP: an :class:`asymvlm.Scorer` behind Ray Serve.

    python pipelines/serve.py --checkpoint runs/demo/sweeps/hierarcaps-tiny/adapters/<method>/seed0
    python pipelines/serve.py --config serve.yaml [--set replicas=2 --set gpus_per_replica=0.5]

The keys (:class:`pipelines.schema.ServeConfig`): ``checkpoint`` (a checkpoint folder or an
MLflow model URI such as ``runs:/<run>/adapter``), ``encoder``, ``tracking_uri``, ``device``,
``replicas``, ``cpus_per_replica``, ``gpus_per_replica``, dynamic batching (``batching``,
``max_batch_size``, ``batch_wait_timeout_s``: requests that arrive together are embedded
together), limits per request (``max_captions``, ``max_images``, ``max_caption_chars``),
``host`` / ``port`` / ``route_prefix`` / ``name``. The adapter and its encoder are checked here
before anything is deployed (a bad checkpoint is one line and exit 2, not a replica that
never starts). The API is :mod:`pipelines.serving`'s (``POST /uncertainty``, ``POST /score``,
``GET /health``).

Runs until Ctrl-C or SIGTERM, then deletes its app (only its own: other Serve apps on the
cluster stay); ``--no-block``: deploy and return, the app stays.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: make `pipelines` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymvlm import logs  # noqa: E402
from asymvlm.errors import guarded  # noqa: E402
from pipelines.schema import load_serve  # noqa: E402
from pipelines.serving import check, deploy  # noqa: E402
from pipelines.session import RaySession  # noqa: E402


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``pipelines/serve.py`` (also documented from it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a YAML of ServeConfig keys")
    parser.add_argument(
        "--checkpoint", help="a checkpoint or model folder, an MLflow model URI or hf-hub:ORG/REPO"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-block", action="store_true", help="deploy and return")
    parser.add_argument("--verbose", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(verbose=args.verbose)

    def run() -> int:
        import ray
        from ray import serve

        cfg = load_serve(args.config, args.set, args.checkpoint)
        meta = check(cfg)
        with RaySession(eager=True):
            # Ctrl-C and SIGTERM (a container stopping) end the same way: the app is taken
            # down, exit 130 with one line (not Ray's fatal-signal stack dump: ray.init installs
            # that handler, so ours are installed after it). While the app is being deployed
            # the signal is only noted and acted on as soon as the deployment returns.
            stop: list[int] = []
            signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
            signal.signal(signal.SIGINT, lambda signum, frame: stop.append(signum))
            keep = False  # --no-block: the app stays up once deployed
            try:
                url = deploy(cfg)
                signal.signal(signal.SIGTERM, _interrupt)
                signal.signal(signal.SIGINT, _interrupt)
                if stop:
                    raise KeyboardInterrupt
                print(
                    json.dumps({"url": url, "method": meta["method"], "name": cfg.name}), flush=True
                )
                print(
                    f"serving {meta['method']} at {url} (POST /uncertainty, POST /score, "
                    "GET /health); Ctrl-C stops",
                    file=sys.stderr,
                )
                if args.no_block:
                    keep = True
                    return 0
                while True:
                    time.sleep(3600)
            finally:
                if not keep and ray.is_initialized():
                    # this app only: Serve may host others on a shared cluster (serve.shutdown
                    # would take them down too, and it printed a failed-task line on stdout)
                    serve.delete(cfg.name)

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
