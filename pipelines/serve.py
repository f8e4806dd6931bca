"""Caption uncertainty over HTTP: an asymvlm Scorer behind Ray Serve.

Keys: :class:`asymvlm_ray.schema.ServeConfig`; until Ctrl-C or SIGTERM, which delete its app."""

from __future__ import annotations

import argparse

from asymvlm.entry import guarded, require

require("ray", "tracking")

from asymvlm import logs  # noqa: E402
from asymvlm_ray.schema import load_serve  # noqa: E402
from asymvlm_ray.serve_app import app_parser, serve_until_stopped  # noqa: E402
from asymvlm_ray.serving import check, deploy  # noqa: E402
from asymvlm_ray.session import RaySession  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    what = "a checkpoint or model folder, an MLflow model URI or hf-hub:ORG/REPO"
    return app_parser(__doc__.splitlines()[0], "ServeConfig", "checkpoint", what)


def main(argv: list[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        logs.configure(verbose=args.verbose)
        cfg = load_serve(args.config, args.set, args.checkpoint)
        summary = {"method": check(cfg)["method"]}  # a bad checkpoint fails here, before Ray starts
        with RaySession(eager=True, init=cfg.ray.init_kwargs()):
            routes = "POST /uncertainty, /score; GET /health"
            return serve_until_stopped(cfg, deploy, summary, routes, not args.no_block)

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
