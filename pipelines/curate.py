"""Ray cluster entry point of a curation job: κ for every caption of a pool, and selections."""

from __future__ import annotations

import argparse

from asymvlm.entry import guarded, job_parser, require

require("ray")

from asymvlm import logs  # noqa: E402
from asymvlm.cli.curating import run_curation  # noqa: E402
from asymvlm_ray.schema import load_curate  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    keys = "YAML file with the job's CurateConfig keys (the docs' Configuration reference)"
    return job_parser(__doc__.splitlines()[0], keys, "rules.0.most_specific=0.5")


def main(argv: list[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        logs.configure(verbose=args.verbose)
        return run_curation(load_curate(args.config, args.set))

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
