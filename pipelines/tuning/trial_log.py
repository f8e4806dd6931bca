"""A sweep's trials in MLflow, written by the driver: :class:`MlflowTrialLogger`."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from ray import tune
from ray.tune.result import AUTO_RESULT_KEYS

from asymvlm import storage, tracking
from asymvlm.checkpoints import MEMBER_FOLDER, copy_adapter
from pipelines.schema import SweepConfig
from pipelines.tuning.journal import TrialRecord, trial_label
from pipelines.tuning.outcomes import adapter_directory, log_outcome
from pipelines.tuning.search import describe_trial, member_keys
from pipelines.tuning.trials import SELECTION_METRIC, failure_reason

logger = logging.getLogger("pipelines.sweep")  # its lines are the sweep's

_NOT_METRICS = frozenset(AUTO_RESULT_KEYS) | {"checkpoint_path", "epoch", "trial_id", "done"}
#: A metric of every epoch's row: the last step it has is the last epoch a run logged.
_EVERY_EPOCH = "lr"


def _trial_label(config: dict[str, Any]) -> tuple[str, float, int, str]:
    trial = config["trial"]
    return trial["method"], trial["lr"], trial["seed"], config["stage"]


class MlflowTrialLogger(tune.Callback):
    """Tune callback: every trial (every member of a pack) is a nested MLflow run from its
    start, with each epoch's metrics once (step = epoch; a retried trial or a reopened run
    reports some again), its final metrics and artifacts, and FINISHED or FAILED with the
    reason. The writes run in order on one writer thread, so Tune's loop never waits for the
    store; :meth:`flush` waits for them (and raises the first that failed)."""

    def __init__(
        self,
        sweep: SweepConfig,
        parent: tracking.Run | Callable[[], tracking.Run],
        base_params: dict[str, Any],
        previous_runs: dict[str, tuple[str, str]] | None = None,
    ):
        """``parent``: the sweep's run, or a function that opens it on the writer thread (which
        may fill ``previous_runs``: trial label -> its run in an earlier run of the sweep, and
        that run's status)."""
        self.sweep, self.base_params = sweep, base_params
        self.runs: dict[str, tracking.Run] = {}
        #: Run key -> when its trial started (seconds).
        self.started_at: dict[str, float] = {}
        #: Trial id -> the trial's final row (selection score and outcome), as it came.
        self.final: dict[str, dict[str, Any]] = {}
        #: Run key -> (the trial's last Tune checkpoint, the member's folder in it).
        self.checkpoints: dict[str, tuple[Any, str]] = {}
        self.previous_runs: dict[str, tuple[str, str]] = (
            {} if previous_runs is None else previous_runs
        )
        #: Run key -> the last epoch written to its run.
        self.logged: dict[str, int] = {}
        self._bar = None  # the progress bar of the stage running, if any
        self._start_writer()
        self._parent = parent if isinstance(parent, tracking.Run) else self._writer.submit(parent)

    @property
    def parent(self) -> tracking.Run:
        """The sweep's run (waits until it is open; raises what opening it raised)."""
        if not isinstance(self._parent, tracking.Run):
            self._parent = self._parent.result()
        return self._parent

    def opened_parent(self) -> tracking.Run | None:
        """The sweep's run, None if it could not be opened."""
        try:
            return self.parent
        except Exception:
            return None

    def _check_parent(self) -> None:
        """Raise (into Tune: the sweep stops) as soon as the sweep's run failed to open."""
        pending = self._parent
        if not isinstance(pending, tracking.Run) and pending.done():
            self.parent  # noqa: B018 -- raises the error of opening it

    def __getstate__(self) -> dict[str, Any]:
        """Tune saves its callbacks: everything but the thread (and a run still being opened)."""
        state = dict(self.__dict__)
        if not isinstance(self._parent, tracking.Run):
            state["_parent"] = None
        for key in ("_writer", "_bar", "_errors", "_lock", "_epochs"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bar = None
        self._start_writer()

    def _start_writer(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-writer")
        self._lock = threading.Lock()
        self._epochs: dict[str, list[tuple[int, dict[str, Any], float]]] = {}
        self._errors: list[BaseException] = []
        self._closed = False

    # -- the writer thread -----------------------------------------------------------------
    def submit(self, write: Callable[[], Any]) -> None:
        """Run ``write`` on the writer thread, after every write submitted before it."""

        def call() -> None:
            try:
                write()
            except Exception as exc:  # kept for flush(): the sweep fails after its trials
                self._errors.append(exc)

        self._writer.submit(call)

    def flush(self) -> None:
        """Wait for every write submitted so far; raise the first one that failed."""
        if not self._closed:
            self._writer.submit(lambda: None).result()
        if self._errors:
            raise self._errors.pop(0)

    def close(self) -> None:
        """Finish the writes (failures were raised by :meth:`flush` already) and stop."""
        if not self._closed:
            self._writer.shutdown(wait=True)
            self._closed = True

    @property
    def child_ids(self) -> dict[str, str]:
        """Trial id -> MLflow run id (after every write so far)."""
        self.flush()
        return {trial_id: run.id for trial_id, run in self.runs.items()}

    def _run(self, trial_id: str, config: dict[str, Any]) -> tracking.Run:
        """The trial's MLflow run, opened at its first write: its earlier run reopened, or a new
        one."""
        if trial_id not in self.runs:
            method, lr, seed, stage = _trial_label(config)
            label = trial_label(stage, config["trial"])
            uri = self.sweep.mlflow.tracking_uri
            if label in self.previous_runs:
                run_id, _ = self.previous_runs[label]
                self.runs[trial_id] = tracking.resume_run(uri, run_id)
                self.logged[trial_id] = tracking.last_step(uri, run_id, _EVERY_EPOCH)
                return self.runs[trial_id]
            self.runs[trial_id] = tracking.open_run(
                self.sweep.mlflow.tracking_uri,
                self.sweep.mlflow.experiment,
                f"{method} lr={lr:g} seed={seed}",
                kind="trial",
                parent=self.parent,
                params={
                    **self.base_params,
                    "method": method,
                    "lr": lr,
                    "seed": seed,
                    "stage": stage,
                    "optimizer": self._optimizer(method),
                },
                tags={
                    "stage": stage,
                    "method": method,
                    "trial": label,
                    **({"seed_stage": "true"} if stage == "seeds" else {}),
                },
                description=f"{'lr grid' if stage == 'grid' else 'seed'} trial: {method} at "
                f"lr {lr:g}, seed {seed}",
                start_time=self.started_at.get(trial_id),  # the trial's, not the writer's
            )
        return self.runs[trial_id]

    def _optimizer(self, method: str) -> str:
        """The optimiser the trial of ``method`` uses (the sweep's, or its protocol default)."""
        return str(self.sweep.train_config(method).optimizer)

    @contextlib.contextmanager
    def progress(self, label: str, total: int):
        """A progress bar of finished trials on a terminal (none in logs and pipes)."""
        from tqdm import tqdm

        with tqdm(
            total=total, desc=label, unit="trial", leave=False, disable=not sys.stderr.isatty()
        ) as bar:
            self._bar = bar
            try:
                yield bar
            finally:
                self.flush()
                self._bar = None

    def _advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def join_seed_stage(self, keys: list[str]) -> None:
        """Tag the runs ``keys`` (stage-1 trials at the chosen lr) as stage 2's."""

        def tag() -> None:
            for key in keys:
                run = self.runs.get(key)
                if run is not None:
                    run.set_tags({"seed_stage": "true"})

        self.submit(tag)

    def export_adapter(self, key: str, uri: str) -> str | None:
        """Copy the adapter of finished run ``key`` to ``uri`` (a checkpoint folder); the URI,
        or None for a run without one."""
        checkpoint, member_dir = self.checkpoints.get(key, (None, ""))
        with (
            adapter_directory(self.final[key]["outcome"], checkpoint, member_dir) as model,
            tempfile.TemporaryDirectory() as tmp,
        ):
            if model is None or not os.path.isdir(model):
                return None
            # the adapter alone: no optimiser state, no history
            return storage.upload_dir(copy_adapter(model, os.path.join(tmp, "adapter")), uri)

    def read_back(self, key: str, record: TrialRecord) -> None:
        """A trial an earlier run of the sweep finished (its journal ``record``), taken as it
        is; its MLflow run gets its results and FINISHED now if the earlier driver stopped
        before writing them."""
        final = record.final
        assert final is not None
        self.final[key] = final
        checkpoint = None
        if record.checkpoint:
            checkpoint = tune.Checkpoint(*storage.ray_storage(record.checkpoint))
        self.checkpoints[key] = (checkpoint, record.member_dir)

        def adopt() -> None:
            run_id, status = self.previous_runs.get(record.label, (None, None))
            if run_id and status == "FINISHED":
                self.runs[key] = tracking.existing_run(self.sweep.mlflow.tracking_uri, run_id)
                return
            run = self._run(key, {"stage": record.stage, "trial": record.trial})
            log_outcome(run, final, checkpoint, record.member_dir)
            run.end("FINISHED")

        self.submit(adopt)

    def end_open_runs(self, status: str, reason: str) -> None:
        """End every trial's run still open (a sweep that stops before its trials end)."""

        def end() -> None:
            for run in self.runs.values():
                run.end(status, reason)

        self.submit(end)

    # -- Tune's events (driver thread: read the trial now, write later) ---------------------
    @staticmethod
    def _members(trial_id: str, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """(run key, config) of every run a trial makes: itself, or each member of a pack."""
        pack = config.get("pack")
        if not pack:
            return [(trial_id, config)]
        return [
            (key, {"stage": config["stage"], "trial": t})
            for key, t in zip(member_keys(trial_id, len(pack)), pack, strict=True)
        ]

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._check_parent()
        if trial.config.get("resume"):
            logger.info(
                "trial %s: goes on from the checkpoint an earlier run left (%s)",
                describe_trial(trial.config),
                trial.config["resume"],
            )
        for key, member in self._members(trial.trial_id, trial.config):
            self.started_at.setdefault(key, time.time())
            self.submit(lambda key=key, member=member: self._run(key, member))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self._check_parent()
        members = self._members(trial.trial_id, trial.config)
        result = dict(result)
        if "pack_outcomes" in result:  # a pack's end: every member's final row
            checkpoint = getattr(trial, "checkpoint", None)
            for k, ((key, config), row) in enumerate(
                zip(members, result["pack_outcomes"], strict=True)
            ):
                if "outcome" in row:
                    self.final[key] = row
                    self.checkpoints[key] = (checkpoint, MEMBER_FOLDER.format(k=k))
                    self.submit(
                        lambda key=key, config=config, row=row, k=k: log_outcome(
                            self._run(key, config), row, checkpoint, MEMBER_FOLDER.format(k=k)
                        )
                    )
            return
        key, config = members[int(result.get("member", 0))]
        if "outcome" in result:
            self.final[key] = result
            checkpoint = getattr(trial, "checkpoint", None)
            self.checkpoints[key] = (checkpoint, "")
            self.submit(lambda: log_outcome(self._run(key, config), result, checkpoint))
        elif "epoch" in result:
            metrics = {k: v for k, v in result.items() if k not in _NOT_METRICS | {"member"}}
            self._log_epoch(key, config, int(result["epoch"]), metrics)

    def _log_epoch(self, key: str, config: dict[str, Any], step: int, metrics: dict) -> None:
        """Queue an epoch's metrics; one write takes every row of the run queued by then."""
        with self._lock:
            queued = self._epochs.setdefault(key, [])
            queued.append((step, metrics, time.time()))
            if len(queued) > 1:
                return  # a write of this run's queue is on its way

        def write() -> None:
            with self._lock:
                rows = self._epochs.pop(key, [])
            run = self._run(key, config)
            rows = [row for row in rows if row[0] > self.logged.get(key, 0)]  # once each
            if rows:
                run.log_metric_rows(rows)
                self.logged[key] = max(row[0] for row in rows)

        self.submit(write)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        last = dict(trial.last_result or {})
        members = self._members(trial.trial_id, trial.config)
        outcomes = last.get("pack_outcomes") or [last] * len(members)
        for (key, member), result in zip(members, outcomes, strict=False):
            seconds = time.time() - self.started_at.get(key, time.time())
            self.submit(
                lambda key=key, member=member, result=result, seconds=seconds: self._complete(
                    key, member, result, seconds
                )
            )

    def _complete(self, trial_id: str, config: dict, result: dict, seconds: float) -> None:
        run = self._run(trial_id, config)
        if run.ended:
            return
        self._advance()
        method, lr, seed, _ = _trial_label(config)
        score = result.get(SELECTION_METRIC)
        if "failed" in result:  # a member of a pack that diverged
            run.end("FAILED", result["failed"])
            logger.warning("trial %s lr=%g seed=%d FAILED: %s", method, lr, seed, result["failed"])
            return
        if "outcome" not in result:  # ended without a result: nothing to select
            run.end("FAILED", "the trial ended without reporting a result")
            logger.warning("trial %s lr=%g seed=%s FAILED: no result", method, lr, seed)
            return
        run.end("FINISHED")
        shown = "–" if score is None or not math.isfinite(score) else f"{score:.3f}"
        logger.info(
            "trial %-14s lr=%-7g seed=%d  val R@1 %s  FINISHED  %4.0f s",
            method,
            lr,
            seed,
            shown,
            seconds,
        )

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        """A failed trial (any cause) is an MLflow run with status FAILED and its reason."""
        reason = failure_reason(_trial_error(trial))
        for key, member in self._members(trial.trial_id, trial.config):

            def fail(key: str = key, member: dict[str, Any] = member) -> None:
                self._run(key, member).end("FAILED", reason)
                self._advance()
                method, lr, seed, _ = _trial_label(member)
                logger.warning("trial %s lr=%g seed=%d FAILED: %s", method, lr, seed, reason)

            self.submit(fail)


def _trial_error(trial) -> BaseException | str | None:
    """The error Tune just wrote beside the trial."""
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
