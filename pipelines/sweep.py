"""Ray Tune sweep of the paper's protocol (App. B.4), tracked in MLflow.

    python pipelines/sweep.py --config tune_spaces/cpu-small.yaml [--set key=value ...]
    ray job submit --working-dir . -- python pipelines/sweep.py --config tune_spaces/coco-clip.yaml

Stage 1 grid-searches ``method x lr`` with seed 0; the best lr of every method is chosen on the
**validation** split (mean of t2i and i2t Recall@1; the test split never takes part); stage 2
repeats each method at its best lr with every seed in ``seeds``. Every trial is one Ray Train
run (:mod:`pipelines.train`, DDP over ``num_workers`` workers); with GPUs, trials are packed on
fractional GPUs (``gpus_per_worker``, e.g. 0.25 puts four single-worker trials on one GPU).

MLflow (the driver is the only writer): one parent run per sweep with the resolved config, the
git commit, the lr selection and the mean ± std table over seeds (Table A.2 layout, markdown and
CSV); one nested child run per trial with params, per-epoch curves, final metrics, the binned
Recall@1 curves (JSON + PNG) and the adapter as an MLflow model. Default store:
``sqlite:///<output>/mlflow.db`` -- open it with ``mlflow ui --backend-store-uri <that URI>``.

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
import os
import sys
import tempfile
from dataclasses import fields
from typing import Any

import yaml
from ray import tune

if __package__ in (None, ""):  # run as a script: make `pipelines` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymvlm import tables, tracking  # noqa: E402
from asymvlm.training import TrainConfig  # noqa: E402
from pipelines.train import run_config_dict, run_training  # noqa: E402

if __name__ != "__main__":  # see pipelines/train.py
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

REQUIRED = ("embeddings", "methods", "lr", "seeds", "epochs", "batch_size", "optimizer",
            "num_workers", "mlflow")  # fmt: skip
_TRAIN_KEYS = {f.name for f in fields(TrainConfig)} - {"method", "lr", "seed", "method_kwargs"}
SELECTION_METRIC = "val_mean_recall_at_1"
TRIAL_DRIVER_MEMORY = 256 * 1024**2  # bytes (a logical reservation)


# -- configuration ------------------------------------------------------------------------------
def load_config(path: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read the YAML (plus ``--set`` overrides), check it and fill the defaults."""
    with open(path) as fh:
        doc = yaml.safe_load(fh) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    for key, value in (overrides or {}).items():
        target = doc
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return resolve_config(doc, source=path)


def resolve_config(doc: dict[str, Any], source: str = "<config>") -> dict[str, Any]:
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise ValueError(f"{source}: missing keys {missing}")
    cfg = dict(doc)
    for key in ("methods", "lr", "seeds"):
        if not isinstance(cfg[key], list) or not cfg[key]:
            raise ValueError(f"{source}: {key!r} must be a non-empty list, got {cfg[key]!r}")
    from asymvlm.methods import METHODS

    unknown = [m for m in cfg["methods"] if m not in METHODS]
    if unknown:
        raise ValueError(f"{source}: unknown methods {unknown}; known: {sorted(METHODS)}")
    cfg["lr"] = [float(v) for v in cfg["lr"]]
    cfg["seeds"] = [int(v) for v in cfg["seeds"]]
    mlflow_cfg = dict(cfg.get("mlflow") or {})
    mlflow_cfg.setdefault("experiment", "asymvlm")
    cfg["mlflow"] = mlflow_cfg
    cfg.setdefault("output", os.path.join("runs", mlflow_cfg["experiment"]))
    # Trials run in their own working directories: local paths become absolute here.
    for key in ("output", "embeddings", "test_embeddings"):
        if cfg.get(key) and "://" not in str(cfg[key]):
            cfg[key] = os.path.abspath(cfg[key])
    if not mlflow_cfg.get("tracking_uri"):
        mlflow_cfg["tracking_uri"] = tracking.default_tracking_uri(cfg["output"])
    for key, default in (("train_split", "train"), ("val_split", "val"), ("test_split", "test"),
                         ("checkpoint_every", 5), ("max_failures", 1), ("cpus_per_worker", 1.0),
                         ("gpus_per_worker", 1.0), ("method_kwargs", {})):  # fmt: skip
        cfg.setdefault(key, default)
    return cfg


def _train_config(cfg: dict[str, Any], method: str, lr: float, seed: int) -> dict[str, Any]:
    train = {k: cfg[k] for k in _TRAIN_KEYS if k in cfg}
    train.update(method=method, lr=lr, seed=seed)
    train["method_kwargs"] = dict(cfg["method_kwargs"].get(method, {}))
    return train


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
    out = run_training(
        run,
        name=f"{config['stage']}-{method}-lr{lr:g}-seed{seed}",
        storage_path=os.path.join(cfg["output"], "ray"),
        num_workers=cfg["num_workers"],
        cpus_per_worker=cfg["cpus_per_worker"],
        gpus_per_worker=cfg["gpus_per_worker"],
        max_failures=cfg["max_failures"],
    )
    val = tracking.retrieval_metric_names(out.get("val", {}), prefix="val_")
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


