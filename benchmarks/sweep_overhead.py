"""What a Tune sweep costs over running the same trials one after another in plain Python.

The same trials -- those a sweep of ``--config`` (default ``tune_spaces/cpu-small.yaml``) runs:
stage 1 ``methods x lr`` at the first seed, stage 2 the other seeds at each method's chosen lr
-- are run three ways, in one process, against one local Ray started before any timing:

* **sweep** -- ``pipelines/tuning/sweep.py``'s ``run_sweep`` as a user runs it (both stages, lr
  selection, MLflow runs with every epoch's metrics, curves and adapters, summary);
* **sequential** -- a plain loop of :func:`asymvlm.protocol.run_protocol` over the same
  (method, lr, seed) list, every run reading its tables (no Ray, no MLflow), once at torch's
  default threads and once at one thread; the faster is the baseline;
* **torch_trainer** (unless ``--no-torch-trainer``) -- the sweep with
  ``trial_runner: torch_trainer``: every trial a Ray Train ``TorchTrainer``, as earlier versions
  ran them.

Prints one JSON object: ``sweep_seconds``, ``sequential_seconds``, ``overhead_ratio`` (= sweep
/ sequential; target <= 1.3 on 2 CPUs), ``sequential_script_seconds`` (the faster loop again as a
script of its own, a new process paying its imports, as a user's plain loop would) and
``sweep_over_sequential_script``, ``sweep_again_existing_store_seconds`` (the same sweep
run again into the MLflow store the first created: no store to create, the driver's logging
imports done) and its ratio, ``trial_process_imports_seconds`` (what a fresh trial process
imports, timed alone by part), ``torch_trainer_seconds`` and its ratio, the trials,
and whether both sweeps selected the same lrs and got the same seed metrics. Progress goes to
stderr::

    .venv/bin/python benchmarks/sweep_overhead.py [--config tune_spaces/cpu-small.yaml]
        [--set epochs=4 ...] [--tables runs/synthetic]

``--tables`` (default: the config's ``embeddings``) is written as the synthetic ``demo`` world
when it does not exist (into a temporary folder unless given).

The sweep starts right after Ray, so its time includes the trial processes' start (their
imports). ``--preload`` starts the local Ray with Ray's ``RAY_preload_python_modules`` set to
what a trial imports (:data:`PRELOAD`: its workers import them as they start, before any task
-- a cluster's nodes can be started so). ``--warm-up SECONDS`` waits that long after Ray
started before the sweep -- what a long-running cluster, or a pipeline whose earlier stages ran
first, gives its sweeps; the JSON says which (``warm_up_seconds``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import loadavg, logger, machine  # noqa: E402

log = logger("sweep_overhead")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: What a trial process imports before and at its first epoch (``--preload``).
PRELOAD = ("torch", "ray.tune", "pipelines.tuning.trials", "torch._dynamo", "scipy.stats")


def _tables(args: argparse.Namespace, configured: str, scratch: str) -> str:
    """``--tables``, else the config's ``embeddings``; the demo world when it is not there."""
    from asymvlm import tables
    from asymvlm.synthetic import PRESETS, write_world

    root = args.tables or configured
    try:
        tables.read_manifest(root)
        return os.path.abspath(root)
    except Exception:  # not there: write the demo world
        root = args.tables or os.path.join(scratch, "world")
        log(f"writing the synthetic demo world to {root}")
        write_world(root, PRESETS["demo"])
        return os.path.abspath(root)


def _sweep(cfg: Any) -> tuple[float, dict[str, Any]]:
    from pipelines.tuning.sweep import run_sweep

    t0 = time.perf_counter()
    out = run_sweep(cfg)
    return time.perf_counter() - t0, out


def _trials_of(cfg: Any, selection: dict[str, Any]) -> list[tuple[str, float, int]]:
    """The (method, lr, seed) runs of the sweep: the grid, then the seeds it did not run."""
    first = cfg.seeds[0]
    grid = [(m, lr, first) for m in cfg.methods for lr in cfg.lr]
    grid = grid if len(cfg.lr) > 1 else []
    rest = [
        (m, pick["lr"], s)
        for m, pick in selection.items()
        for s in cfg.seeds
        if (m, pick["lr"], s) not in grid
    ]
    return grid + rest


