"""The paper's sweep (App. B.4) on Ray Tune, tracked in MLflow (:func:`run_sweep`): its checks,
its MLflow run, the trials (:func:`~.staged_search.run_trials`), each method's lr
(:mod:`~.lr_selection`), the mean ± std over seeds, the seed adapters and ``sweep.json``."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import yaml

from asymvlm import config, storage, tables, tracking
from asymvlm.checkpoints import copy_adapter
from asymvlm.checkpoints.folder import RESUME_MAY_DIFFER
from asymvlm.errors import AsymVLMError, ConfigError, Unfinished, one_line
from asymvlm.metrics import glossary
from asymvlm.report import seed_tables
from asymvlm_ray.schema import SweepConfig, check_shared_output
from asymvlm_ray.session import require_ray
from asymvlm_ray.tuning.lr_selection import selection
from asymvlm_ray.tuning.records import FailedTrial, SweepRecord, SweepResult, TrialOutcome
from asymvlm_ray.tuning.staged_search import run_trials
from asymvlm_ray.tuning.trial_log import MlflowTrialLogger, trial_runs

logger = logging.getLogger(__name__)

SWEEP_RECORD = "sweep.json"  # written last: a sweep with it is done (:class:`SweepRecord`)
ADAPTERS_DIR = "adapters"  # <output>/adapters/<method>/seed<k>: the seed stage's adapters
_RUN_ID = "mlflow_run.json"  # in <output>/tune: the sweep's MLflow run, reopened by a rerun
_SETTINGS = "settings.json"  # in <output>/tune: what the sweep there trains, for a rerun to match
#: What a rerun may change: where and how the trials run, not what they train.
RERUN_MAY_DIFFER = RESUME_MAY_DIFFER | set(
    "name note output mlflow storage ray max_failures node_wait_s cpus_per_worker gpus_per_worker "
    "fault_injection".split()
)


class NoResults(AsymVLMError):
    """Every trial of a sweep failed: nothing to select or summarise."""


def read_record(output: str) -> SweepRecord:
    """The record of the finished sweep in ``output``."""
    text = storage.read_text(storage.uri_join(output, SWEEP_RECORD))
    return SweepRecord.model_validate(json.loads(text))


def failures_markdown(failed: list[FailedTrial]) -> str:
    """The failed trials under the summary table: how many, which, and why."""
    if not failed:
        return ""
    head = f"\n**{len(failed)} trial(s) failed** and are left out of the selection and the table"
    lines = [head + " above:\n", "| stage | method | lr | seed | reason |", "|---|---|---|---|---|"]
    for f in failed:
        reason = f.reason.replace("|", "\\|")
        lines.append(f"| {f.stage} | {f.method} | {f.lr:g} | {f.seed} | {reason} |")
    return "\n".join(lines) + "\n"


def check_tables(sweep: SweepConfig) -> None:
    """Fail before any trial starts when the tables or splits the sweep needs are missing."""
    sweep.run_spec(sweep.methods[0], sweep.lr[0], sweep.seeds[0]).check_splits()
    if sweep.selects_lr and not sweep.val_split and not sweep.val_fraction:
        raise ConfigError(
            f"{len(sweep.lr)} learning rates but no validation data to choose among them: "
            "set val_split or val_fraction (the test split never takes part in the choice)"
        )


def _settings(sweep: SweepConfig) -> dict[str, Any]:
    """What the sweep trains: its settings but those a rerun may change."""
    return {k: v for k, v in sweep.model_dump(mode="json").items() if k not in RERUN_MAY_DIFFER}


def check_rerun(sweep: SweepConfig) -> None:
    """Refuse a sweep into an output whose sweep was run with other settings, naming them: its
    MLflow runs and adapters would mix two trainings (a rerun with the same settings goes on)."""
    then = storage.read_json(storage.uri_join(sweep.output, "tune"), _SETTINGS)
    if then is None:
        return
    now = _settings(sweep)
    keys = sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))
    if keys:
        diffs = "; ".join(f"{k} {then.get(k)!r} (then) vs {now.get(k)!r} (now)" for k in keys)
        raise ConfigError(
            f"sweep {sweep.label}: {sweep.output} holds a sweep run with other settings: {diffs}. "
            "Run it with those settings to go on, or give these settings another output "
            f"folder (or delete {sweep.output} to start over)"
        )


def _base_params(sweep: SweepConfig) -> dict[str, Any]:
    """The provenance every run of the sweep carries as params."""
    manifest = tables.read_manifest(sweep.embeddings)
    doc = manifest.to_dict()
    dataset = doc.get("dataset") or doc.get("splits", {}).get(sweep.train_split, {}).get("dataset")
    keys = ("epochs", "batch_size", "protocol", "hidden_dim", "depth", "adapter_input")
    return {
        "dataset": dataset or os.path.basename(os.path.normpath(sweep.embeddings)),
        "embedding_model": manifest.model,
        "embeddings": sweep.embeddings,
        "git_commit": tracking.git_commit(),
        "optimizer": sweep.optimizer or "per method (protocol default)",
        **{k: getattr(sweep, k) for k in keys if getattr(sweep, k) is not None},
    }


def _sweep_run(
    sweep: SweepConfig, base: dict[str, Any], parent: str | None, key: str
) -> tracking.Run:
    """The sweep's MLflow run (``key``): an earlier attempt's, RUNNING again, else a new one."""
    uri = sweep.mlflow.tracking_uri
    folder = storage.uri_join(sweep.output, "tune")
    earlier = (storage.read_json(folder, _RUN_ID) or {}).get("run_id")
    run = None
    try:
        if earlier:
            try:
                run = tracking.resume_run(uri, earlier, key)
            except Exception as exc:  # e.g. RESOURCE_DOES_NOT_EXIST: a new store
                logger.warning("the sweep's earlier MLflow run is gone (%s)", one_line(exc))
        if run is None:
            params = {k: json.dumps(getattr(sweep, k)) for k in ("methods", "lr", "seeds")}
            run = tracking.open_run(
                uri,
                sweep.mlflow.experiment,
                f"sweep {sweep.label}",
                kind="sweep",
                parent=parent,
                params={**params, **base},
                tags={"note": str(sweep.note or ""), "sweep": sweep.label},
                description=sweep.note or None,
                key=key,
            )
    except Exception as exc:
        raise ConfigError(
            f"mlflow.tracking_uri: cannot open the MLflow store {config.redact(uri)}: {exc}"
        ) from None
    if run.id:  # None while its creation waits for MLflow (unreachable)
        storage.write_json(folder, _RUN_ID, {"run_id": run.id})
    run.log_text("config.yaml", yaml.safe_dump(sweep.model_dump(mode="json"), sort_keys=False))
    logger.info("sweep %s: MLflow run %s in %s", sweep.label, run.id, config.redact(uri))
    return run


def _trial_runs(run: tracking.Run) -> dict[str, str]:
    """Trial label -> its MLflow run id (none while MLflow cannot say)."""
    try:
        return trial_runs(run.tracking_uri, run.id)
    except Exception as exc:  # the store is away: the sweep's results stand without it
        logger.warning("MLflow: the sweep's trial runs are unknown for now (%s)", one_line(exc))
        return {}


def _opened(opening: Future) -> tracking.Run | None:
    """The sweep's run once open; None when it could not open (the cause is raised elsewhere)."""
    return None if opening.exception() else opening.result()


