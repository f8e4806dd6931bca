"""Ray cluster entry point of the embedding stage.

    ray job submit --working-dir . -- python pipelines/embed.py --config configs/embed-coco.yaml

The YAML holds ``EmbedConfig`` keys (see ``asymvlm/data/embed.py``): either one job at the top
level, or ``defaults:`` plus a list of ``jobs:`` (e.g. train and test splits of one data set).
``--set key=value`` overrides a key in every job. Connects to the cluster given by
``RAY_ADDRESS`` (set by ``ray job submit``) or starts a local one.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from typing import Any

import yaml

from asymvlm.data.embed import EmbedConfig, run_embed

_KEYS = {f.name for f in fields(EmbedConfig)}


def load_jobs(path: str, overrides: dict[str, Any] | None = None) -> list[EmbedConfig]:
    """Parse the YAML into embedding jobs; unknown keys are an error naming the file."""
    with open(path) as fh:
        doc = yaml.safe_load(fh) or {}
    return jobs_from_doc(doc, path, overrides)


def jobs_from_doc(
    doc: Any, source: str, overrides: dict[str, Any] | None = None
) -> list[EmbedConfig]:
    """Embedding jobs from a parsed document (one job, or ``defaults`` + ``jobs``)."""
    path = source
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    if not doc:
        return []
    defaults = dict(doc.get("defaults", {}))
    jobs = doc.get("jobs") or [{k: v for k, v in doc.items() if k not in ("defaults", "jobs")}]
    out = []
    for i, job in enumerate(jobs):
        merged = {**defaults, **job, **(overrides or {})}
        unknown = set(merged) - _KEYS
        if unknown:
            raise ValueError(f"{path}: jobs[{i}]: unknown keys {sorted(unknown)}")
        missing = {"dataset", "model", "split", "output"} - set(merged)
        if missing:
            raise ValueError(f"{path}: jobs[{i}]: missing keys {sorted(missing)}")
        out.append(EmbedConfig(**merged))
    return out


def _parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML file with the embedding job(s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    summaries = [run_embed(job) for job in load_jobs(args.config, _parse_set(args.set))]
    json.dump(summaries, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
