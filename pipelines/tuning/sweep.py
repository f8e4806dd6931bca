"""Ray Tune sweep of the paper's protocol (App. B.4), tracked in MLflow: :func:`run_sweep`.

Stage 1 grid-searches ``method x lr`` at the first seed; each method's lr is chosen on the
validation split (mean of t2i and i2t Recall@1); stage 2 runs the other seeds at that lr. One
MLflow run per sweep (nested under the pipeline's), one nested run per trial; the keys are
those of :class:`pipelines.schema.SweepConfig`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from typing import Any

import yaml
from ray import tune

from asymvlm import config, results, storage, tables, tracking
from asymvlm.errors import AsymVLMError, ConfigError, Unfinished, one_line
from asymvlm.methods import METHODS
from pipelines.schema import SweepConfig, check_shared_output
from pipelines.session import require_ray
from pipelines.tuning.journal import Journal, Previous, TrialJournal, restored_key
from pipelines.tuning.outcomes import failures_markdown, select_lr
from pipelines.tuning.search import StagedSearch
from pipelines.tuning.trial_log import MlflowTrialLogger
from pipelines.tuning.trials import (
    SELECTION_METRIC,
    direct_trial,
    failure_reason,
    torch_trainer_trial,
)
from pipelines.tuning.waiting import NodeWait

__all__ = [
    "ADAPTERS_DIR",
    "KEEP_CHECKPOINTS",
    "SWEEP_RECORD",
    "NoResults",
    "check_tables",
    "failures_markdown",
    "run_sweep",
    "select_lr",
]

logger = logging.getLogger("pipelines.sweep")

SWEEP_RECORD = "sweep.json"  # written last: a sweep with it is done
TRIAL_DRIVER_MEMORY = 256 * 1024**2  # bytes (a logical reservation)
KEEP_CHECKPOINTS = 2  # per trial, the latest (a Ray Train run keeps as many of its own)


def _concurrency(sweep: SweepConfig) -> int:
    """Trials that fit the cluster at once (each needs num_workers x per-worker resources)."""
    import ray

    total = ray.cluster_resources()
    workers = sweep.num_workers
    fits = [int(total.get("CPU", 1) // max(workers * sweep.cpus_per_worker, 1e-9))]
    if total.get("GPU", 0) > 0:
        fits.append(int(total["GPU"] // (workers * sweep.gpus_per_worker)))
    return max(1, min(fits))


def _run_trials(
    sweep: SweepConfig, search: StagedSearch, trial_logger, journal: Journal, total: int
):
    """Both stages as one Tune experiment; (finished trials' final rows, failed trials with
    their reasons). :class:`~asymvlm.errors.Unfinished` when trials waited ``node_wait_s``."""
    label = sweep.label
    tune_path, tune_fs = storage.ray_storage(storage.uri_join(sweep.output, "tune"))
    if sweep.uses_torch_trainer():
        # the TorchTrainer's workers reserve the CPUs/GPUs; the trial a little memory
        trainable = tune.with_resources(
            torch_trainer_trial, {"cpu": 0, "memory": TRIAL_DRIVER_MEMORY}
        )
        retries = tune.FailureConfig(max_failures=0)  # the TorchTrainer retries its workers
    else:  # the protocol runs in the trial: it holds the worker's CPUs (or GPU share)
        import ray

        gpu = ray.cluster_resources().get("GPU", 0) > 0
        resources = {"cpu": sweep.cpus_per_worker, "gpu": sweep.gpus_per_worker if gpu else 0}
        trainable = tune.with_resources(direct_trial, resources)
        retries = tune.FailureConfig(max_failures=sweep.max_failures)
    tuner = tune.Tuner(
        trainable,
        param_space={"sweep": sweep},  # the validated sweep crosses the Tune boundary as is
        tune_config=tune.TuneConfig(
            search_alg=search,
            num_samples=-1,  # until the search says it has finished
            max_concurrent_trials=_concurrency(sweep),
            reuse_actors=not sweep.uses_torch_trainer(),
        ),
        run_config=tune.RunConfig(
            name="trials",
            storage_path=tune_path,
            storage_filesystem=tune_fs,
            callbacks=[trial_logger, TrialJournal(journal), NodeWait(sweep.node_wait_s, label)],
            failure_config=retries,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
            verbose=0,  # one line per finished trial comes from the MLflow callback
        ),
    )
    with (
        contextlib.redirect_stdout(sys.stderr),  # stdout carries the result
        trial_logger.progress(label, total),
    ):
        try:
            grid = tuner.fit()
        except Unfinished as exc:  # the trials' runs wait, KILLED, for the rerun to reopen
            trial_logger.end_open_runs("KILLED", one_line(exc))
            raise
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
                failed.append(
                    {
                        "stage": r.config["stage"],
                        **trial,
                        "reason": row.get("failed") or failure_reason(r.error),
                    }
                )
    return done, failed


def _base_params(sweep: SweepConfig) -> dict[str, Any]:
    try:
        manifest = tables.read_manifest(sweep.embeddings)
        model, dataset = manifest.model, manifest.to_dict().get("dataset")
        splits = manifest.to_dict().get("splits", {})
        dataset = dataset or splits.get(sweep.train_split, {}).get("dataset")
    except Exception:  # the params are provenance; a missing manifest fails later, clearly
        model, dataset = None, None
    return {
        "dataset": dataset or os.path.basename(os.path.normpath(sweep.embeddings)),
        "embedding_model": model,
        "embeddings": sweep.embeddings,
        "git_commit": tracking.git_commit(),
        "epochs": sweep.epochs,
        "batch_size": sweep.batch_size,
        "protocol": sweep.protocol,
        "optimizer": sweep.optimizer or "per method (protocol default)",
        "num_workers": sweep.num_workers,
        **{
            k: getattr(sweep, k)
            for k in ("hidden_dim", "depth", "adapter_input")
            if getattr(sweep, k) is not None
        },
    }


# -- the sweep ----------------------------------------------------------------------------------
def run_sweep(sweep: SweepConfig, parent: str | None = None) -> dict[str, Any]:
    """Stage 1 -> lr selection on validation -> stage 2 -> summary, on the running Ray cluster;
    the sweep's MLflow run nested under ``parent`` when given."""
    require_ray("a sweep")
    check_tables(sweep)
    if not storage.is_remote(sweep.output):
        os.makedirs(sweep.output, exist_ok=True)
    check_shared_output(sweep.output, sweep.storage.shared_filesystem)
    uri, experiment = sweep.mlflow.tracking_uri, sweep.mlflow.experiment
    base = _base_params(sweep)
    params = {**{k: json.dumps(getattr(sweep, k)) for k in ("methods", "lr", "seeds")}, **base}
    name = sweep.label
    journal = Journal(sweep)  # an earlier run of this sweep: what it finished, where it stood
    previous, earlier_run = journal.previous(), journal.run_id()
    finished, resumable = previous.counts()
    if finished or resumable:
        logger.info(
            "sweep %s: going on from an earlier run (%s): %d finished trial(s) read "
            "back, %d go on from their checkpoints",
            name,
            storage.uri_join(sweep.output, "journal"),
            finished,
            resumable,
        )
    previous_runs: dict[str, tuple[str, str]] = {}  # trial label -> its earlier run, status

    def open_sweep_run() -> tracking.Run:
        try:
            run = _reopen(uri, earlier_run, previous_runs) if earlier_run else None
            if run is None:
                run = tracking.open_run(
                    uri,
                    experiment,
                    f"sweep {name}",
                    kind="sweep",
                    parent=parent,
                    params=params,
                    tags={"note": str(sweep.note or ""), "sweep": name},
                    description=sweep.note or None,
                )
        except Exception as exc:  # stops the sweep at Tune's next event (MlflowTrialLogger)
            raise ConfigError(
                f"mlflow.tracking_uri: cannot open the MLflow store {config.redact(uri)}: {exc}"
            ) from None
        if run.id:  # None while its creation waits for MLflow (unreachable)
            journal.set_run_id(run.id)
        run.log_text("config.yaml", yaml.safe_dump(sweep.model_dump(mode="json"), sort_keys=False))
        logger.info(
            "sweep %s: MLflow run %s in %s (experiment %r)",
            name,
            run.id,
            config.redact(uri),
            experiment,
        )
        return run

    trial_logger = MlflowTrialLogger(sweep, open_sweep_run, base, previous_runs)
    with tracking.ended(trial_logger.opened_parent):  # FINISHED, FAILED or KILLED
        try:
            selection, summary, failed, markdown, adapters = _stages(
                sweep, trial_logger, base, journal, previous
            )
        except Unfinished as exc:  # not a failure: the rerun reopens the run and goes on
            reason = one_line(exc)
            trial_logger.submit(lambda: trial_logger.parent.end("KILLED", reason))
            raise
        finally:
            trial_logger.close()  # every write done before the sweep's run ends
    sweep_run = trial_logger.parent
    storage.write_text(storage.uri_join(sweep.output, "summary.md"), markdown)
    record = {
        "parent_run_id": sweep_run.id,
        "experiment": experiment,
        "tracking_uri": config.redact(uri),
        "selection": selection,
        "summary": summary,
        "failed": failed,
        "adapters": adapters,
    }
    storage.write_text(storage.uri_join(sweep.output, SWEEP_RECORD), json.dumps(record, indent=2))
    return {
        **record,
        "experiment_id": _experiment_id(sweep_run),
        "tracking_uri": uri,
        "markdown": markdown,
        "child_run_ids": list(trial_logger.child_ids.values()),
    }