def run_sweep(sweep: SweepConfig, parent: str | None = None) -> SweepResult:
    """The sweep under ``parent``: both stages' trials, each method's lr, summary and sweep.json."""
    require_ray("a sweep")
    check_tables(sweep)
    check_rerun(sweep)
    if not storage.is_remote(sweep.output):
        os.makedirs(sweep.output, exist_ok=True)
    check_shared_output(sweep.output, sweep.storage.shared_filesystem)
    storage.write_json(storage.uri_join(sweep.output, "tune"), _SETTINGS, _settings(sweep))
    base = _base_params(sweep)
    # A new SQLite store takes a second or two: the sweep's run opens while Tune starts the
    # trials. Its key is the same in a rerun, where Tune's pickled callback finds the run by it.
    key = f"sweep {storage.uri_join(sweep.output, 'tune')}"
    with ThreadPoolExecutor(1) as pool, contextlib.redirect_stdout(sys.stderr):
        opening = pool.submit(_sweep_run, sweep, base, parent, key)
        MlflowTrialLogger.opening[key] = opening
        sweep_run = tracking.Run(None, sweep.mlflow.tracking_uri, key)  # its id once it opened
        callback = MlflowTrialLogger(sweep, sweep_run, base)
        with tracking.ended(functools.partial(_opened, opening)):
            try:
                done, failed = run_trials(sweep, callback)
                record = _conclude(sweep, opening.result(), base, done, failed)
            except Unfinished as exc:  # not a failure: the rerun reopens the run and goes on
                opening.result().end("KILLED", one_line(exc))
                raise
            except Exception:
                opening.result()  # a store that cannot open: the cause to report
                raise
    record_uri = storage.uri_join(sweep.output, SWEEP_RECORD)
    storage.write_text(record_uri, json.dumps(record.model_dump(), indent=2))
    ids = list(_trial_runs(opening.result()).values())
    uri = sweep.mlflow.tracking_uri
    return SweepResult(**{**dict(record), "tracking_uri": uri, "child_run_ids": ids})


