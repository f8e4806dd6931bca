"""A sweep's trials in MLflow: :class:`MlflowTrialLogger` (a Tune callback), :func:`log_outcome`."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from ray import tune
from ray.tune.result import AUTO_RESULT_KEYS

from asymvlm import tracking
from asymvlm.checkpoints import MEMBER_FOLDER
from asymvlm.metrics import glossary
from asymvlm_ray.schema import SweepConfig
from asymvlm_ray.tuning.trials import SELECTION_METRIC, failure_reason

logger = logging.getLogger(__name__)

_NOT_METRICS = frozenset(AUTO_RESULT_KEYS) | {"checkpoint_path", "epoch", "trial_id", "done"}
EPOCHS_EVERY_S = 1.0  # a trial's epoch metrics go to MLflow at most this often (then together)


def trial_label(stage: str, trial: dict[str, Any]) -> str:
    """A trial's ``trial`` tag in MLflow: ``grid-asymvlm-vmf-lr0.002-seed0``."""
    return f"{stage}-{trial['method']}-lr{float(trial['lr'])!r}-seed{int(trial['seed'])}"


def shown(trial: dict[str, Any]) -> str:
    """``asymvlm-vmf lr=0.002 seed=0``."""
    return f"{trial['method']} lr={trial['lr']:g} seed={trial['seed']}"


class MlflowTrialLogger(tune.Callback):
    """Every member of a trial is a run under the sweep's ``parent`` (an earlier attempt's,
    reopened): each epoch once (step = epoch, at the time it was reported), its outcome, FINISHED
    or FAILED with the reason; Tune's first event waits for the sweep's run still ``opening`` (by
    its key) as Tune starts."""

    opening: ClassVar[weakref.WeakValueDictionary[str, Future]] = weakref.WeakValueDictionary()

    def __init__(self, sweep: SweepConfig, parent: tracking.Run, base_params: dict[str, Any]):
        self.sweep, self.parent, self.base_params = sweep, parent, base_params

    def setup(self, **info: Any) -> None:
        """Called by Tune as each run of the experiment starts."""
        self.runs: dict[str, tracking.Run] = {}  # run key (trial id#member) -> its run
        self.logged: dict[str, int] = {}  # run key -> the last epoch in its run
        self.started: dict[str, float] = {}
        self.earlier: dict[str, str] | None = None  # trial label -> an earlier attempt's run
        # A trial waits at each report until Tune's loop takes it: the writes go on one thread,
        # in order, and the loop on; a trial's epochs wait to go out together (one request a
        # second, not one an epoch: each costs the driver's CPU, which the trials share), and
        # at the latest when Tune saves its state (get_state).
        self.writes, self.written = ThreadPoolExecutor(1, "mlflow-trials"), []
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
        """Called by Tune as it saves the experiment's state (which a restored sweep goes on
        from, its trials from their checkpoints): MLflow holds what that state holds first."""
        self._drain()

    def on_experiment_end(self, trials, **info) -> None:
        self._drain()
        self.writes.shutdown()

    def _members(self, trial) -> list[tuple[str, dict[str, Any]]]:
        return [(f"{trial.trial_id}#{k}", t) for k, t in enumerate(trial.config["members"])]

    def _run(self, key: str, stage: str, trial: dict[str, Any]) -> tracking.Run:
        if key in self.runs:
            return self.runs[key]
        uri, label = self.sweep.mlflow.tracking_uri, trial_label(stage, trial)
        if self.earlier is None:  # the first event: the sweep's run, and the runs earlier left
            if (opening := self.opening.get(self.parent.key)) is not None:
                opening.result()
            children = tracking.child_runs(uri, self.parent.id, status="") if self.parent.id else []
            self.earlier = {
                c.data.tags["trial"]: c.info.run_id for c in children if "trial" in c.data.tags
            }
        if label in self.earlier:
            self.runs[key] = tracking.resume_run(uri, self.earlier[label])
            self.logged[key] = tracking.last_step(uri, self.earlier[label], "lr")  # every epoch's
            return self.runs[key]
        optimizer = str(self.sweep.train_config(trial["method"]).optimizer)
        self.runs[key] = tracking.open_run(
            uri,
            self.sweep.mlflow.experiment,
            shown(trial),
            kind="trial",
            parent=self.parent,
            params={**self.base_params, **trial, "stage": stage, "optimizer": optimizer},
            tags={"stage": stage, "method": trial["method"], "trial": label}
            | ({"seed_stage": "true"} if stage == "seeds" else {}),
            description=f"{stage} trial: {shown(trial)}",
            start_time=self.started.get(key),
        )
        return self.runs[key]

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        for key, member in self._members(trial):
            self.started.setdefault(key, time.time())
            self._run(key, trial.config["stage"], member)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        members, stage = self._members(trial), trial.config["stage"]
        outcomes = result.get("outcomes") or [{}] * len(members)
        for k, ((key, member), row) in enumerate(zip(members, outcomes, strict=True)):
            if "outcome" in row:
                run = self._run(key, stage, member)
                self._later(self._send_epochs, key)
                self._later(log_outcome, run, row, trial.checkpoint, k, len(members))
        if "epoch" in result:
            key, member = members[int(result.get("member", 0))]
            if (step := int(result["epoch"])) > self.logged.get(key, 0):  # a retry repeats some
                metrics = {k: v for k, v in result.items() if k not in _NOT_METRICS | {"member"}}
                self._run(key, stage, member)
                now = time.time()
                with self.lock:
                    self.epochs.setdefault(key, []).append((metrics, step, now))
                if now - self.sent.get(key, 0.0) >= EPOCHS_EVERY_S:
                    self.sent[key] = now
                    self._later(self._send_epochs, key)
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
        self._later(self._send_epochs, key)
        self._later(run.end, "FAILED" if reason else "FINISHED", reason or None)
        if reason:
            logger.warning("trial %s FAILED: %s", shown(trial), reason)
        else:
            seconds = time.time() - self.started.get(key, time.time())
            logger.info("trial %s FINISHED in %.0f s", shown(trial), seconds)


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


