"""Caption uncertainty over HTTP: an asymvlm Scorer behind Ray Serve.

Keys: :class:`asymvlm_ray.schema.ServeConfig`; until Ctrl-C or SIGTERM, which delete its app."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from asymvlm.entry import ArgumentParser, guarded, require

require("ray", "tracking")

from asymvlm import logs  # noqa: E402
from asymvlm_ray.schema import load_serve  # noqa: E402
from asymvlm_ray.serving import check, deploy  # noqa: E402
from asymvlm_ray.session import RaySession  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    keys = "a YAML of ServeConfig keys (each listed in the docs' Configuration reference)"
    parser.add_argument("--config", help=keys)
    model = "a checkpoint or model folder, an MLflow model URI or hf-hub:ORG/REPO"
    parser.add_argument("--checkpoint", help=model)
    override = "override a ServeConfig key"
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=override)
    parser.add_argument("--no-block", action="store_true", help="deploy and return")
    parser.add_argument("--verbose", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        logs.configure(verbose=args.verbose)
        import ray
        from ray import serve

        cfg = load_serve(args.config, args.set, args.checkpoint)
        meta = check(cfg)
        with RaySession(eager=True, init=cfg.ray.init_kwargs()):
            # Ctrl-C and SIGTERM: the app is taken down, exit 130 with one line (our handlers
            # after ray.init's); during the deployment the signal is noted, acted on after.
            stop: list[int] = []
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, frame: stop.append(signum))
            try:
                url = deploy(cfg)
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.default_int_handler)  # KeyboardInterrupt
                if stop:
                    raise KeyboardInterrupt
                print(
                    json.dumps({"url": url, "method": meta["method"], "name": cfg.name}), flush=True
                )
                print(f"serving at {url} (POST /uncertainty, /score; GET /health)", file=sys.stderr)
                while not args.no_block:  # --no-block: the app stays up once deployed
                    time.sleep(3600)
                return 0
            except BaseException:
                if ray.is_initialized():  # this app only: Serve may host others on the cluster
                    serve.delete(cfg.name)
                raise

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
