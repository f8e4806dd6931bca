"""A sweep's trials in MLflow: :class:`MlflowTrialLogger` (a Tune callback) and each finished
member's metrics and adapter (:func:`log_outcome`)."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from ray import tune
from ray.tune.result import AUTO_RESULT_KEYS

from asymvlm import tracking
from asymvlm.metrics import glossary
from asymvlm_ray.schema import SweepConfig
from asymvlm_ray.tuning.lr_selection import SELECTION_METRIC
from asymvlm_ray.tuning.records import (
    FailedTrial,
    MemberCheckpoint,
    Stage,
    SweepPoint,
    TrialConfig,
    TrialOutcome,
    TrialReport,
)
from asymvlm_ray.tuning.trials import failure_reason

logger = logging.getLogger(__name__)

_NOT_METRICS = frozenset(AUTO_RESULT_KEYS) | {"checkpoint_path", "epoch", "trial_id", "done"}
EPOCHS_EVERY_S = 1.0  # a trial's epoch metrics go to MLflow at most this often (then together)


def trial_runs(uri: str, sweep_run: str | None) -> dict[str, str]:
    """Trial label (:meth:`SweepPoint.label`) -> its MLflow run under the sweep's run."""
    children = tracking.child_runs(uri, sweep_run, status="") if sweep_run else []
    return {c.data.tags["trial"]: c.info.run_id for c in children if "trial" in c.data.tags}


