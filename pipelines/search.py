"""A kappa-aware index over HTTP: asymvlm search on Ray Serve, a replica per shard, and a page.

Keys: :class:`asymvlm_ray.schema.SearchConfig`; until Ctrl-C or SIGTERM, which delete its app."""

from __future__ import annotations

import argparse

from asymvlm.entry import guarded, require

require("ray", "tracking")

from asymvlm import logs  # noqa: E402
from asymvlm_ray.schema import load_search  # noqa: E402
from asymvlm_ray.search_serving import check, deploy  # noqa: E402
from asymvlm_ray.serve_app import app_parser, serve_until_stopped  # noqa: E402
from asymvlm_ray.session import RaySession  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    what = "an index folder (asymvlm index), local or s3://"
    return app_parser(__doc__.splitlines()[0], "SearchConfig", "index", what)


def main(argv: list[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        logs.configure(verbose=args.verbose)
        cfg = load_search(args.config, args.set, args.index)
        summary = {"method": check(cfg).method}  # a bad index fails here, before Ray starts
        with RaySession(eager=True, init=cfg.ray.init_kwargs()):
            routes = "the page at /; POST /search, /knn-service; GET /health"
            return serve_until_stopped(cfg, deploy, summary, routes, not args.no_block)

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
