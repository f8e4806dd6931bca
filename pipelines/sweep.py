"""Ray Tune sweep of the paper's protocol (App. B.4), tracked in MLflow.

    python pipelines/sweep.py --config tune_spaces/cpu-small.yaml [--set key=value ...]
    ray job submit --working-dir . -- python pipelines/sweep.py --config tune_spaces/coco-clip.yaml

Stage 1 grid-searches ``method x lr`` with seed 0; the best lr of every method is chosen on the
**validation** split (mean of t2i and i2t Recall@1; the test split never takes part); stage 2
repeats each method at its best lr with every seed in ``seeds``. Every trial is one Ray Train
run (:mod:`pipelines.train`, DDP over ``num_workers`` workers); with GPUs, trials are packed on
fractional GPUs (``gpus_per_worker``, e.g. 0.25 puts four single-worker trials on one GPU).

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
``gpus_per_worker``, ``val_fraction`` (hold out that share of the training images for lr
selection when the tables have no validation split) and ``test_embeddings`` (test tables from
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
import re
import sys
import tempfile
import time
from dataclasses import fields
from typing import Any

import yaml
from ray import tune
from ray.tune.result import AUTO_RESULT_KEYS

if __package__ in (None, ""):  # run as a script: make `pipelines` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymvlm import config, logs, results, storage, tables, tracking  # noqa: E402
from asymvlm.errors import AsymVLMError, ConfigError, TrialFailed, guarded  # noqa: E402
from asymvlm.training import TrainConfig  # noqa: E402
from pipelines.train import run_config_dict, run_training  # noqa: E402

if __name__ != "__main__":  # see pipelines/train.py
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

logger = logging.getLogger(__name__)

_TRAIN_KEYS = {f.name for f in fields(TrainConfig)} - {"method", "lr", "seed", "method_kwargs"}
SELECTION_METRIC = "val_mean_recall_at_1"
SWEEP_RECORD = "sweep.json"  # written last: a sweep with it is done
TRIAL_DRIVER_MEMORY = 256 * 1024**2  # bytes (a logical reservation)


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


def _train_config(cfg: dict[str, Any], method: str, lr: float, seed: int) -> dict[str, Any]:
    train = {k: cfg[k] for k in _TRAIN_KEYS if k in cfg}
    train.update(method=method, lr=lr, seed=seed)
    train["method_kwargs"] = dict(cfg["method_kwargs"].get(method, {}))
    return train


# -- failures -----------------------------------------------------------------------------------
def failure_reason(exc: BaseException | str | None) -> str:
    """The root cause of a failed trial as one line: our own errors (e.g. "non-finite loss at
    epoch 2, step 3 ...") verbatim, others as ``Type: first line``; digs through Ray's
    wrappers (task errors, Train worker-group errors, Tune errors)."""
    from asymvlm.errors import AsymVLMError

    if exc is None:
        return "unknown error"
    if isinstance(exc, str):  # Tune's text trace: the last "Error: message" line
        lines = [ln.strip() for ln in exc.strip().splitlines() if ln.strip()]
        hits = [ln for ln in lines if "non-finite" in ln] or [
            ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Failed)\b", ln)
        ]
        return (hits[-1] if hits else (lines[-1] if lines else "unknown error"))[:500]
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    chain: list[BaseException] = []
    while stack:
        err = stack.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        chain.append(err)
        cause = getattr(err, "cause", None)  # RayTaskError(X) is also an X: use its cause
        if isinstance(cause, BaseException):
            stack.insert(0, cause)
            continue
        if isinstance(err, TrialFailed | AsymVLMError):
            return " ".join(str(err).split())[:500]
        stack += list(getattr(err, "worker_failures", {}).values())
        stack += [e for e in (err.__cause__, err.__context__) if isinstance(e, BaseException)]
    root = chain[-1]
    first = (str(root).strip().splitlines() or [""])[0]
    return f"{type(root).__name__}: {first}"[:500]


# -- one trial ----------------------------------------------------------------------------------
def sweep_trial(config: dict[str, Any]) -> None:
    """Tune function trainable: one Ray Train run; reports the selection score and results."""
    cfg = config["sweep"]
    method, lr, seed = config["arm"]["method"], config["arm"]["lr"], config["seed"]
    run = run_config_dict(
        cfg["embeddings"],
        _train_config(cfg, method, lr, seed),
        train_split=cfg["train_split"],
        val_split=cfg["val_split"],
        test_split=cfg["test_split"],
        checkpoint_every=cfg["checkpoint_every"],
        **{k: cfg[k] for k in ("val_fraction", "test_embeddings") if cfg.get(k)},
    )
    from ray.tune.integration.ray_train import TuneReportCallback

    try:
        out = run_training(
            run,
            callbacks=[TuneReportCallback()],  # every epoch's report reaches the driver live
            name=f"{config['stage']}-{method}-lr{lr:g}-seed{seed}",
            storage_path=storage.uri_join(cfg["output"], "ray"),
            num_workers=cfg["num_workers"],
            cpus_per_worker=cfg["cpus_per_worker"],
            gpus_per_worker=cfg["gpus_per_worker"],
            max_failures=cfg["max_failures"],
        )
    except Exception as exc:  # the trial fails (Tune error state) with a readable reason
        raise TrialFailed(failure_reason(exc)) from None
    val = results.retrieval_metric_names(out.get("val", {}), prefix="val_")
    score = [val[k] for k in ("val_t2i_recall_at_1", "val_i2t_recall_at_1") if k in val]
    tune.report(
        {
            SELECTION_METRIC: sum(score) / len(score) if score else float("nan"),
            "method": method,
            "lr": lr,
            "seed": seed,
            "stage": config["stage"],
            "outcome": out,
        }
    )


def _concurrency(cfg: dict[str, Any]) -> int:
    """Trials that fit the cluster at once (each needs num_workers x per-worker resources)."""
    import ray

    total = ray.cluster_resources()
    workers = int(cfg["num_workers"])
    fits = [int(total.get("CPU", 1) // max(workers * float(cfg["cpus_per_worker"]), 1e-9))]
    if total.get("GPU", 0) > 0:
        fits.append(int(total["GPU"] // (workers * float(cfg["gpus_per_worker"]))))
    return max(1, min(fits))


def _run_stage(cfg: dict[str, Any], stage: str, arms: list[dict], seeds: list[int], trial_logger):
    tune_path, tune_fs = storage.ray_storage(storage.uri_join(cfg["output"], "tune"))
    tuner = tune.Tuner(
        # The trial only drives its TorchTrainer, whose workers ask for their own CPUs/GPUs:
        # it reserves no CPU (Tune needs some resource in a request: a little memory).
        tune.with_resources(sweep_trial, {"cpu": 0, "memory": TRIAL_DRIVER_MEMORY}),
        param_space={
            "sweep": cfg,
            "stage": stage,
            "arm": tune.grid_search(arms),
            "seed": tune.grid_search(seeds),
        },
        tune_config=tune.TuneConfig(max_concurrent_trials=_concurrency(cfg)),
        run_config=tune.RunConfig(
            name=stage,
            storage_path=tune_path,
            storage_filesystem=tune_fs,
            callbacks=[trial_logger],
            verbose=0,  # one line per finished trial comes from the MLflow callback
        ),
    )
    with (
        contextlib.redirect_stdout(sys.stderr),  # stdout carries the result
        trial_logger.progress(f"{cfg.get('name') or 'sweep'} {stage}", len(arms) * len(seeds)),
    ):
        results = tuner.fit()
    done, failed = [], []
    for r in results:
        if r.error is None and r.metrics and "outcome" in r.metrics:
            done.append(r.metrics)
            continue
        failed.append({"stage": stage, "method": r.config["arm"]["method"],
                       "lr": r.config["arm"]["lr"], "seed": r.config["seed"],
                       "reason": failure_reason(r.error)})  # fmt: skip
    return done, failed


# -- MLflow (driver only) -----------------------------------------------------------------------
_NOT_METRICS = frozenset(AUTO_RESULT_KEYS) | {"checkpoint_path", "epoch", "trial_id", "done"}


def _trial_label(config: dict[str, Any]) -> tuple[str, float, int, str]:
    return config["arm"]["method"], config["arm"]["lr"], config["seed"], config["stage"]


class MlflowTrialLogger(tune.Callback):
    """Tune callback on the driver: every trial is a nested MLflow run from its start, with each
    epoch's metrics as the epoch ends (step = epoch), the final metrics and artifacts, and the
    status FINISHED or FAILED (with the reason) at its end; one console line per finished
    trial."""

    def __init__(self, cfg: dict[str, Any], parent: tracking.Run, base_params: dict[str, Any]):
        self.cfg, self.parent, self.base_params = cfg, parent, base_params
        self.runs: dict[str, tracking.Run] = {}
        self.started: dict[str, float] = {}
        self._bar = None  # the progress bar of the stage running, if any

    @property
    def child_ids(self) -> dict[str, str]:
        """Trial id -> MLflow run id."""
        return {trial_id: run.id for trial_id, run in self.runs.items()}

    def _run(self, trial) -> tracking.Run:
        if trial.trial_id not in self.runs:
            method, lr, seed, stage = _trial_label(trial.config)
            self.started[trial.trial_id] = time.monotonic()
            self.runs[trial.trial_id] = tracking.open_run(
                self.cfg["mlflow"]["tracking_uri"], self.cfg["mlflow"]["experiment"],
                f"{method} lr={lr:g} seed={seed}", kind="trial", parent=self.parent,
                params={**self.base_params, "method": method, "lr": lr, "seed": seed,
                        "stage": stage, "optimizer": self._optimizer(method)},
                tags={"stage": stage, "method": method},
                description=f"{'lr grid' if stage == 'grid' else 'seed'} trial: {method} at "
                f"lr {lr:g}, seed {seed}",
            )  # fmt: skip
        return self.runs[trial.trial_id]

    def _optimizer(self, method: str) -> str:
        """The optimiser the trial of ``method`` uses (the sweep's, or its protocol default)."""
        from asymvlm.methods.official import optimizer_defaults

        protocol = self.cfg.get("protocol", "improved")
        return self.cfg.get("optimizer") or optimizer_defaults(method, protocol)["optimizer"]

    @contextlib.contextmanager
    def progress(self, label: str, total: int):
        """A progress bar of finished trials on a terminal (none in logs and pipes); the log
        lines print above it."""
        from tqdm import tqdm

        with tqdm(total=total, desc=label, unit="trial", leave=False,
                  disable=not sys.stderr.isatty()) as bar:  # fmt: skip
            self._bar = bar
            try:
                yield bar
            finally:
                self._bar = None

    def _advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._run(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        run = self._run(trial)
        if "outcome" in result:
            log_outcome(run, self.cfg, result)
        elif "epoch" in result:
            metrics = {k: v for k, v in result.items() if k not in _NOT_METRICS}
            run.log_metrics(metrics, step=int(result["epoch"]))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        run = self._run(trial)
        if run.ended:
            return
        self._advance()
        result = trial.last_result or {}
        method, lr, seed, _ = _trial_label(trial.config)
        seconds = time.monotonic() - self.started.get(trial.trial_id, time.monotonic())
        score = result.get(SELECTION_METRIC)
        if "outcome" not in result:  # ended without a result: nothing to select
            run.end("FAILED", "the trial ended without reporting a result")
            logger.warning("trial %s lr=%g seed=%s FAILED: no result", method, lr, seed)
            return
        run.end("FINISHED")
        shown = "–" if score is None or not math.isfinite(score) else f"{score:.3f}"
        logger.info("trial %-14s lr=%-7g seed=%d  val R@1 %s  FINISHED  %4.0f s",
                    method, lr, seed, shown, seconds)  # fmt: skip

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        """A failed trial (any cause) is an MLflow run with status FAILED and its reason."""
        reason = failure_reason(_trial_error(trial))
        self._run(trial).end("FAILED", reason)
        self._advance()
        method, lr, seed, _ = _trial_label(trial.config)
        logger.warning("trial %s lr=%g seed=%d FAILED: %s", method, lr, seed, reason)


def _trial_error(trial) -> BaseException | str | None:
    """The error Tune just wrote beside the trial (local files: the copies in the experiment's
    storage are synced later)."""
    import ray.cloudpickle

    for path, read in (
        (trial.pickled_error_file, ray.cloudpickle.load),
        (trial.error_file, lambda fh: fh.read().decode(errors="replace")),
    ):
        if path and os.path.exists(path):
            try:
                with open(path, "rb") as fh:
                    return read(fh)
            except Exception:  # unreadable: try the next form; the run is logged regardless
                continue
    return None


def log_outcome(run: tracking.Run, cfg: dict[str, Any], result: dict[str, Any]) -> None:
    """A finished trial's final metrics, binned Recall@1 curves (JSON + PNG), every number of
    its evaluation (results.json) and adapter."""
    from asymvlm.plots import plot_binned_recall

    out = result["outcome"]
    method, lr, seed = result["method"], result["lr"], result["seed"]
    run.log_metrics({
        **results.retrieval_metric_names(out.get("test", {})),
        **results.retrieval_metric_names(out.get("val", {}), prefix="val_"),
        SELECTION_METRIC: result[SELECTION_METRIC],
    })  # fmt: skip
    curves = {
        split: {d: out[split][d].get("binned_recall@1") for d in results.DIRECTIONS}
        for split in ("val", "test")
        if split in out
    }
    run.log_json("binned_recall.json", curves)
    # every number of the evaluation, lists too (risk-coverage curves for the report)
    run.log_json("results.json", {split: out[split] for split in ("val", "test") if split in out})
    shown = out.get("test") or out.get("val")
    if shown:
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_binned_recall({method: shown}, os.path.join(tmp, "binned_recall.png"),
                                     title=f"{method} lr={lr:g} seed={seed}")  # fmt: skip
            run.log_artifact(png)
    if out.get("checkpoint"):
        from ray.train import Checkpoint

        # (path, filesystem) as Ray Train wrote it (pyarrow's own, for object stores)
        with Checkpoint(*storage.ray_storage(out["checkpoint"])).as_directory() as directory:
            run.log_model(os.path.join(directory, "model"), int(out["dim"]))


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
    with tracking.run(uri, experiment, f"sweep {name}", kind="sweep", parent=parent,
                      params=params, tags={"note": str(cfg.get("note") or ""), "sweep": name},
                      description=cfg.get("note") or None) as sweep_run:  # fmt: skip
        sweep_run.log_text("config.yaml", yaml.safe_dump(cfg, sort_keys=False))
        logger.info("sweep %s: MLflow run %s in %s (experiment %r)", name, sweep_run.id,
                    config.redact(uri), experiment)  # fmt: skip
        trial_logger = MlflowTrialLogger(cfg, sweep_run, base)
        selection, summary, failed, markdown = _stages(cfg, sweep_run, trial_logger, base)
    storage.write_text(storage.uri_join(cfg["output"], "summary.md"), markdown)
    storage.write_text(
        storage.uri_join(cfg["output"], SWEEP_RECORD),
        json.dumps({"parent_run_id": sweep_run.id, "experiment": experiment,
                    "tracking_uri": config.redact(uri), "selection": selection,
                    "summary": summary, "failed": failed}, indent=2),
    )  # fmt: skip
    return {
        "parent_run_id": sweep_run.id,
        "experiment_id": sweep_run.client.get_run(sweep_run.id).info.experiment_id,
        "tracking_uri": uri,
        "selection": selection,
        "summary": summary,
        "failed": failed,
        "markdown": markdown,
        "child_run_ids": list(trial_logger.child_ids.values()),
    }


def _stages(cfg: dict[str, Any], sweep_run: tracking.Run, trial_logger, base: dict[str, Any]):
    """Both stages and the summary, logged on ``sweep_run``; (selection, summary, failed,
    summary markdown)."""
    failed: list[dict[str, Any]] = []
    name = cfg.get("name") or "sweep"
    arms = [{"method": m, "lr": lr} for m in cfg["methods"] for lr in cfg["lr"]]
    if len(cfg["lr"]) > 1:
        logger.info("sweep %s, stage 1: %d trials (method x lr, seed %d)", name, len(arms),
                    cfg["seeds"][0])  # fmt: skip
        grid, grid_failed = _run_stage(cfg, "grid", arms, [cfg["seeds"][0]], trial_logger)
        failed += grid_failed
        selection = select_lr(grid)
        for method, pick in selection.items():
            logger.info("sweep %s: %s best lr %g (%s %.4f)", name, method, pick["lr"],
                        SELECTION_METRIC, pick["score"])  # fmt: skip
    else:  # one lr: nothing to select
        selection = {m: {"lr": cfg["lr"][0], "score": None, "scores_by_lr": {}}
                     for m in cfg["methods"]}  # fmt: skip
    for method in [m for m in cfg["methods"] if m not in selection]:
        logger.warning("sweep %s: %s failed at every lr; left out of stage 2", name, method)
    sweep_run.log_params({f"best_lr/{m}": pick["lr"] for m, pick in selection.items()})
    if not selection:
        raise NoResults(f"sweep {name}: every trial failed; first reason: "
                        f"{failed[0]['reason']}")  # fmt: skip
    best = [{"method": m, "lr": selection[m]["lr"]} for m in selection]
    logger.info("sweep %s, stage 2: %d methods x %d seeds", name, len(best), len(cfg["seeds"]))
    repeats, seed_failed = _run_stage(cfg, "seeds", best, cfg["seeds"], trial_logger)
    failed += seed_failed
    flat = [
        {"method": r["method"], "seed": r["seed"],
         **results.retrieval_metric_names(r["outcome"].get("test", {}))}
        for r in repeats
    ]  # fmt: skip
    summary = results.seed_summary(flat)
    title = f"{base['dataset']} ({base['embedding_model']}), mean ± std over seeds"
    markdown = results.summary_markdown(summary, title=title) + failures_markdown(failed)
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
    return selection, summary, failed, markdown


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
        json.dump({"parent_run_id": out["parent_run_id"],
                   "tracking_uri": config.redact(out["tracking_uri"]),
                   "selection": out["selection"], "failed_trials": len(out["failed"])},
                  sys.stdout, indent=2)  # fmt: skip
        print()
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