def _run_stage(cfg: dict[str, Any], stage: str, arms: list[dict], seeds: list[int], logger):
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
            storage_path=os.path.join(cfg["output"], "tune"),
            callbacks=[logger],
            verbose=1,
        ),
    )
    with contextlib.redirect_stdout(sys.stderr):  # Tune's tables: stdout carries the result
        results = tuner.fit()
    failed = [r for r in results if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} {stage} trial(s) failed; first: {failed[0].error}")
    return [r.metrics for r in results]


# -- MLflow (driver only) -----------------------------------------------------------------------
class MlflowTrialLogger(tune.Callback):
    """Tune callback on the driver: one nested child run per finished trial, as it finishes."""

    def __init__(self, cfg: dict[str, Any], parent_id: str, base_params: dict[str, Any]) -> None:
        self.cfg, self.parent_id, self.base_params = cfg, parent_id, base_params
        self.child_ids: dict[str, str] = {}

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        result = trial.last_result or {}
        if "outcome" in result:
            self.child_ids[trial.trial_id] = log_child_run(
                self.cfg, self.parent_id, self.base_params, result
            )


def log_child_run(
    cfg: dict[str, Any], parent_id: str, base_params: dict[str, Any], result: dict[str, Any]
) -> str:
    import mlflow
    from mlflow import MlflowClient

    from asymvlm.plots import plot_binned_recall

    client = MlflowClient(cfg["mlflow"]["tracking_uri"])
    experiment = client.get_run(parent_id).info.experiment_id
    out = result["outcome"]
    method, lr, seed, stage = result["method"], result["lr"], result["seed"], result["stage"]
    run = client.create_run(
        experiment,
        run_name=f"{method} lr={lr:g} seed={seed}",
        tags={"mlflow.parentRunId": parent_id, "stage": stage, "method": method},
    )
    run_id = run.info.run_id
    params = {**base_params, "method": method, "lr": lr, "seed": seed, "stage": stage}
    for key, value in params.items():
        client.log_param(run_id, key, value)
    tracking.log_history(client, run_id, out.get("history", []))
    final = {
        **tracking.retrieval_metric_names(out.get("test", {})),
        **tracking.retrieval_metric_names(out.get("val", {}), prefix="val_"),
        SELECTION_METRIC: result[SELECTION_METRIC],
    }
    for key, value in final.items():
        client.log_metric(run_id, key, value)
    with tempfile.TemporaryDirectory() as tmp:
        curves = {
            split: {d: out[split][d].get("binned_recall@1") for d in tracking.DIRECTIONS}
            for split in ("val", "test")
            if split in out
        }
        client.log_artifact(run_id, tracking.write_json(os.path.join(tmp, "binned_recall.json"),
                                                        curves))  # fmt: skip
        shown = out.get("test") or out.get("val")
        if shown:
            png = plot_binned_recall({method: shown}, os.path.join(tmp, "binned_recall.png"),
                                     title=f"{method} lr={lr:g} seed={seed}")  # fmt: skip
            client.log_artifact(run_id, png)
    if out.get("checkpoint"):
        from ray.train import Checkpoint

        with (
            Checkpoint(out["checkpoint"]).as_directory() as directory,
            mlflow.start_run(run_id=run_id),
        ):
            mlflow.set_tracking_uri(cfg["mlflow"]["tracking_uri"])
            tracking.log_uncertainty_model(os.path.join(directory, "model"), int(out["dim"]))
    client.set_terminated(run_id)
    return run_id


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
        "optimizer": cfg["optimizer"],
        "num_workers": cfg["num_workers"],
        **{k: cfg[k] for k in ("hidden_dim", "depth", "adapter_input") if k in cfg},
    }