def log_outcome(run: tracking.Run, row: dict[str, Any], *checkpoint: Any) -> None:
    """A finished member's final metrics, binned Recall@1 curves (JSON + PNG), every number of
    its evaluation (results.json) and its adapter (``checkpoint``: :func:`adapter_directory`)."""
    from asymvlm.report.figures import plot_binned_recall
    from asymvlm.scoring.models import log_adapter_models

    out = row["outcome"]
    metrics = glossary.retrieval_metric_names(out.get("test", {}))
    metrics |= glossary.retrieval_metric_names(out.get("val", {}), prefix="val_")
    run.log_metrics({**metrics, SELECTION_METRIC: row[SELECTION_METRIC]})
    splits = [split for split in ("val", "test") if split in out]
    curves = {s: {d: out[s][d].get("binned_recall@1") for d in glossary.DIRECTIONS} for s in splits}
    run.log_json("binned_recall.json", curves)
    run.log_json("results.json", {split: out[split] for split in splits})
    if plotted := out.get("test") or out.get("val"):
        with tempfile.TemporaryDirectory() as tmp:
            png = os.path.join(tmp, "binned_recall.png")
            run.log_artifact(plot_binned_recall({row["method"]: plotted}, png, title=shown(row)))
    with adapter_directory(*checkpoint) as model:
        if model is not None:
            log_adapter_models(run, model)


@contextlib.contextmanager
def adapter_directory(checkpoint=None, k: int = 0, size: int = 1) -> Iterator[str | None]:
    """A local folder holding a finished member's adapter for the block: in Tune's
    ``checkpoint`` (member ``k``'s folder in a pack of ``size``); None without one."""
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as directory:
        yield os.path.join(directory, MEMBER_FOLDER.format(k=k)) if size > 1 else directory
