"""Ray cluster entry point of the embedding stage.

    ray job submit --working-dir . -- python pipelines/embed.py --config configs/embed-coco.yaml

The YAML holds ``EmbedConfig`` keys (see ``asymvlm/data/embed.py``): either one job at the top
level, or ``defaults:`` plus a list of ``jobs:`` (e.g. train and test splits of one data set).
``--set key.sub=value`` overrides a key of the document (``defaults.batch_size=32``,
``jobs.0.split=val``); every job is validated before the first one starts. Connects to the
cluster given by ``RAY_ADDRESS`` (set by ``ray job submit``) or starts a local one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

if __package__ in (None, ""):  # run as a script: make `pipelines` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymvlm import config, logs  # noqa: E402
from asymvlm.data.embed import EmbedConfig  # noqa: E402
from asymvlm.errors import ConfigError, guarded  # noqa: E402
from pipelines.embedding import run_embed  # noqa: E402


def load_jobs(path: str, overrides: list[str] | None = None) -> list[EmbedConfig]:
    """Parse the YAML (plus ``--set key.sub=value`` overrides) into validated jobs."""
    doc = config.apply_overrides(config.load_yaml(path), overrides or [])
    config.check_no_credentials(doc, path)
    return jobs_from_doc(config.expand_env(doc, path), path)


def jobs_from_doc(doc: Any, source: str) -> list[EmbedConfig]:
    """Embedding jobs from a parsed document (one job, or ``defaults`` + ``jobs``), each
    validated as an :class:`EmbedConfig` (unknown keys, types, ranges -> ConfigError naming
    ``source`` and the job)."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if not doc or (not doc.get("jobs") and set(doc) <= {"defaults", "jobs"}):
        return []
    defaults = dict(doc.get("defaults") or {})
    if "jobs" in doc or "defaults" in doc:
        extra = sorted(set(doc) - {"defaults", "jobs"})
        if extra:
            raise ConfigError(f"{source}: with defaults/jobs, other top-level keys are not "
                              f"allowed: {extra}")  # fmt: skip
        jobs = list(doc.get("jobs") or [])
    else:
        jobs = [doc]
    out = []
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise ConfigError(f"{source}: jobs[{i}] must be a mapping")
        out.append(config.validate(EmbedConfig, {**defaults, **job}, f"{source}: jobs[{i}]"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML file with the embedding job(s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key (YAML value; dots and list indices: "
                             "defaults.batch_size=32, jobs.0.split=val)")  # fmt: skip
    parser.add_argument("--verbose", action="store_true",
                        help="everything on the console (Ray Data and its bars)")  # fmt: skip
    args = parser.parse_args(argv)
    logs.configure(verbose=args.verbose)

    def run() -> int:
        jobs = load_jobs(args.config, args.set)  # every job validated before any starts
        summaries = [run_embed(job) for job in jobs]
        json.dump(summaries, sys.stdout, indent=2)
        print()
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
