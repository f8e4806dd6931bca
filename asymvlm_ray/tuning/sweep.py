"""The paper's sweep (App. B.4) on Ray Tune, tracked in MLflow (:func:`run_sweep`): ``method x
lr`` at the first seed, the lr chosen on validation, the other seeds at it, in one ``Tuner``
(:class:`StagedSearch`); a sweep that stopped part-way is restored (``Tuner.restore``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import pickle
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import yaml
from ray import tune
from ray.tune.search import Searcher

from asymvlm import config, storage, tables, tracking
from asymvlm.checkpoints import copy_adapter
from asymvlm.checkpoints.folder import RESUME_MAY_DIFFER
from asymvlm.errors import AsymVLMError, ConfigError, Unfinished, one_line
from asymvlm.methods import METHODS
from asymvlm.metrics import glossary
from asymvlm.report import seed_tables
from asymvlm_ray.schema import SweepConfig, check_shared_output
from asymvlm_ray.session import require_ray
from asymvlm_ray.tuning.trial_log import MlflowTrialLogger, adapter_directory, shown, trial_label
from asymvlm_ray.tuning.trials import SELECTION_METRIC, failure_reason, sweep_trial

logger = logging.getLogger(__name__)

SWEEP_RECORD = "sweep.json"  # written last: a sweep with it is done
ADAPTERS_DIR = "adapters"  # <output>/adapters/<method>/seed<k>: the seed stage's adapters
KEEP_CHECKPOINTS = 2  # per trial, the latest
_RUN_ID = "mlflow_run.json"  # in <output>/tune: the sweep's MLflow run, reopened by a rerun
_SETTINGS = "settings.json"  # in <output>/tune: what the sweep there trains, for a rerun to match
#: What a rerun may change: where and how the trials run, not what they train.
RERUN_MAY_DIFFER = RESUME_MAY_DIFFER | set(
    "name note output mlflow storage ray max_failures node_wait_s cpus_per_worker gpus_per_worker "
    "fault_injection".split()
)


class NoResults(AsymVLMError):
    """Every trial of a sweep failed: nothing to select or summarise."""


def select_lr(grid: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method, the lr with the best finite validation score (ties: the smaller lr)."""
    best: dict[str, dict[str, Any]] = {}
    for r in sorted(grid, key=lambda r: (r["method"], r["lr"])):
        if not math.isfinite(score := float(r[SELECTION_METRIC])):
            continue
        pick = best.setdefault(r["method"], {"lr": r["lr"], "score": score, "scores_by_lr": {}})
        pick["scores_by_lr"][f"{r['lr']:g}"] = score
        if score > pick["score"]:
            pick.update(lr=r["lr"], score=score)
    return best


def failures_markdown(failed: list[dict[str, Any]]) -> str:
    """The failed trials under the summary table: how many, which, and why."""
    if not failed:
        return ""
    head = f"\n**{len(failed)} trial(s) failed** and are left out of the selection and the table"
    lines = [head + " above:\n", "| stage | method | lr | seed | reason |", "|---|---|---|---|---|"]
    for f in failed:
        reason = f["reason"].replace("|", "\\|")
        lines.append(f"| {f['stage']} | {f['method']} | {f['lr']:g} | {f['seed']} | {reason} |")
    return "\n".join(lines) + "\n"


def check_tables(sweep: SweepConfig) -> None:
    """Fail before any trial starts when the tables or splits the sweep needs are missing."""
    sweep.run_spec(sweep.methods[0], sweep.lr[0], sweep.seeds[0]).check_splits()
    if len(sweep.lr) > 1 and not sweep.val_split and not sweep.val_fraction:
        raise ConfigError(
            f"{len(sweep.lr)} learning rates but no validation data to choose among them: "
            "set val_split or val_fraction (the test split never takes part in the choice)"
        )


def _settings(sweep: SweepConfig) -> dict[str, Any]:
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


class NodeWait(tune.Callback):
    """:class:`~asymvlm.errors.Unfinished` once trials waited ``seconds`` for a node, none ran."""

    def __init__(self, seconds: float, label: str) -> None:
        self.seconds, self.label, self.since = seconds, label, None

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        statuses = {t.status for t in trials}
        if "RUNNING" in statuses or "PENDING" not in statuses:
            self.since = None
            return
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since < self.seconds:
            return
        waiting = [t for t in trials if t.status not in ("TERMINATED", "ERROR")]
        names = "; ".join(" + ".join(map(shown, t.config["members"])) for t in waiting)
        raise Unfinished(
            f"sweep {self.label}: no node could run its trials for {self.seconds:.0f} s "
            f"(node_wait_s); not finished: {names}. The finished trials are kept: run the same "
            "command again, with nodes to run on, to go on from their checkpoints"
        )