# -- the sweep ----------------------------------------------------------------------------------
def run_sweep(cfg: dict[str, Any]) -> dict[str, Any]:
    """Stage 1 (grid, seed 0) -> lr selection on validation -> stage 2 (seeds) -> summary."""
    import mlflow
    import ray
    from mlflow import MlflowClient

    check_tables(cfg)
    os.makedirs(cfg["output"], exist_ok=True)
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False)
    uri = cfg["mlflow"]["tracking_uri"]
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    experiment_id = tracking.experiment_id(client, cfg["mlflow"]["experiment"], uri)
    base = _base_params(cfg)
    tags = {"kind": "sweep", "note": str(cfg.get("note") or "")}
    parent = client.create_run(experiment_id, run_name=cfg.get("name") or "sweep", tags=tags)
    parent_id = parent.info.run_id
    for key in ("methods", "lr", "seeds"):
        client.log_param(parent_id, key, json.dumps(cfg[key]))
    for key, value in base.items():
        client.log_param(parent_id, key, value)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump(cfg, fh, sort_keys=False)
        client.log_artifact(parent_id, path)
    logger = MlflowTrialLogger(cfg, parent_id, base)
    _print(f"MLflow: {uri} (experiment {cfg['mlflow']['experiment']!r}, parent run {parent_id})")

    try:
        arms = [{"method": m, "lr": lr} for m in cfg["methods"] for lr in cfg["lr"]]
        if len(cfg["lr"]) > 1:
            _print(f"stage 1: {len(arms)} trials (method x lr, seed {cfg['seeds'][0]})")
            grid = _run_stage(cfg, "grid", arms, [cfg["seeds"][0]], logger)
            selection = select_lr(grid)
        else:  # one lr: nothing to select
            _print(f"stage 1 skipped: a single lr ({cfg['lr'][0]:g})")
            selection = {m: {"lr": cfg["lr"][0], "score": float("nan"), "scores_by_lr": {}}
                         for m in cfg["methods"]}  # fmt: skip
        for method, pick in selection.items():
            client.log_param(parent_id, f"best_lr/{method}", pick["lr"])
            _print(f"  {method}: best lr {pick['lr']:g} ({SELECTION_METRIC} {pick['score']:.4f})")
        best = [{"method": m, "lr": selection[m]["lr"]} for m in cfg["methods"]]
        _print(f"stage 2: {len(best)} methods x {len(cfg['seeds'])} seeds")
        repeats = _run_stage(cfg, "seeds", best, cfg["seeds"], logger)

        flat = [
            {"method": r["method"], "seed": r["seed"],
             **tracking.retrieval_metric_names(r["outcome"].get("test", {}))}
            for r in repeats
        ]  # fmt: skip
        summary = tracking.seed_summary(flat)
        title = f"{base['dataset']} ({base['embedding_model']}), mean ± std over seeds"
        markdown = tracking.summary_markdown(summary, title=title)
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in (
                ("summary.md", markdown),
                ("summary.csv", tracking.summary_csv(summary)),
            ):
                with open(os.path.join(tmp, name), "w") as fh:
                    fh.write(text)
                client.log_artifact(parent_id, os.path.join(tmp, name))
            client.log_artifact(parent_id, tracking.write_json(
                os.path.join(tmp, "selection.json"), selection))  # fmt: skip
        for method, cells in summary.items():
            for col, stats in cells.items():
                if isinstance(stats, dict):
                    client.log_metric(parent_id, f"{method}/{col}_mean", stats["mean"])
                    client.log_metric(parent_id, f"{method}/{col}_std", stats["std"])
        client.set_terminated(parent_id)
    except BaseException:
        client.set_terminated(parent_id, status="FAILED")
        raise
    with open(os.path.join(cfg["output"], "summary.md"), "w") as fh:
        fh.write(markdown)
    tracking.write_json(
        os.path.join(cfg["output"], "sweep.json"),
        {"parent_run_id": parent_id, "experiment_id": experiment_id, "tracking_uri": uri,
         "selection": selection, "summary": summary},
    )  # fmt: skip
    _print(markdown)
    _print(f"open the runs: mlflow ui --backend-store-uri {uri}")
    return {
        "parent_run_id": parent_id,
        "experiment_id": experiment_id,
        "tracking_uri": uri,
        "selection": selection,
        "summary": summary,
        "child_run_ids": list(logger.child_ids.values()),
    }


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
    if val and val not in tables.list_splits(cfg["embeddings"]) and not cfg.get("val_fraction"):
        raise tables.TableError(
            f"{cfg['embeddings']}: no validation split {val!r}; add one or set val_fraction "
            "to hold out training images for the lr selection"
        )


def select_lr(grid: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method, the lr with the best validation score (ties: the smaller lr)."""
    best: dict[str, dict[str, Any]] = {}
    scores: dict[str, dict[str, float]] = {}
    for r in sorted(grid, key=lambda r: (r["method"], r["lr"])):
        score = float(r[SELECTION_METRIC])
        scores.setdefault(r["method"], {})[f"{r['lr']:g}"] = score
        current = best.get(r["method"])
        if current is None or score > current["score"]:
            best[r["method"]] = {"lr": r["lr"], "score": score}
    for method in best:
        best[method]["scores_by_lr"] = scores[method]
    return best


def _print(msg: str) -> None:
    print(f"[sweep] {msg}", file=sys.stderr, flush=True)


def _parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a YAML of tune_spaces/")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key (dots for nesting: mlflow.experiment=x)",
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, _parse_set(args.set))
        check_tables(cfg)
    except (OSError, ValueError, tables.TableError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = run_sweep(cfg)
    json.dump({k: out[k] for k in ("parent_run_id", "tracking_uri", "selection")}, sys.stdout,
              indent=2)  # fmt: skip
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
