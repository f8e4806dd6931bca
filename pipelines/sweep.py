"""Ray Tune sweep of the paper's protocol (App. B.4), tracked in MLflow.

The sweep: :mod:`asymvlm_ray.tuning.sweep_driver`; keys: :class:`asymvlm_ray.schema.SweepConfig`."""

from __future__ import annotations

import argparse
import json
import logging
import shlex

from asymvlm.entry import ArgumentParser, guarded, require

require("ray", "tracking", "report")

from asymvlm import config, logs, tracking  # noqa: E402
from asymvlm_ray.schema import load_sweep  # noqa: E402
from asymvlm_ray.session import RaySession  # noqa: E402
from asymvlm_ray.tuning.sweep_driver import ADAPTERS_DIR, check_rerun, check_tables, run_sweep  # noqa: E402

logger = logging.getLogger("pipelines.sweep")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    keys = "a YAML of tune_spaces/; its SweepConfig keys: the docs' Configuration reference"
    parser.add_argument("--config", required=True, help=keys)
    override = "override a key (YAML value; dots for nesting: mlflow.experiment=x)"
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=override)
    verbose = "everything on the console (Ray, Tune, MLflow)"
    parser.add_argument("--verbose", action="store_true", help=verbose)
    return parser


def main(argv: list[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        logs.configure(verbose=args.verbose)
        sweep = load_sweep(args.config, args.set)  # validated before Ray starts
        check_tables(sweep)
        check_rerun(sweep)  # nothing is written before the config is known to be good
        logs.configure(verbose=args.verbose, log_file=logs.log_file_for(sweep.output, "sweep"))
        with tracking.outage_queue(), RaySession(eager=True, init=sweep.ray.init_kwargs()):
            out = run_sweep(sweep)
        logger.info("\n%s", out.markdown)
        where = "runs: asymvlm ui %s; adapters: %s/<method>/seed<k>"
        logger.info(where, shlex.quote(sweep.output), ADAPTERS_DIR)
        shown = out.model_dump(include={"parent_run_id", "selection"})
        uri = config.redact(out.tracking_uri)
        print(json.dumps({**shown, "tracking_uri": uri, "failed_trials": len(out.failed)}))
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
