"""A sweep's trials in MLflow: :class:`MlflowTrialLogger` (a Tune callback on the driver), and
what a finished trial leaves there (:func:`log_outcome`)."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from ray import tune
from ray.tune.result import AUTO_RESULT_KEYS

from asymvlm import results, storage, tracking
from asymvlm.checkpoints import MEMBER_FOLDER
from pipelines.schema import SweepConfig
from pipelines.tuning.trials import SELECTION_METRIC, failure_reason

__all__ = ["MlflowTrialLogger", "adapter_directory", "log_outcome", "member_dir", "trial_label"]

logger = logging.getLogger("pipelines.sweep")

_NOT_METRICS = frozenset(AUTO_RESULT_KEYS) | {"checkpoint_path", "epoch", "trial_id", "done"}
_EVERY_EPOCH = "lr"  # a metric of every epoch's row: its last step is the last epoch logged


def trial_label(stage: str, trial: dict[str, Any]) -> str:
    """A trial's ``trial`` tag in MLflow: ``grid-asymvlm-vmf-lr0.002-seed0``."""
    return f"{stage}-{trial['method']}-lr{float(trial['lr'])!r}-seed{int(trial['seed'])}"


def member_dir(k: int, size: int) -> str:
    """The folder of member ``k`` in its trial's checkpoint (a pack's holds one per member)."""
    return MEMBER_FOLDER.format(k=k) if size > 1 else ""