def _reopen(
    uri: str, run_id: str, previous_runs: dict[str, tuple[str, str]]
) -> tracking.Run | None:
    """The sweep's run of an earlier attempt, RUNNING again, its trials' runs put in
    ``previous_runs``; None if the store lost it."""
    try:
        children = tracking.child_runs(uri, run_id, status="")
    except Exception as exc:  # e.g. MlflowException RESOURCE_DOES_NOT_EXIST: a new store
        logger.warning(
            "the sweep's earlier MLflow run %s is not in the store (%s): a new run is opened",
            run_id,
            one_line(exc),
        )
        return None
    for child in sorted(children, key=lambda r: r.info.start_time):
        if child.data.tags.get("trial"):
            previous_runs[child.data.tags["trial"]] = (child.info.run_id, child.info.status)
    return tracking.resume_run(uri, run_id)


def _stages(
    sweep: SweepConfig, trial_logger, base: dict[str, Any], journal: Journal, previous: Previous
):
    """Both stages and the summary, logged on the sweep's run; (selection, summary, failed,
    summary markdown, exported adapters). Trials ``previous`` finished are read back."""
    name = sweep.label
    first = sweep.seeds[0]
    grid = [{"method": m, "lr": lr, "seed": first} for m in sweep.methods for lr in sweep.lr]
    grid = grid if len(sweep.lr) > 1 else []  # one lr: nothing to select
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
            pick = {"lr": sweep.lr[0], "score": None, "scores_by_lr": {}}
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
            lambda: trial_logger.parent.log_params({f"best_lr/{method}": pick["lr"]})
        )
        seeds = [s for s in sweep.seeds if s not in {r["seed"] for r in mine}]
        if grid:
            logger.info(
                "sweep %s: %s best lr %g (%s %.4f); stage 2: seeds %s",
                name,
                method,
                pick["lr"],
                SELECTION_METRIC,
                pick["score"],
                ", ".join(map(str, seeds)) or "none left",
            )
        return [{"method": method, "lr": pick["lr"], "seed": s} for s in seeds]

    if grid:
        logger.info(
            "sweep %s, stage 1: %d trials (method x lr, seed %d); each method's stage 2 "
            "follows its grid",
            name,
            len(grid),
            first,
        )
    total = len(grid) + len(sweep.methods) * (len(sweep.seeds) - (1 if grid else 0))
    read_back: list[str] = []  # keys of the trials an earlier run finished

    def read(stage: str, trial: dict[str, Any]) -> str:
        record = previous.get(stage, trial)
        assert record is not None
        key = restored_key(record.label)
        trial_logger.read_back(key, record)
        read_back.append(key)
        return key

    packable = frozenset(m for m in sweep.methods if METHODS[m].trainable)
    search = StagedSearch(sweep.methods, grid, select, sweep.pack, packable, previous, read)
    done, failed = _run_trials(sweep, search, trial_logger, journal, total - len(read_back))
    done += [trial_logger.final[k] for k in read_back if trial_logger.final[k]["stage"] == "seeds"]
    selection = {m: selection[m] for m in sweep.methods if m in selection}  # config order
    if not selection:
        raise NoResults(f"sweep {name}: every trial failed; first reason: {failed[0]['reason']}")
    repeats = reused + [r for r in done if r["stage"] == "seeds"]
    flat = [
        {
            "method": r["method"],
            "seed": r["seed"],
            **results.retrieval_metric_names(r["outcome"].get("test", {})),
        }
        for r in repeats
    ]
    summary = results.seed_summary(flat)
    title = f"{base['dataset']} ({base['embedding_model']}), mean ± std over seeds"
    markdown = results.summary_markdown(summary, title=title) + failures_markdown(failed)
    seed_keys += [k for k, r in trial_logger.final.items() if r.get("stage") == "seeds"]
    adapters = export_adapters(sweep, trial_logger, seed_keys)
    sweep_run = trial_logger.parent
    sweep_run.log_metrics({"failed_trials": len(failed)})
    sweep_run.set_tags({"failed_trials": str(len(failed))})
    sweep_run.log_text("summary.md", markdown)
    sweep_run.log_text("summary.csv", results.summary_csv(summary))
    sweep_run.log_json("selection.json", selection)
    sweep_run.log_json("failures.json", failed)
    sweep_run.log_metrics(
        {
            f"{method}/{col}_{stat}": stats[stat]
            for method, cells in summary.items()
            for col, stats in cells.items()
            if isinstance(stats, dict)
            for stat in ("mean", "std")
        }
    )
    return selection, summary, failed, markdown, adapters


