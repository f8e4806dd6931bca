"""What a Tune sweep costs over running the same trials one after another in plain Python:
``run_sweep`` on the trials of ``--config`` against a loop of ``train_and_evaluate`` (the faster of
torch's default threads and one). Prints one JSON object; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from _common import loadavg, logger, machine  # noqa: E402

log = logger("sweep_overhead")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return round(time.perf_counter() - t0, 2), out


def _loop(cfg, trials: list[tuple[str, float, int]], threads: int) -> None:
    import torch

    from asymvlm.runner import train_and_evaluate

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for method, lr, seed in trials:
            out = train_and_evaluate(cfg.run_spec(method, lr, seed), device="cpu")
            assert out is not None and not out.get("diverged"), out
    finally:
        torch.set_num_threads(before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(REPO, "tune_spaces", "cpu-small.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tables", default=None, help="default: the config's (else written)")
    args = parser.parse_args(argv)

    import mlflow  # noqa: F401  (imported before the timing, as torch is for the loop)
    import torch

    from asymvlm import logs, tables
    from asymvlm.synthetic import PRESETS, write_world
    from asymvlm_ray.schema import load_sweep
    from asymvlm_ray.session import RaySession
    from asymvlm_ray.tuning.sweep_driver import run_sweep

    logs.configure(verbose=False)
    with tempfile.TemporaryDirectory(
        prefix="sweep-overhead-", ignore_cleanup_errors=True
    ) as scratch:
        where = [f"output={os.path.join(scratch, 'sweep')}", "mlflow.tracking_uri=null"]
        where += [f"embeddings={os.path.abspath(args.tables)}"] if args.tables else []
        cfg = load_sweep(args.config, [*args.set, *where])
        try:
            tables.read_manifest(cfg.embeddings)
        except Exception:  # not there: the demo world
            world = write_world(os.path.join(scratch, "world"), PRESETS["demo"])
            cfg = load_sweep(args.config, [*args.set, *where, f"embeddings={world}"])
        RaySession().require()  # started before any timing, left to the process's end
        load_before = loadavg()
        log("sweep ...")
        sweep_seconds, out = _timed(run_sweep, cfg)
        trials = [(t.method, t.lr, t.seed) for t in out.trials]
        log(f"sweep: {sweep_seconds} s for {len(trials)} trials; the plain loops ...")
        threads = sorted({torch.get_num_threads(), 1})
        by_threads = {n: _timed(_loop, cfg, trials, n)[0] for n in threads}
        sequential = min(by_threads.values())
        result = {
            "config": os.path.relpath(args.config, REPO),
            "overrides": args.set,
            "trials": len(trials),
            "sweep_seconds": sweep_seconds,
            "sequential_seconds": sequential,
            "sequential_seconds_by_threads": by_threads,
            "overhead_ratio": round(sweep_seconds / sequential, 3),
            "selection": {m: pick.lr for m, pick in out.selection.items()},
        }
        print(json.dumps({**result, **machine(load_before)}, indent=2))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