def _sequential(cfg: Any, trials: list[tuple[str, float, int]], threads: int) -> float:
    """Seconds of a plain loop of ``run_protocol`` over ``trials`` at ``threads`` torch threads
    (``cfg``: the validated sweep, or its JSON document)."""
    import torch

    from asymvlm.protocol import run_protocol
    from pipelines.schema import sweep_config

    cfg = sweep_config(cfg) if isinstance(cfg, dict) else cfg

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        for method, lr, seed in trials:
            spec = cfg.run_spec(method, lr, seed)
            out = run_protocol(spec, device="cpu")
            assert out is not None and not out.get("diverged"), out
        return time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)


_LOOP_SCRIPT = """
import json, sys
sys.path.insert(0, "benchmarks")
from sweep_overhead import _sequential
_sequential(*json.loads(sys.argv[1]))
"""


def _sequential_script(cfg: Any, trials: list[tuple[str, float, int]], threads: int) -> float:
    """Seconds of the same loop as a script of its own: a new Python process that imports
    torch and the package first, as a user's plain loop would."""
    import subprocess

    t0 = time.perf_counter()
    doc = cfg.model_dump(mode="json", exclude_none=True)
    subprocess.run(
        [sys.executable, "-c", _LOOP_SCRIPT, json.dumps([doc, trials, threads])],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


_TRIAL_IMPORTS = """
import json, sys, time
import ray  # a Ray worker process has Ray imported before it runs anything
t0 = time.perf_counter()
import ray.tune  # unpickling the trainable
t1 = time.perf_counter()
import pipelines.tuning.trials  # the trainable's module: torch, the package
t2 = time.perf_counter()
import torch._dynamo  # torch.optim's first step imports it
import scipy.stats  # the uncertainty metrics
t3 = time.perf_counter()
print(json.dumps({"ray.tune": t1 - t0, "pipelines.tuning.trials (torch, the package)": t2 - t1,
                  "torch._dynamo + scipy.stats": t3 - t2, "total": t3 - t0}))
"""


def _trial_imports() -> dict[str, float]:
    """Seconds a fresh trial process spends importing before (and at) its first epoch, by
    part, measured alone in a new process (in a sweep two of them run at once)."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", _TRIAL_IMPORTS], check=True, cwd=REPO, capture_output=True, text=True
    ).stdout
    return {k: round(v, 2) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def _seed_metrics(out: dict[str, Any]) -> dict[str, Any]:
    return {
        m: {k: v["mean"] for k, v in cells.items() if isinstance(v, dict)}
        for m, cells in out["summary"].items()
    }


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """Largest |difference| of the seed-mean metrics of two summaries (None: other cells)."""
    if a.keys() != b.keys() or any(a[m].keys() != b[m].keys() for m in a):
        return None
    diffs = [
        abs(a[m][k] - b[m][k])
        for m in a
        for k in a[m]
        if a[m][k] is not None and b[m][k] is not None
    ]
    return max(diffs, default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(REPO, "tune_spaces", "cpu-small.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tables", default=None)
    parser.add_argument("--no-torch-trainer", action="store_true")
    parser.add_argument(
        "--preload",
        action="store_true",
        help="Ray's workers import what a trial imports as they start",
    )
    parser.add_argument(
        "--warm-up",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long after starting Ray before the sweep",
    )
    args = parser.parse_args(argv)

    from asymvlm import config, logs
    from pipelines.schema import sweep_config as resolve_config
    from pipelines.session import RaySession

    logs.configure(verbose=False)
    scratch = tempfile.mkdtemp(prefix="sweep-overhead-")
    try:
        doc = config.apply_overrides(config.load_yaml(args.config), args.set)
        doc["output"] = os.path.join(scratch, "sweep")
        doc["embeddings"] = _tables(args, doc["embeddings"], scratch)
        doc.setdefault("mlflow", {})
        doc["mlflow"] = {**(doc["mlflow"] or {}), "tracking_uri": None}
        cfg = resolve_config(doc, source=args.config)
        if args.preload:  # read by the raylet this process starts
            os.environ["RAY_preload_python_modules"] = ",".join(PRELOAD)
        t0 = time.perf_counter()
        RaySession().require()  # left running: the script ends with the process
        ray_start = time.perf_counter() - t0
        time.sleep(args.warm_up)
        load_before = loadavg()

        log("sweep (trials in place) ...")
        sweep_seconds, out = _sweep(cfg)
        trials = _trials_of(cfg, out["selection"])
        log(f"sweep: {sweep_seconds:.1f} s for {len(trials)} trials; sequential loops ...")
        import torch

        # The plain loop at torch's default threads (all cores) and at one thread; the ratio
        # is taken against the faster, so it never flatters the sweep.
        by_threads = {
            n: _sequential(cfg, trials, n)
            for n in sorted({torch.get_num_threads(), 1}, reverse=True)
        }
        sequential_seconds = min(by_threads.values())
        log(f"sequential: {by_threads} s by torch threads; the loop as a script of its own ...")
        best_threads = min(by_threads, key=by_threads.get)
        script_seconds = _sequential_script(cfg, trials, best_threads)
        # The same sweep again into the MLflow store the first one created (a project's
        # mlflow.db, or a tracking server, already exists): no new store to migrate, and
        # this driver has imported what the first sweep's logging needed.
        log("the sweep again, into the existing MLflow store ...")
        again = resolve_config(
            {
                **doc,
                "output": os.path.join(scratch, "sweep-again"),
                "mlflow": {**doc["mlflow"], "tracking_uri": cfg.mlflow.tracking_uri},
            },
            source=args.config,
        )
        again_seconds, _ = _sweep(again)
        imports = _trial_imports()
        result: dict[str, Any] = {
            "config": os.path.relpath(args.config, REPO)
            if args.config.startswith(REPO)
            else args.config,
            "overrides": args.set,
            "trials": len(trials),
            "methods": cfg.methods,
            "lr": cfg.lr,
            "seeds": cfg.seeds,
            "epochs": cfg.epochs,
            "batch_size": cfg.batch_size,
            "num_workers": cfg.num_workers,
            "cpus_per_worker": cfg.cpus_per_worker,
            "sweep_seconds": round(sweep_seconds, 2),
            "sequential_seconds": round(sequential_seconds, 2),
            "sequential_seconds_by_threads": {n: round(v, 2) for n, v in by_threads.items()},
            "overhead_ratio": round(sweep_seconds / sequential_seconds, 3),
            "target_overhead_ratio": 1.3,
            # the loop as a user's own script: a new process, its imports included
            "sequential_script_seconds": round(script_seconds, 2),
            "sweep_over_sequential_script": round(sweep_seconds / script_seconds, 3),
            "sweep_again_existing_store_seconds": round(again_seconds, 2),
            "sweep_again_over_sequential": round(again_seconds / sequential_seconds, 3),
            "trial_process_imports_seconds": imports,
            "ray_start_seconds": round(ray_start, 2),
            "warm_up_seconds": args.warm_up,
            "preloaded_modules": list(PRELOAD) if args.preload else [],
            "selection": {m: p["lr"] for m, p in out["selection"].items()},
        }
        if not args.no_torch_trainer:
            log("sweep with every trial a TorchTrainer ...")
            old = resolve_config(
                {
                    **doc,
                    "trial_runner": "torch_trainer",
                    "output": os.path.join(scratch, "sweep-tt"),
                },
                source=args.config,
            )
            tt_seconds, tt_out = _sweep(old)
            result.update(
                torch_trainer_seconds=round(tt_seconds, 2),
                torch_trainer_over_sequential=round(tt_seconds / sequential_seconds, 3),
                speedup_over_torch_trainer=round(tt_seconds / sweep_seconds, 3),
                same_selection={m: p["lr"] for m, p in tt_out["selection"].items()}
                == result["selection"],
                seed_metrics_max_abs_diff=_max_diff(_seed_metrics(tt_out), _seed_metrics(out)),
            )
        result.update(machine(load_before))
        print(json.dumps(result, indent=2))
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