class MlflowTrialLogger(tune.Callback):
    """Every member of a trial is a run nested under the sweep's ``parent``, reopened when an
    earlier attempt of the sweep left it: each epoch's metrics once (step = epoch), its outcome
    (:func:`log_outcome`), and FINISHED, or FAILED with the reason."""

    def __init__(self, sweep: SweepConfig, parent: tracking.Run, base_params: dict[str, Any]):
        self.sweep, self.parent, self.base_params = sweep, parent, base_params
        self.setup()

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles its callbacks
        return {k: self.__dict__[k] for k in ("sweep", "parent", "base_params")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.setup()

    def setup(self, **info: Any) -> None:
        """The runs an earlier attempt left (trial label -> run id)."""
        self.runs: dict[str, tracking.Run] = {}
        self.logged: dict[str, int] = {}  # run key -> the last epoch in its run
        self.started: dict[str, float] = {}
        children = (
            tracking.child_runs(self.uri, self.parent.id, status="") if self.parent.id else []
        )
        self.earlier = {
            c.data.tags["trial"]: c.info.run_id for c in children if "trial" in c.data.tags
        }

    @property
    def uri(self) -> str:
        return self.sweep.mlflow.tracking_uri

    def _members(self, trial) -> list[tuple[str, dict[str, Any]]]:
        """(run key, member) of every run the trial makes."""
        members = trial.config["members"]
        return [(f"{trial.trial_id}#{k}", t) for k, t in enumerate(members)]

    def _run(self, key: str, stage: str, trial: dict[str, Any]) -> tracking.Run:
        if key in self.runs:
            return self.runs[key]
        label = trial_label(stage, trial)
        if label in self.earlier:
            run = tracking.resume_run(self.uri, self.earlier[label])
            self.logged[key] = tracking.last_step(self.uri, self.earlier[label], _EVERY_EPOCH)
        else:
            method, lr, seed = trial["method"], trial["lr"], trial["seed"]
            run = tracking.open_run(
                self.uri,
                self.sweep.mlflow.experiment,
                f"{method} lr={lr:g} seed={seed}",
                kind="trial",
                parent=self.parent,
                params={
                    **self.base_params,
                    **trial,
                    "stage": stage,
                    "optimizer": str(self.sweep.train_config(method).optimizer),
                },
                tags={
                    "stage": stage,
                    "method": method,
                    "trial": label,
                    **({"seed_stage": "true"} if stage == "seeds" else {}),
                },
                description=f"{stage} trial: {method} at lr {lr:g}, seed {seed}",
                start_time=self.started.get(key),
            )
        self.runs[key] = run
        return run

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        for key, member in self._members(trial):
            self.started.setdefault(key, time.time())
            self._run(key, trial.config["stage"], member)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        members, stage = self._members(trial), trial.config["stage"]
        if "outcomes" in result:
            for k, ((key, member), row) in enumerate(zip(members, result["outcomes"], strict=True)):
                if "outcome" in row:
                    where = member_dir(k, len(members))
                    log_outcome(self._run(key, stage, member), row, trial.checkpoint, where)
            return
        if "epoch" not in result:
            return
        key, member = members[int(result.get("member", 0))]
        step = int(result["epoch"])
        if step > self.logged.get(key, 0):  # once each: a retry reports some epochs again
            metrics = {k: v for k, v in result.items() if k not in _NOT_METRICS | {"member"}}
            self._run(key, stage, member).log_metrics(metrics, step=step)
            self.logged[key] = step

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        members = self._members(trial)
        outcomes = (trial.last_result or {}).get("outcomes") or [{}] * len(members)
        for (key, member), row in zip(members, outcomes, strict=True):
            reason = row.get("failed", "" if "outcome" in row else "ended without a result")
            self._end(key, trial.config["stage"], member, reason)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        reason = failure_reason(_error(trial))
        for key, member in self._members(trial):
            self._end(key, trial.config["stage"], member, reason)

    def _end(self, key: str, stage: str, trial: dict[str, Any], reason: str) -> None:
        run = self._run(key, stage, trial)
        shown = f"{trial['method']} lr={trial['lr']:g} seed={trial['seed']}"
        if reason:
            run.end("FAILED", reason)
            logger.warning("trial %s FAILED: %s", shown, reason)
            return
        run.end("FINISHED")
        seconds = time.time() - self.started.get(key, time.time())
        logger.info("trial %s FINISHED in %.0f s", shown, seconds)


def _error(trial) -> BaseException | str | None:
    """The error Tune just wrote beside the trial (on the driver, before its upload)."""
    import ray.cloudpickle

    if trial.pickled_error_file and os.path.exists(trial.pickled_error_file):
        with open(trial.pickled_error_file, "rb") as fh:
            return ray.cloudpickle.load(fh)
    if trial.error_file and os.path.exists(trial.error_file):
        with open(trial.error_file) as fh:
            return fh.read()
    return None


def log_outcome(run: tracking.Run, row: dict[str, Any], checkpoint=None, where: str = "") -> None:
    """A finished member's final metrics, binned Recall@1 curves (JSON + PNG), every number of
    its evaluation (results.json) and its adapter."""
    from asymvlm.plots import plot_binned_recall
    from asymvlm.scoring.models import log_adapter_models

    out = row["outcome"]
    run.log_metrics(
        {
            **results.retrieval_metric_names(out.get("test", {})),
            **results.retrieval_metric_names(out.get("val", {}), prefix="val_"),
            SELECTION_METRIC: row[SELECTION_METRIC],
        }
    )
    splits = [split for split in ("val", "test") if split in out]
    curves = {s: {d: out[s][d].get("binned_recall@1") for d in results.DIRECTIONS} for s in splits}
    run.log_json("binned_recall.json", curves)
    run.log_json("results.json", {split: out[split] for split in splits})
    if shown := out.get("test") or out.get("val"):
        with tempfile.TemporaryDirectory() as tmp:
            title = f"{row['method']} lr={row['lr']:g} seed={row['seed']}"
            png = os.path.join(tmp, "binned_recall.png")
            run.log_artifact(plot_binned_recall({row["method"]: shown}, png, title=title))
    with adapter_directory(out, checkpoint, where) as model:
        if model is not None:
            log_adapter_models(run, model)


@contextlib.contextmanager
def adapter_directory(
    out: dict[str, Any], checkpoint=None, where: str = ""
) -> Iterator[str | None]:
    """A local folder holding a finished member's adapter for the block: its Ray Train run's
    checkpoint, else ``checkpoint`` (its folder ``where`` in it); None without one."""
    if out.get("checkpoint"):  # (path, filesystem) as Ray Train wrote it
        checkpoint = tune.Checkpoint(*storage.ray_storage(out["checkpoint"]))
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as directory:
        yield os.path.join(directory, where) if where else directory
