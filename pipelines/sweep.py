"""Ray Tune sweep of the paper's protocol (App. B.4), tracked in MLflow.

    python pipelines/sweep.py --config tune_spaces/cpu-small.yaml [--set key=value ...]
    ray job submit --working-dir . -- python pipelines/sweep.py --config tune_spaces/coco-clip.yaml

Stage 1 grid-searches ``method x lr`` with seed 0; the best lr of every method is chosen on the
**validation** split (mean of t2i and i2t Recall@1; the test split never takes part); stage 2
repeats each method at its best lr with every seed in ``seeds`` -- except the first seed,
which stage 1 already ran at that lr (that trial is reused, not run again).

Trials (:mod:`pipelines.trials`): with ``num_workers: 1`` a trial runs the protocol inside
the Tune trial on ``cpus_per_worker`` CPUs (or ``gpus_per_worker`` of a GPU: 0.25 puts four
trials on one GPU), and the Tune actors are reused from trial to trial with the tables kept in
memory -- no per-trial start-up; with ``num_workers > 1`` a trial is one Ray Train run
(:mod:`pipelines.train`, DDP over ``num_workers`` workers).

MLflow (through :mod:`asymvlm.tracking`; the driver is the only writer): one run per sweep
(nested under the pipeline run when there is one) with the resolved config, the git commit, the
lr selection and the mean ± std table over seeds (Table A.2 layout, markdown and CSV); one
nested run per trial, live: it opens when the trial starts, gets every epoch's metrics as the
epoch ends (step = epoch), then the final metrics, the binned Recall@1 curves (JSON + PNG) and
the adapter as an MLflow model, and ends FINISHED or FAILED with the reason. Default store:
``sqlite:///<output>/mlflow.db`` -- open it with ``asymvlm ui <output>``.

YAML keys: ``embeddings, methods, lr, seeds, epochs, batch_size, optimizer, num_workers,
mlflow: {tracking_uri, experiment}``; optional ``output`` (default ``runs/<experiment>``),
``train_split/val_split/test_split``, any :class:`asymvlm.training.TrainConfig` field
(``hidden_dim``, ``depth``, ``weight_decay``, ``momentum``, ``adapter_input``, ``precision``),
``method_kwargs: {method: {...}}``, ``checkpoint_every``, ``max_failures``, ``cpus_per_worker``,
``gpus_per_worker``, ``trial_runner`` (``torch_trainer``: every trial through a TorchTrainer),
``val_fraction`` (hold out that share of the training images for lr selection when the tables
have no validation split) and ``test_embeddings`` (test tables from
another root, e.g. COCO for adapters trained on CC-200k). Other keys are allowed and ignored
here (the full pipeline reads them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
from typing import Any

import yaml
from ray import tune

if __package__ in (None, ""):  # run as a script: make `pipelines` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymvlm import config, logs, results, storage, tables, tracking  # noqa: E402
from asymvlm.errors import AsymVLMError, ConfigError, guarded  # noqa: E402
from pipelines.stages import StagedSearch  # noqa: E402
from pipelines.trial_log import MlflowTrialLogger, log_outcome  # noqa: E402,F401
from pipelines.trials import (  # noqa: E402
    SELECTION_METRIC,
    direct_trial,
    failure_reason,
    torch_trainer_trial,
    uses_torch_trainer,
)

if __name__ != "__main__":  # see pipelines/train.py
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

logger = logging.getLogger(__name__)

SWEEP_RECORD = "sweep.json"  # written last: a sweep with it is done
TRIAL_DRIVER_MEMORY = 256 * 1024**2  # bytes (a logical reservation)
KEEP_CHECKPOINTS = 2  # per trial, the latest (a Ray Train run keeps as many of its own)


# -- configuration ------------------------------------------------------------------------------
def load_config(path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read the YAML, apply ``--set key.sub=value`` overrides, validate and fill the defaults."""
    doc = config.apply_overrides(config.load_yaml(path), overrides or [])
    return resolve_config(doc, source=path)