class MlflowTrialLogger(tune.Callback):
    """Every member of a trial is a run under the sweep's ``parent`` (an earlier attempt's,
    reopened): each epoch once (step = epoch, when reported), its outcome, FINISHED or FAILED with
    the reason; Tune's first event waits for the sweep's run still ``opening`` (by its key)."""

    opening: ClassVar[weakref.WeakValueDictionary[str, Future]] = weakref.WeakValueDictionary()

    def __init__(self, sweep: SweepConfig, parent: tracking.Run, base_params: dict[str, Any]):
        self.sweep = sweep
        self.parent = parent
        self.base_params = base_params

    def setup(self, **info: Any) -> None:
        """Called by Tune as each run of the experiment starts."""
        self.runs: dict[str, tracking.Run] = {}  # run key (trial id#member) -> its run
        self.logged: dict[str, int] = {}  # run key -> the last epoch in its run
        self.started: dict[str, float] = {}
        self.earlier: dict[str, str] | None = None  # trial label -> an earlier attempt's run
        # The writes go on one thread, in order, while Tune's loop goes on; a trial's epochs go out
        # together at most once a second (each request costs the driver's CPU) and on get_state.
        self.writes = ThreadPoolExecutor(1, "mlflow-trials")
        self.written: list[Future] = []
        self.epochs: dict[str, list[tuple[dict[str, Any], int, float]]] = {}  # key -> waiting
        self.sent: dict[str, float] = {}  # key -> when its epochs last went out
        self.lock = threading.Lock()

    def _later(self, write: Callable[..., Any], *args: Any) -> None:
        self.written.append(self.writes.submit(write, *args))

    def _send_epochs(self, key: str) -> None:
        """Write ``key``'s waiting epochs now."""
        with self.lock:
            rows = self.epochs.pop(key, [])
        if rows:
            self.runs[key].log_steps(rows)

    def _drain(self) -> None:
        """Every write so far done, the waiting epochs with them."""
        for key in list(self.epochs):
            self._later(self._send_epochs, key)
        for write in self.written:
            write.result()
        self.written.clear()

    def get_state(self) -> None:
        """Called by Tune as it saves the experiment's state: MLflow holds what it holds first."""
        self._drain()

    def on_experiment_end(self, trials, **info) -> None:
        self._drain()
        self.writes.shutdown()

    def _members(self, trial) -> tuple[Stage, list[tuple[str, SweepPoint]]]:
        """A Tune trial's stage and members, each with its run's key (trial id#member)."""
        config = TrialConfig.model_validate(trial.config)
        return config.stage, [(f"{trial.trial_id}#{k}", p) for k, p in enumerate(config.members)]

    def _run(self, key: str, stage: Stage, point: SweepPoint) -> tracking.Run:
        """The MLflow run of a member: its own, an earlier attempt's (reopened), else new."""
        if key in self.runs:
            return self.runs[key]
        uri = self.sweep.mlflow.tracking_uri
        label = point.label(stage)
        if self.earlier is None:  # the first event: the sweep's run, and the runs earlier left
            opening = self.opening.get(self.parent.key)
            if opening is not None:
                opening.result()
            self.earlier = trial_runs(uri, self.parent.id)
        if label in self.earlier:
            self.runs[key] = tracking.resume_run(uri, self.earlier[label])
            self.logged[key] = tracking.last_step(uri, self.earlier[label], "lr")  # every epoch's
            return self.runs[key]
        optimizer = str(self.sweep.train_config(point.method).optimizer)
        params = {**self.base_params, **point.model_dump(), "stage": stage, "optimizer": optimizer}
        self.runs[key] = tracking.open_run(
            uri,
            self.sweep.mlflow.experiment,
            point.shown(),
            kind="trial",
            parent=self.parent,
            params=params,
            tags={"stage": stage, "method": point.method, "trial": label}
            | ({"seed_stage": "true"} if stage == "seeds" else {}),
            description=f"{stage} trial: {point.shown()}",
            start_time=self.started.get(key),
        )
        return self.runs[key]

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        stage, members = self._members(trial)
        for key, point in members:
            self.started.setdefault(key, time.time())
            self._run(key, stage, point)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        """An epoch's metrics (one member's, in a pack) or the trial's last report."""
        stage, members = self._members(trial)
        reported = TrialReport.of(result, len(members))
        for k, ((key, point), got) in enumerate(zip(members, reported, strict=True)):
            if isinstance(got, TrialOutcome):
                run = self._run(key, stage, point)
                self._later(self._send_epochs, key)
                where = MemberCheckpoint(trial.checkpoint, k, len(members))
                self._later(log_outcome, run, got.model_copy(update={"adapter": where}))
        if "epoch" not in result:
            return
        key, point = members[int(result.get("member", 0))]
        step = int(result["epoch"])
        if step <= self.logged.get(key, 0):  # a retry repeats the epochs after its checkpoint
            return
        metrics = {k: v for k, v in result.items() if k not in _NOT_METRICS | {"member"}}
        self._run(key, stage, point)
        now = time.time()
        with self.lock:
            self.epochs.setdefault(key, []).append((metrics, step, now))
        if now - self.sent.get(key, 0.0) >= EPOCHS_EVERY_S:
            self.sent[key] = now
            self._later(self._send_epochs, key)
        self.logged[key] = step

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        """Each member's run FINISHED, or FAILED when it diverged in a pack or never reported."""
        stage, members = self._members(trial)
        reported = TrialReport.of(trial.last_result, len(members))
        for (key, point), got in zip(members, reported, strict=True):
            reason = got.reason if isinstance(got, FailedTrial) else ""
            self._end(key, stage, point, "ended without a result" if got is None else reason)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        """Each member's run FAILED with the trial's reason."""
        reason = failure_reason(_error(trial))
        stage, members = self._members(trial)
        for key, point in members:
            self._end(key, stage, point, reason)

    def _end(self, key: str, stage: Stage, point: SweepPoint, reason: str) -> None:
        """A member's run FINISHED, or FAILED with ``reason``."""
        run = self._run(key, stage, point)
        self._later(self._send_epochs, key)
        self._later(run.end, "FAILED" if reason else "FINISHED", reason or None)
        if reason:
            logger.warning("trial %s FAILED: %s", point.shown(), reason)
        else:
            seconds = time.time() - self.started.get(key, time.time())
            logger.info("trial %s FINISHED in %.0f s", point.shown(), seconds)


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


def log_outcome(run: tracking.Run, trial: TrialOutcome) -> None:
    """A finished member's final metrics, binned Recall@1 curves (JSON + PNG), every number of
    its evaluation (results.json) and its adapter (as an MLflow model)."""
    from asymvlm.report.figures import plot_binned_recall
    from asymvlm.scoring.models import log_adapter_models

    out = trial.outcome
    metrics = glossary.retrieval_metric_names(out.get("test", {}))
    metrics |= glossary.retrieval_metric_names(out.get("val", {}), prefix="val_")
    run.log_metrics({**metrics, SELECTION_METRIC: trial.val_mean_recall_at_1})
    splits = [split for split in ("val", "test") if split in out]
    curves = {s: {d: out[s][d].get("binned_recall@1") for d in glossary.DIRECTIONS} for s in splits}
    run.log_json("binned_recall.json", curves)
    run.log_json("results.json", {split: out[split] for split in splits})
    plotted = out.get("test") or out.get("val")
    if plotted:
        with tempfile.TemporaryDirectory() as tmp:
            png = os.path.join(tmp, "binned_recall.png")
            run.log_artifact(plot_binned_recall({trial.method: plotted}, png, title=trial.shown()))
    with trial.adapter.adapter_folder() as model:
        if model is not None:
            log_adapter_models(run, model)