def _packs(sweep: SweepConfig, trials: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Up to ``sweep.pack`` consecutive trials of one method trained by SGD go as one trial."""
    out: list[list[dict[str, Any]]] = []
    for t in trials:
        same = out and out[-1][0]["method"] == t["method"] and len(out[-1]) < sweep.pack
        if same and METHODS[t["method"]].trainable:
            out[-1].append(t)
        else:
            out.append([t])
    return out


class StagedSearch(Searcher):
    """The grid's trials, then each method's other seeds at its chosen lr as soon as that
    method's grid trials have all ended: the two stages pipelined in one experiment."""

    def __init__(self, sweep: SweepConfig, grid: list[dict[str, Any]]) -> None:
        super().__init__()
        self.sweep = sweep
        self.selects_lr = bool(grid)  # several lrs: the grid's trials choose each method's
        self.live: dict[str, tuple[str, str]] = {}  # trial id -> (stage, method)
        self.queue = [("grid", p) for p in _packs(sweep, grid)]
        self.waiting = Counter(members[0]["method"] for _, members in self.queue)
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)  # grid rows per method
        if not self.selects_lr:  # one lr: every seed of every method at once
            for method in sweep.methods:
                self._release(method)

    def _release(self, method: str) -> None:
        """Queue ``method``'s seed trials at its chosen lr (at the only lr: every seed)."""
        if not self.selects_lr:
            lr, seeds = self.sweep.lr[0], self.sweep.seeds
        elif pick := select_lr(self.rows[method]).get(method):
            lr, seeds = pick["lr"], self.sweep.seeds[1:]
        else:  # it failed at every lr
            return
        trials = [{"method": method, "lr": lr, "seed": s} for s in seeds]
        self.queue += [("seeds", p) for p in _packs(self.sweep, trials)]

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        return True  # Tune runs the trials the cluster fits; the limit sets how many wait

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if not self.queue:
            return None if self.live else Searcher.FINISHED
        stage, members = self.queue.pop(0)
        self.live[trial_id] = (stage, members[0]["method"])
        return {"sweep": self.sweep, "stage": stage, "members": members}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error=False) -> None:
        stage, method = self.live.pop(trial_id)
        if stage == "grid":
            outcomes = (result or {}).get("outcomes") or []
            self.rows[method] += [r for r in outcomes if "outcome" in r]
            self.waiting[method] -= 1
            if not self.waiting[method]:
                self._release(method)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))


def _fit(sweep: SweepConfig, grid: list[dict[str, Any]], callback) -> tuple:
    """The sweep as one (restored) Tune experiment: (finished rows, failed rows with reasons)."""
    import ray

    space = [
        sweep.run_spec(m, lr, s) for m in sweep.methods for lr in sweep.lr for s in sweep.seeds
    ]
    specs = [sweep.pack, [spec.model_dump(mode="json") for spec in space]]
    digest = hashlib.sha1(json.dumps(specs, sort_keys=True).encode()).hexdigest()[:10]
    root, fs = storage.ray_storage(storage.uri_join(sweep.output, "tune", "trials"))
    gpu = sweep.gpus_per_worker if ray.cluster_resources().get("GPU", 0) > 0 else 0
    trainable = tune.with_resources(sweep_trial, {"cpu": sweep.cpus_per_worker, "gpu": gpu})
    path = f"{root}/sweep-{digest}"
    if tune.Tuner.can_restore(path, storage_filesystem=fs):
        logger.info("sweep %s goes on where it stopped (%s)", sweep.label, path)
        tuner = tune.Tuner.restore(path, trainable, storage_filesystem=fs)
    else:
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=StagedSearch(sweep, grid),
                num_samples=-1,
                max_concurrent_trials=len(space),  # every trial may wait for a slot
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=f"sweep-{digest}",
                storage_path=root,
                storage_filesystem=fs,
                callbacks=[callback, NodeWait(sweep.node_wait_s, sweep.label)],
                failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
                verbose=0,
            ),
        )
    result_grid, done, failed = tuner.fit(), [], []
    # A trial whose actor never started (its runtime_env did not install) has no result: its
    # config is in Tune's own record.
    configs = {}
    if any(r.config is None for r in result_grid):
        analysis = tune.ExperimentAnalysis(path, storage_filesystem=fs)
        configs = {trial.path: trial.config for trial in analysis.trials}
    for r in result_grid:
        config = r.config or configs[r.path]
        stage, members = config["stage"], config["members"]
        outcomes = (r.metrics or {}).get("outcomes") if r.error is None else None
        for k, (trial, row) in enumerate(
            zip(members, outcomes or [{}] * len(members), strict=True)
        ):
            if "outcome" in row:
                done.append({**row, "_checkpoint": (r.checkpoint, k, len(members))})
            else:
                reason = row.get("failed") or failure_reason(r.error)
                failed.append({"stage": stage, **trial, "reason": reason})
    return done, failed


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
    """The sweep's MLflow run (:class:`tracking.Run` ``key``): an earlier attempt's, RUNNING
    again, else a new one."""
    uri, folder = sweep.mlflow.tracking_uri, storage.uri_join(sweep.output, "tune")
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
        children = tracking.child_runs(run.tracking_uri, run.id, status="") if run.id else []
    except Exception as exc:  # the store is away: the sweep's results stand without it
        logger.warning("MLflow: the sweep's trial runs are unknown for now (%s)", one_line(exc))
        return {}
    return {c.data.tags["trial"]: c.info.run_id for c in children if "trial" in c.data.tags}