def resolve_config(doc: dict[str, Any], source: str = "<config>") -> dict[str, Any]:
    """Validate a sweep document (:class:`asymvlm.config.SweepConfig`: unknown keys, types and
    ranges are :class:`~asymvlm.errors.ConfigError`) and return it as a plain dict with every
    default filled and local paths made absolute (trials run in their own directories)."""
    config.check_no_credentials(doc, source)
    cfg = config.validate(config.SweepConfig, doc, source).model_dump()
    mlflow_cfg = cfg["mlflow"]
    mlflow_cfg["experiment"] = mlflow_cfg.get("experiment") or "asymvlm"
    cfg["output"] = cfg.get("output") or os.path.join("runs", mlflow_cfg["experiment"])
    for key in ("output", "embeddings", "test_embeddings"):
        if cfg.get(key) and "://" not in str(cfg[key]):
            cfg[key] = os.path.abspath(cfg[key])
    config.check_output_storage(cfg["output"], mlflow_cfg.get("tracking_uri"), source)
    if not mlflow_cfg.get("tracking_uri"):
        mlflow_cfg["tracking_uri"] = tracking.default_tracking_uri(cfg["output"])
    return cfg


def _concurrency(cfg: dict[str, Any]) -> int:
    """Trials that fit the cluster at once (each needs num_workers x per-worker resources)."""
    import ray

    total = ray.cluster_resources()
    workers = int(cfg["num_workers"])
    fits = [int(total.get("CPU", 1) // max(workers * float(cfg["cpus_per_worker"]), 1e-9))]
    if total.get("GPU", 0) > 0:
        fits.append(int(total["GPU"] // (workers * float(cfg["gpus_per_worker"]))))
    return max(1, min(fits))


def _run_trials(
    cfg: dict[str, Any], search: StagedSearch, trial_logger, label: str, total: int
):
    """Both stages as one Tune experiment (:class:`~pipelines.stages.StagedSearch` hands out
    the trials); returns (finished trials' final rows, failed trials with their reasons)."""
    tune_path, tune_fs = storage.ray_storage(storage.uri_join(cfg["output"], "tune"))
    if uses_torch_trainer(cfg):
        # The trial only drives its TorchTrainer, whose workers ask for their own CPUs/GPUs:
        # it reserves no CPU (Tune needs some resource in a request: a little memory).
        trainable = tune.with_resources(torch_trainer_trial,
                                        {"cpu": 0, "memory": TRIAL_DRIVER_MEMORY})  # fmt: skip
        retries = tune.FailureConfig(max_failures=0)  # the TorchTrainer retries its workers
    else:  # the protocol runs in the trial: it holds the worker's CPUs (or GPU share)
        import ray

        gpu = ray.cluster_resources().get("GPU", 0) > 0
        resources = {"cpu": cfg["cpus_per_worker"], "gpu": cfg["gpus_per_worker"] if gpu else 0}
        trainable = tune.with_resources(direct_trial, resources)
        retries = tune.FailureConfig(max_failures=cfg["max_failures"])
    tuner = tune.Tuner(
        trainable,
        param_space={"sweep": cfg},
        tune_config=tune.TuneConfig(
            search_alg=search,
            num_samples=-1,  # until the search says it has finished
            max_concurrent_trials=_concurrency(cfg),
            # one process runs trial after trial, stage 1 into stage 2 (its splits stay
            # loaded: PROCESS_CACHE)
            reuse_actors=not uses_torch_trainer(cfg),
        ),
        run_config=tune.RunConfig(
            name="trials",
            storage_path=tune_path,
            storage_filesystem=tune_fs,
            callbacks=[trial_logger],
            failure_config=retries,
            # a retry resumes from the latest; the older ones would pile up (a trial of 200
            # epochs checkpoints every checkpoint_every of them)
            checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
            verbose=0,  # one line per finished trial comes from the MLflow callback
        ),
    )
    with (
        contextlib.redirect_stdout(sys.stderr),  # stdout carries the result
        trial_logger.progress(label, total),
    ):
        grid = tuner.fit()
    done, failed = [], []
    for r in grid:
        members = r.config.get("pack") or [r.config["trial"]]
        outcomes = (r.metrics or {}).get("pack_outcomes") if r.error is None else None
        if outcomes is None and r.error is None and r.metrics and "outcome" in r.metrics:
            outcomes = [r.metrics]
        outcomes = outcomes or [{"failed": failure_reason(r.error)}] * len(members)
        for trial, row in zip(members, outcomes, strict=True):
            if "outcome" in row:
                done.append(row)
            else:
                failed.append({"stage": r.config["stage"], **trial,
                               "reason": row.get("failed") or failure_reason(r.error)})  # fmt: skip
    return done, failed


def _base_params(cfg: dict[str, Any]) -> dict[str, Any]:
    try:
        manifest = tables.read_manifest(cfg["embeddings"])
        model, dataset = manifest.model, manifest.to_dict().get("dataset")
        splits = manifest.to_dict().get("splits", {})
        dataset = dataset or splits.get(cfg["train_split"], {}).get("dataset")
    except Exception:  # the params are provenance; a missing manifest fails later, clearly
        model, dataset = None, None
    return {
        "dataset": dataset or os.path.basename(os.path.normpath(cfg["embeddings"])),
        "embedding_model": model,
        "embeddings": cfg["embeddings"],
        "git_commit": tracking.git_commit(),
        "epochs": cfg["epochs"],
        "batch_size": cfg["batch_size"],
        "protocol": cfg.get("protocol", "improved"),
        "optimizer": cfg.get("optimizer") or "per method (protocol default)",
        "num_workers": cfg["num_workers"],
        **{k: cfg[k] for k in ("hidden_dim", "depth", "adapter_input") if k in cfg},
    }


# -- the sweep ----------------------------------------------------------------------------------
def run_sweep(cfg: dict[str, Any], parent: str | None = None) -> dict[str, Any]:
    """Stage 1 (grid, seed 0) -> lr selection on validation -> stage 2 (seeds) -> summary.

    The sweep's MLflow run is nested under ``parent`` (the pipeline run) when given."""
    from pipelines.ray_session import init_ray

    check_tables(cfg)
    if not storage.is_remote(cfg["output"]):
        os.makedirs(cfg["output"], exist_ok=True)
    init_ray()  # joins $RAY_ADDRESS or starts a local Ray; credentials stay on the nodes
    config.check_shared_output(cfg["output"], cfg["storage"]["shared_filesystem"])
    uri, experiment = cfg["mlflow"]["tracking_uri"], cfg["mlflow"]["experiment"]
    base = _base_params(cfg)
    params = {**{k: json.dumps(cfg[k]) for k in ("methods", "lr", "seeds")}, **base}
    name = cfg.get("name") or "sweep"

    def open_sweep_run() -> tracking.Run:
        try:
            run = tracking.open_run(uri, experiment, f"sweep {name}", kind="sweep",
                                    parent=parent, params=params,
                                    tags={"note": str(cfg.get("note") or ""), "sweep": name},
                                    description=cfg.get("note") or None)  # fmt: skip
        except Exception as exc:  # stops the sweep at Tune's next event (MlflowTrialLogger)
            raise ConfigError(f"mlflow.tracking_uri: cannot open the MLflow store "
                              f"{config.redact(uri)}: {exc}") from None  # fmt: skip
        run.log_text("config.yaml", yaml.safe_dump(cfg, sort_keys=False))
        logger.info("sweep %s: MLflow run %s in %s (experiment %r)", name, run.id,
                    config.redact(uri), experiment)  # fmt: skip
        return run

    # The sweep's run is opened on the MLflow writer thread while Tune starts the first trials
    # (creating a new SQLite store alone takes a second or two).
    trial_logger = MlflowTrialLogger(cfg, open_sweep_run, base)
    with tracking.ended(trial_logger.opened_parent):  # FINISHED, FAILED or KILLED
        try:
            selection, summary, failed, markdown, adapters = _stages(cfg, trial_logger, base)
        finally:
            trial_logger.close()  # every write done before the sweep's run ends
    sweep_run = trial_logger.parent
    storage.write_text(storage.uri_join(cfg["output"], "summary.md"), markdown)
    storage.write_text(
        storage.uri_join(cfg["output"], SWEEP_RECORD),
        json.dumps({"parent_run_id": sweep_run.id, "experiment": experiment,
                    "tracking_uri": config.redact(uri), "selection": selection,
                    "summary": summary, "failed": failed, "adapters": adapters}, indent=2),
    )  # fmt: skip
    return {
        "parent_run_id": sweep_run.id,
        "experiment_id": sweep_run.client.get_run(sweep_run.id).info.experiment_id,
        "tracking_uri": uri,
        "selection": selection,
        "summary": summary,
        "failed": failed,
        "adapters": adapters,
        "markdown": markdown,
        "child_run_ids": list(trial_logger.child_ids.values()),
    }


def _stages(cfg: dict[str, Any], trial_logger, base: dict[str, Any]):
    """Both stages and the summary, logged on the sweep's run (``trial_logger.parent``);
    (selection, summary, failed, summary markdown, exported adapters)."""
    name = cfg.get("name") or "sweep"
    first = cfg["seeds"][0]
    grid = [{"method": m, "lr": lr, "seed": first} for m in cfg["methods"] for lr in cfg["lr"]]
    grid = grid if len(cfg["lr"]) > 1 else []  # one lr: nothing to select
    selection: dict[str, dict[str, Any]] = {}
    reused: list[dict[str, Any]] = []
    seed_keys: list[str] = []  # the run keys of the seed stage's trials (reused ones first)

    def select(method: str, trial_ids: list[str]) -> list[dict[str, Any]]:
        """The grid of ``method`` is over: its best lr, and its stage-2 trials."""
        keyed = [(k, trial_logger.final.get(k)) for k in trial_ids]
        keyed = [(k, r) for k, r in keyed if r and "outcome" in r]
        rows = [r for _, r in keyed]
        if grid:
            pick = select_lr(rows).get(method)
        else:
            pick = {"lr": cfg["lr"][0], "score": None, "scores_by_lr": {}}
        if pick is None:
            logger.warning("sweep %s: %s failed at every lr; left out of stage 2", name, method)
            return []
        selection[method] = pick
        # Stage 1 already ran the first seed at the chosen lr: that trial is stage 2's.
        mine = [r for r in rows if r["lr"] == pick["lr"]]
        reused.extend(mine)
        seed_keys.extend(k for k, r in keyed if r["lr"] == pick["lr"])
        trial_logger.join_seed_stage([k for k, r in keyed if r["lr"] == pick["lr"]])
        trial_logger.submit(
            lambda: trial_logger.parent.log_params({f"best_lr/{method}": pick["lr"]}))
        seeds = [s for s in cfg["seeds"] if s not in {r["seed"] for r in mine}]
        if grid:
            logger.info("sweep %s: %s best lr %g (%s %.4f); stage 2: seeds %s", name, method,
                        pick["lr"], SELECTION_METRIC, pick["score"],
                        ", ".join(map(str, seeds)) or "none left")  # fmt: skip
        return [{"method": method, "lr": pick["lr"], "seed": s} for s in seeds]

    if grid:
        logger.info("sweep %s, stage 1: %d trials (method x lr, seed %d); each method's stage 2 "
                    "follows its grid", name, len(grid), first)  # fmt: skip
    total = len(grid) + len(cfg["methods"]) * (len(cfg["seeds"]) - (1 if grid else 0))
    from asymvlm.methods import METHODS

    packable = frozenset(m for m in cfg["methods"] if METHODS[m].trainable)
    search = StagedSearch(cfg["methods"], grid, select, cfg.get("pack", 1), packable)
    done, failed = _run_trials(cfg, search, trial_logger, name, total)
    selection = {m: selection[m] for m in cfg["methods"] if m in selection}  # config order
    if not selection:
        raise NoResults(f"sweep {name}: every trial failed; first reason: "
                        f"{failed[0]['reason']}")  # fmt: skip
    repeats = reused + [r for r in done if r["stage"] == "seeds"]
    flat = [
        {"method": r["method"], "seed": r["seed"],
         **results.retrieval_metric_names(r["outcome"].get("test", {}))}
        for r in repeats
    ]  # fmt: skip
    summary = results.seed_summary(flat)
    title = f"{base['dataset']} ({base['embedding_model']}), mean ± std over seeds"
    markdown = results.summary_markdown(summary, title=title) + failures_markdown(failed)
    seed_keys += [k for k, r in trial_logger.final.items() if r.get("stage") == "seeds"]
    adapters = export_adapters(cfg, trial_logger, seed_keys)
    sweep_run = trial_logger.parent
    sweep_run.log_metrics({"failed_trials": len(failed)})
    sweep_run.set_tags({"failed_trials": str(len(failed))})
    sweep_run.log_text("summary.md", markdown)
    sweep_run.log_text("summary.csv", results.summary_csv(summary))
    sweep_run.log_json("selection.json", selection)
    sweep_run.log_json("failures.json", failed)
    sweep_run.log_metrics({
        f"{method}/{col}_{stat}": stats[stat]
        for method, cells in summary.items()
        for col, stats in cells.items() if isinstance(stats, dict)
        for stat in ("mean", "std")
    })  # fmt: skip
    return selection, summary, failed, markdown, adapters


#: Where a sweep leaves its seed-stage adapters: ``<output>/adapters/<method>/seed<k>``.
ADAPTERS_DIR = "adapters"


def export_adapters(cfg: dict[str, Any], trial_logger, keys: list[str]) -> dict[str, Any]:
    """Every seed-stage adapter (the runs ``keys``) copied to
    ``<output>/adapters/<method>/seed<seed>``, a checkpoint folder that ``asymvlm evaluate``,
    ``score`` and ``score-text`` take; returns method -> seed -> its URI."""
    out: dict[str, dict[str, str]] = {}
    for key in dict.fromkeys(keys):
        row = trial_logger.final[key]
        uri = storage.uri_join(cfg["output"], ADAPTERS_DIR, row["method"], f"seed{row['seed']}")
        if trial_logger.export_adapter(key, uri):
            out.setdefault(row["method"], {})[str(row["seed"])] = uri
    return out


class NoResults(AsymVLMError):
    """Every trial of a sweep failed: nothing to select or summarise."""


def failures_markdown(failed: list[dict[str, Any]]) -> str:
    """The failed trials under the summary table: how many, which, and why."""
    if not failed:
        return ""
    lines = ["", f"**{len(failed)} trial(s) failed** and are left out of the selection and "
             "the table above:", "", "| stage | method | lr | seed | reason |",
             "|---|---|---|---|---|"]  # fmt: skip
    for f in failed:
        reason = f["reason"].replace("|", "\\|")
        lines.append(f"| {f['stage']} | {f['method']} | {f['lr']:g} | {f['seed']} | {reason} |")
    return "\n".join(lines) + "\n"


def check_tables(cfg: dict[str, Any]) -> None:
    """Fail before any trial starts when the tables or splits the sweep needs are missing."""
    needs = [(cfg["embeddings"], cfg["train_split"])]
    if cfg.get("test_split"):
        needs.append((cfg.get("test_embeddings") or cfg["embeddings"], cfg["test_split"]))
    for root, split in needs:
        tables.read_manifest(root)  # raises TableError naming the missing manifest
        if split not in tables.list_splits(root):
            raise tables.TableError(
                f"{root}: no split {split!r} (found {tables.list_splits(root)})"
            )
    val = cfg.get("val_split")
    if len(cfg["lr"]) > 1 and not val and not cfg.get("val_fraction"):
        raise ConfigError(
            f"{len(cfg['lr'])} learning rates but no validation data to choose among them: "
            "set val_split or val_fraction (the test split never takes part in the choice)"
        )
    if val and val not in tables.list_splits(cfg["embeddings"]) and not cfg.get("val_fraction"):
        raise tables.TableError(
            f"{cfg['embeddings']}: no validation split {val!r}; add one or set val_fraction "
            "to hold out training images for the lr selection"
        )


def select_lr(grid: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method, the lr with the best validation score (ties: the smaller lr). Only trials
    that finished with a finite score take part: a diverged or failed trial is never chosen,
    and a method none of whose lrs finished is absent from the result."""
    best: dict[str, dict[str, Any]] = {}
    scores: dict[str, dict[str, float]] = {}
    for r in sorted(grid, key=lambda r: (r["method"], r["lr"])):
        score = float(r[SELECTION_METRIC])
        if not math.isfinite(score):
            continue
        scores.setdefault(r["method"], {})[f"{r['lr']:g}"] = score
        current = best.get(r["method"])
        if current is None or score > current["score"]:
            best[r["method"]] = {"lr": r["lr"], "score": score}
    for method in best:
        best[method]["scores_by_lr"] = scores[method]
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a YAML of tune_spaces/")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key (YAML value; dots for nesting: mlflow.experiment=x)",
    )
    parser.add_argument("--verbose", action="store_true",
                        help="everything on the console (Ray, Tune, Train, MLflow)")  # fmt: skip
    args = parser.parse_args(argv)
    logs.configure(verbose=args.verbose)

    def run() -> int:
        cfg = load_config(args.config, args.set)
        logs.configure(verbose=args.verbose, log_file=logs.log_file_for(cfg["output"], "sweep"))
        check_tables(cfg)
        out = run_sweep(cfg)
        logger.info("\n%s", out["markdown"])
        logger.info("open the runs: asymvlm ui %s", cfg["output"])
        if out["adapters"]:
            where = storage.uri_join(cfg["output"], ADAPTERS_DIR)
            logger.info("adapters: %s/<method>/seed<k> (asymvlm score-text --checkpoint DIR "
                        "\"a caption\")", where)  # fmt: skip
        json.dump({"parent_run_id": out["parent_run_id"],
                   "tracking_uri": config.redact(out["tracking_uri"]),
                   "selection": out["selection"], "failed_trials": len(out["failed"])},
                  sys.stdout, indent=2)  # fmt: skip
        print()
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