def _conclude(
    sweep: SweepConfig,
    run: tracking.Run,
    base: dict[str, Any],
    done: list[TrialOutcome],
    failed: list[FailedTrial],
) -> SweepRecord:
    """The sweep's ending: each method's lr, the seed runs (a method's grid trial at its lr is its
    first seed), the mean ± std over them and the failures, in its MLflow run and its record."""
    grid = [t for t in done if t.stage == "grid"]
    chosen = selection(sweep, grid)
    if not chosen or not done:
        raise NoResults(f"sweep {sweep.label}: every trial failed; first: {failed[0].reason}")
    for method in sorted(set(sweep.methods) - set(chosen)):
        logger.warning("sweep %s: %s failed at every lr; left out of stage 2", sweep.label, method)
    run.log_params({f"best_lr/{m}": pick.lr for m, pick in chosen.items()})
    first_seeds = [t for t in grid if t.method in chosen and t.lr == chosen[t.method].lr]
    ids = _trial_runs(run)
    for label in (t.label("grid") for t in first_seeds):
        if label in ids:
            tracking.Run(ids[label], run.tracking_uri).set_tags({"seed_stage": "true"})
    repeats = first_seeds + [t for t in done if t.stage == "seeds"]
    test = [(t, glossary.retrieval_metric_names(t.outcome.get("test", {}))) for t in repeats]
    summary = seed_tables.seed_summary([{"method": t.method, "seed": t.seed, **m} for t, m in test])
    title = f"{base['dataset']} ({base['embedding_model']}), mean ± std over seeds"
    markdown = seed_tables.summary_markdown(summary, title=title) + failures_markdown(failed)
    storage.write_text(storage.uri_join(sweep.output, "summary.md"), markdown)
    run.set_tags({"failed_trials": str(len(failed))})
    run.log_text("summary.md", markdown)
    run.log_text("summary.csv", seed_tables.summary_csv(summary))
    run.log_json("selection.json", {m: pick.model_dump() for m, pick in chosen.items()})
    run.log_json("failures.json", [f.model_dump() for f in failed])
    stats = {
        f"{method}/{col}_{stat}": cell[stat]
        for method, cells in summary.items()
        for col, cell in cells.items()
        if isinstance(cell, dict)
        for stat in ("mean", "std")
    }
    run.log_metrics({"failed_trials": len(failed), **stats})
    return SweepRecord(
        parent_run_id=run.id,
        experiment=sweep.mlflow.experiment,
        tracking_uri=config.redact(sweep.mlflow.tracking_uri),
        selection=chosen,
        summary=summary,
        failed=failed,
        adapters=_export_adapters(sweep, repeats),
        markdown=markdown,
        trials=grid + [t for t in done if t.stage == "seeds"],
    )


def _export_adapters(sweep: SweepConfig, seed_runs: list[TrialOutcome]) -> dict[str, Any]:
    """Seed-stage adapters copied to ``<output>/adapters/<method>/seed<k>``; method/seed -> URI."""
    out: dict[str, dict[str, str]] = {}
    for trial in seed_runs:
        uri = storage.uri_join(sweep.output, ADAPTERS_DIR, trial.method, f"seed{trial.seed}")
        with trial.adapter.adapter_folder() as model, tempfile.TemporaryDirectory() as tmp:
            if model is not None and os.path.isdir(model):  # the adapter alone
                adapter = copy_adapter(model, os.path.join(tmp, "adapter"))
                seeds = out.setdefault(trial.method, {})
                seeds[str(trial.seed)] = storage.upload_dir(adapter, uri)
    return out
