"""Ray cluster entry point of the embedding stage: the EmbedConfig job(s) of a YAML file."""

from __future__ import annotations

import argparse
import json

from asymvlm.entry import guarded, job_parser, require

require("ray", "embed")

from asymvlm import logs  # noqa: E402
from asymvlm_ray.embedding import run_embed  # noqa: E402
from asymvlm_ray.schema import load_embed_jobs  # noqa: E402
from asymvlm_ray.session import RaySession  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    keys = (
        "YAML file with the embedding job(s); its EmbedConfig keys: the docs' "
        "Configuration reference"
    )
    return job_parser(__doc__.splitlines()[0], keys, "jobs.0.split=val")


def main(argv: list[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        logs.configure(verbose=args.verbose)
        jobs = load_embed_jobs(args.config, args.set)  # every job validated before any starts
        with RaySession() as session:
            summaries = [run_embed(job, session) for job in jobs]
        print(json.dumps(summaries, indent=2))
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