def _experiment_id(run: tracking.Run) -> str | None:
    """The experiment of ``run``; None while MLflow cannot say (its writes wait for it)."""
    try:
        return run.client.get_run(run.id).info.experiment_id if run.id else None
    except Exception as exc:  # the store is away: the sweep's results stand without it
        logger.warning("MLflow: the sweep's experiment id is unknown for now (%s)", one_line(exc))
        return None


#: Where a sweep leaves its seed-stage adapters: ``<output>/adapters/<method>/seed<k>``.
ADAPTERS_DIR = "adapters"


def export_adapters(sweep: SweepConfig, trial_logger, keys: list[str]) -> dict[str, Any]:
    """Every seed-stage adapter (the runs ``keys``) copied to a checkpoint folder
    ``<output>/adapters/<method>/seed<seed>``; method -> seed -> its URI."""
    out: dict[str, dict[str, str]] = {}
    for key in dict.fromkeys(keys):
        row = trial_logger.final[key]
        uri = storage.uri_join(sweep.output, ADAPTERS_DIR, row["method"], f"seed{row['seed']}")
        if trial_logger.export_adapter(key, uri):
            out.setdefault(row["method"], {})[str(row["seed"])] = uri
    return out


class NoResults(AsymVLMError):
    """Every trial of a sweep failed: nothing to select or summarise."""


def check_tables(sweep: SweepConfig) -> None:
    """Fail before any trial starts when the tables or splits the sweep needs are missing."""
    needs = [(sweep.embeddings, sweep.train_split)]
    if sweep.test_split:
        needs.append((sweep.test_embeddings or sweep.embeddings, sweep.test_split))
    for root, split in needs:
        tables.read_manifest(root)  # raises TableError naming the missing manifest
        if split not in tables.list_splits(root):
            raise tables.TableError(
                f"{root}: no split {split!r} (found {tables.list_splits(root)})"
            )
    val = sweep.val_split
    if len(sweep.lr) > 1 and not val and not sweep.val_fraction:
        raise ConfigError(
            f"{len(sweep.lr)} learning rates but no validation data to choose among them: "
            "set val_split or val_fraction (the test split never takes part in the choice)"
        )
    if val and val not in tables.list_splits(sweep.embeddings) and not sweep.val_fraction:
        raise tables.TableError(
            f"{sweep.embeddings}: no validation split {val!r}; add one or set val_fraction "
            "to hold out training images for the lr selection"
        )