def run_sweep(sweep: SweepConfig, parent: str | None = None) -> dict[str, Any]:
    """Stage 1 -> lr chosen on validation -> stage 2 -> summary; its MLflow run under ``parent``."""
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
        callback = MlflowTrialLogger(
            sweep, tracking.Run(None, sweep.mlflow.tracking_uri, key), base
        )
        with tracking.ended(lambda: None if opening.exception() else opening.result()):
            try:
                record = _stages(sweep, opening, callback, base)
            except Unfinished as exc:  # not a failure: the rerun reopens the run and goes on
                opening.result().end("KILLED", one_line(exc))
                raise
            except Exception:
                opening.result()  # a store that cannot open: the cause to report
                raise
    storage.write_text(storage.uri_join(sweep.output, SWEEP_RECORD), json.dumps(record, indent=2))
    return {
        **record,
        "tracking_uri": sweep.mlflow.tracking_uri,
        "child_run_ids": list(_trial_runs(opening.result()).values()),
    }


def _stages(sweep: SweepConfig, opening: Future, callback, base: dict) -> dict[str, Any]:
    """The paper's two stages (the lr grid at the first seed, then the other seeds at each
    method's chosen lr) as one Tune experiment, then the sweep's run: the selection, the
    mean ± std over seeds, the failures."""
    first_seed = sweep.seeds[0]
    grid = [{"method": m, "lr": lr, "seed": first_seed} for m in sweep.methods for lr in sweep.lr]
    grid = grid if len(sweep.lr) > 1 else []  # one lr: nothing to select
    rows, failed = _fit(sweep, grid, callback)
    run: tracking.Run = opening.result()
    grid_rows = [r for r in rows if r["stage"] == "grid"]
    seed_rows = [r for r in rows if r["stage"] == "seeds"]
    if grid:
        picks = select_lr(grid_rows)
    else:
        picks = {m: {"lr": sweep.lr[0], "score": None, "scores_by_lr": {}} for m in sweep.methods}
    selection = {m: picks[m] for m in sweep.methods if m in picks}  # config order
    if not selection or not rows:
        raise NoResults(f"sweep {sweep.label}: every trial failed; first: {failed[0]['reason']}")
    for method in sorted(set(sweep.methods) - set(selection)):
        logger.warning("sweep %s: %s failed at every lr; left out of stage 2", sweep.label, method)
    run.log_params({f"best_lr/{m}": p["lr"] for m, p in selection.items()})
    # the grid trial at the chosen lr is its method's first seed
    first_seeds = [r for r in grid_rows if r["lr"] == selection.get(r["method"], {}).get("lr")]
    ids = _trial_runs(run)
    for label in (trial_label("grid", r) for r in first_seeds):
        if label in ids:
            tracking.existing_run(run.tracking_uri, ids[label]).set_tags({"seed_stage": "true"})
    repeats = first_seeds + seed_rows
    test = [(r, glossary.retrieval_metric_names(r["outcome"].get("test", {}))) for r in repeats]
    summary = seed_tables.seed_summary(
        [{"method": r["method"], "seed": r["seed"], **m} for r, m in test]
    )
    title = f"{base['dataset']} ({base['embedding_model']}), mean ± std over seeds"
    markdown = seed_tables.summary_markdown(summary, title=title) + failures_markdown(failed)
    storage.write_text(storage.uri_join(sweep.output, "summary.md"), markdown)
    run.set_tags({"failed_trials": str(len(failed))})
    run.log_text("summary.md", markdown)
    run.log_text("summary.csv", seed_tables.summary_csv(summary))
    run.log_json("selection.json", selection)
    run.log_json("failures.json", failed)
    stats = {
        f"{method}/{col}_{stat}": cell[stat]
        for method, cells in summary.items()
        for col, cell in cells.items()
        if isinstance(cell, dict)
        for stat in ("mean", "std")
    }
    run.log_metrics({"failed_trials": len(failed), **stats})
    return {
        "parent_run_id": run.id,
        "experiment": sweep.mlflow.experiment,
        "tracking_uri": config.redact(sweep.mlflow.tracking_uri),
        "selection": selection,
        "summary": summary,
        "failed": failed,
        "adapters": _export_adapters(sweep, repeats),
        "markdown": markdown,
        "trials": [
            {k: v for k, v in r.items() if k != "_checkpoint"} for r in grid_rows + seed_rows
        ],
    }


def _export_adapters(sweep: SweepConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed-stage adapters copied to ``<output>/adapters/<method>/seed<k>``; method/seed -> URI."""
    out: dict[str, dict[str, str]] = {}
    for row in rows:
        uri = storage.uri_join(sweep.output, ADAPTERS_DIR, row["method"], f"seed{row['seed']}")
        with adapter_directory(*row["_checkpoint"]) as model, tempfile.TemporaryDirectory() as tmp:
            if model is not None and os.path.isdir(model):  # the adapter alone
                adapter = copy_adapter(model, os.path.join(tmp, "adapter"))
                seeds = out.setdefault(row["method"], {})
                seeds[str(row["seed"])] = storage.upload_dir(adapter, uri)
    return out
