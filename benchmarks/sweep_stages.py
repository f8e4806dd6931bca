"""What the sweep's own searcher saves: its two stages pipelined in one Tune experiment
(``StagedSearch``) against Tune's documented pieces alone, two ``Tuner.fit`` calls with
``tune.grid_search`` (the lr grid; the lr chosen on its ``ResultGrid``; the other seeds). Both
run the same trials (``sweep_trial``) without MLflow, alternating. Prints one JSON object; see
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from _common import loadavg, logger, machine  # noqa: E402

log = logger("sweep_stages")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pipelined(cfg) -> None:
    from ray import tune

    from asymvlm_ray.tuning.staged_search import run_trials

    done, failed = run_trials(cfg, tune.Callback())
    assert not failed, failed


def _two_fits(cfg) -> None:
    """Stage 1 as one ``Tuner.fit`` over a grid search, the lrs chosen, stage 2 as another."""
    from ray import tune

    from asymvlm_ray.tuning.lr_selection import select_lr
    from asymvlm_ray.tuning.records import SweepPoint, TrialOutcome, TrialReport
    from asymvlm_ray.tuning.staged_search import KEEP_CHECKPOINTS, packed
    from asymvlm_ray.tuning.trials import sweep_trial

    trainable = tune.with_resources(
        tune.with_parameters(sweep_trial, sweep=cfg), {"cpu": cfg.cpus_per_worker}
    )

    def fit(trials: list) -> list[TrialOutcome]:
        members = tune.grid_search([trial.model_dump()["members"] for trial in trials])
        tuner = tune.Tuner(
            trainable,
            param_space={"stage": trials[0].stage, "members": members},
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=tune.RunConfig(
                name=trials[0].stage,
                storage_path=os.path.join(cfg.output, "tune"),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
                verbose=0,
            ),
        )
        reported = [TrialReport.of(r.metrics, len(r.config["members"])) for r in tuner.fit()]
        return [got for each in reported for got in each if isinstance(got, TrialOutcome)]

    def points(method: str, lrs: list[float], seeds: list[int]) -> list[SweepPoint]:
        return [SweepPoint(method=method, lr=lr, seed=s) for lr in lrs for s in seeds]

    grid = [packed(cfg, "grid", points(m, cfg.lr, cfg.seeds[:1])) for m in cfg.methods]
    picks = select_lr(fit([trial for trials in grid for trial in trials]))
    seeds = [packed(cfg, "seeds", points(m, [p.lr], cfg.seeds[1:])) for m, p in picks.items()]
    fit([trial for trials in seeds for trial in trials])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(REPO, "tune_spaces", "cpu-small.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=3, help="each side this many times")
    parser.add_argument("--tables", default=None, help="default: the demo world, written")
    args = parser.parse_args(argv)

    from asymvlm import logs
    from asymvlm.synthetic import PRESETS, write_world
    from asymvlm_ray.schema import load_sweep
    from asymvlm_ray.session import RaySession

    logs.configure(verbose=False)
    with tempfile.TemporaryDirectory(prefix="sweep-stages-", ignore_cleanup_errors=True) as tmp:
        world = args.tables or write_world(os.path.join(tmp, "world"), PRESETS["demo"])
        RaySession().require()  # started before any timing, left to the process's end
        load_before = loadavg()
        seconds: dict[str, list[float]] = {"pipelined": [], "two_fits": []}
        for k in range(args.rounds):
            for side, run in (("pipelined", _pipelined), ("two_fits", _two_fits)):
                where = [f"output={os.path.join(tmp, f'{side}{k}')}", f"embeddings={world}"]
                cfg = load_sweep(args.config, [*args.set, *where])
                t0 = time.perf_counter()
                run(cfg)
                seconds[side].append(round(time.perf_counter() - t0, 2))
                log(f"round {k}: {side} {seconds[side][-1]} s")
        median = {side: statistics.median(times) for side, times in seconds.items()}
        result = {
            "config": os.path.relpath(args.config, REPO),
            "overrides": args.set,
            "trials": len(cfg.methods) * (len(cfg.lr) + len(cfg.seeds) - 1),
            "seconds": seconds,
            "median_seconds": median,
            "saved_seconds": round(median["two_fits"] - median["pipelined"], 2),
        }
        print(json.dumps({**result, **machine(load_before)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
