"""The whole pipeline on Ray: prepare -> embed -> sweep -> evaluate -> report (one YAML).

Stages: :mod:`asymvlm_ray.stages` (resumable); keys: :class:`asymvlm_ray.schema.PipelineConfig`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex

from asymvlm.entry import ArgumentParser, guarded, require
from asymvlm.errors import ConfigError

require("ray", "tracking", "report")

from asymvlm import config, logs, tracking  # noqa: E402
from asymvlm_ray.schema import load_pipeline  # noqa: E402
from asymvlm_ray.session import RaySession  # noqa: E402
from asymvlm_ray.stages import STAGES, check_reruns, final_tables, run_pipeline  # noqa: E402

DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.yaml"
)

logger = logging.getLogger("pipelines.full")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    keys = (
        "pipeline YAML (default: the demo); its keys: PipelineConfig in the docs' "
        "Configuration reference"
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=keys)
    subset = f"comma-separated subset of {','.join(STAGES)}"
    parser.add_argument("--stages", default=",".join(STAGES), help=subset)
    parser.add_argument("--output", default=None, help="override the config's output folder")
    override = "override a key (YAML value; dots and list indices: sweeps.0.epochs=5)"
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=override)
    verbose = "everything on the console (default: our lines; the rest to OUTPUT/logs/pipeline.log)"
    parser.add_argument("--verbose", action="store_true", help=verbose)
    return parser


def main(argv: list[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        logs.configure(verbose=args.verbose)
        stages = [s.strip() for s in args.stages.split(",") if s.strip()]
        if not stages or (unknown := [s for s in stages if s not in STAGES]):
            what = f"unknown stages {unknown}" if stages else "no stage given"
            raise ConfigError(f"--stages: {what}; choose from {list(STAGES)}")
        overrides = list(args.set) + ([f"output={args.output}"] if args.output else [])
        cfg = load_pipeline(args.config, overrides)  # everything validated before Ray starts
        check_reruns(cfg)  # and the output's finished parts made with these settings
        log_file = logs.log_file_for(cfg.output, "pipeline")
        logs.configure(verbose=args.verbose, log_file=log_file)
        logger.info("pipeline %s: stages %s -> %s", cfg.name, ",".join(stages), cfg.output)
        with tracking.outage_queue(), RaySession(init=cfg.ray.init_kwargs()) as session:
            out = run_pipeline(cfg, stages, session)
        final_tables(cfg)
        uri = config.redact(cfg.mlflow.tracking_uri)
        logger.info("finished in %.0f s; report: %s", out["seconds"], out.get("report"))
        logger.info("MLflow: %s, experiment %r", uri, cfg.mlflow.experiment)
        if uri.startswith("sqlite:///"):
            logger.info("open it: asymvlm ui %s", shlex.quote(cfg.output))
        logger.info("log file: %s", log_file)
        print(json.dumps({**out, "tracking_uri": uri}))
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
