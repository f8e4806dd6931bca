"""Every write to a tracking store, in order: straight to it or, inside :func:`outage_queue` while
it is unreachable after MLflow's own retries, queued in memory (files copied) until it is back."""

from __future__ import annotations

import collections
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asymvlm.config import redact
from asymvlm.errors import one_line
from asymvlm.tracking.store import experiment_id, global_tracking_uri, seed_new_store

logger = logging.getLogger(__name__)

FIRST_RETRY_S, MAX_RETRY_S = 5.0, 60.0
_DATABASE_DOWN = re.compile(
    r"database is locked|could not connect|connection refused|server closed|timed? ?out", re.I
)
_state: dict[str, Any] = {"folder": None}  # where waiting writes keep their files; None: no queue
_writers: dict[str, Writer] = {}
_registry = threading.Lock()


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error in its chain) says the store could not be reached, decided
    by the errors' types (and a database error's first line), never by a logged value."""
    import requests

    kinds = (ConnectionError, TimeoutError, requests.ConnectionError, requests.Timeout)
    kinds += (requests.exceptions.RetryError, requests.exceptions.ChunkedEncodingError)
    chain = [exc]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) and cause not in chain:
        chain.append(cause)
    return any(
        isinstance(c, kinds)
        or type(c).__name__ == "OperationalError"
        and _DATABASE_DOWN.search(str(c).split("\n", 1)[0])
        for c in chain
    )


class Writer:
    """The writes to one tracking store, in order (``ids``: run key -> MLflow run id)."""

    def __init__(self, tracking_uri: str) -> None:
        from mlflow import MlflowClient

        seed_new_store(tracking_uri)
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri)
        self.ids: dict[str, str] = {}
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.lock = threading.RLock()
        self.retry_at = 0.0
        self._wait = FIRST_RETRY_S

    def write(self, op: dict[str, Any]) -> None:
        """Apply ``op`` now, or queue it behind the waiting writes."""
        with self.lock:
            if not self.queue:
                try:
                    return self._apply(op)
                except Exception as exc:
                    if _state["folder"] is None or not is_transient(exc):
                        raise
                    self._failed()
                    what = redact(self.tracking_uri), one_line(exc)
                    logger.warning("tracking store %s unreachable (%s): its writes wait", *what)
            self.queue.append(_kept(op))
            self.drain_once()

    def _apply(self, op: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        kind, client = op["op"], self.client
        if kind == "create_run":
            tags = dict(op["tags"])
            if parent := op.get("parent_id") or op.get("parent_key") and self.ids[op["parent_key"]]:
                tags["mlflow.parentRunId"] = parent
            experiment = experiment_id(client, op["experiment"], self.tracking_uri)
            created = client.create_run(experiment, op["start_time"], tags, op["name"])
            self.ids[op["run"]] = created.info.run_id
            return
        run_id = self.ids[op["run"]]
        if kind == "log_batch":
            metrics = [Metric(*m) for m in op.get("metrics", [])]
            params = [Param(*p) for p in op.get("params", [])]
            tags = [RunTag(*t) for t in op.get("tags", [])]
            client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        elif kind == "log_artifact":
            client.log_artifact(run_id, op["path"])
        elif kind == "log_model":
            import mlflow

            model = {"name": op["name"], "loader_module": op["loader"], "data_path": op["path"]}
            with global_tracking_uri(self.tracking_uri), mlflow.start_run(run_id=run_id):
                mlflow.pyfunc.log_model(**model, **op["options"])
            client.update_run(run_id, status="RUNNING")  # leaving start_run ended it
        elif kind == "set_terminated":
            client.set_terminated(run_id, op["status"], op["end_time"])
        else:
            client.update_run(run_id, status=op["status"])

    def _failed(self) -> None:
        self.retry_at = time.monotonic() + self._wait
        self._wait = min(2 * self._wait, MAX_RETRY_S)

    def drain_once(self) -> int:
        """Apply the waiting writes until the store fails again; the number still waiting."""
        with self.lock:
            while self.queue and time.monotonic() >= self.retry_at:
                try:
                    self._apply(self.queue[0])
                except Exception as exc:
                    if is_transient(exc):
                        self._failed()
                        break
                    what = redact(self.tracking_uri), self.queue[0]["op"], one_line(exc)
                    logger.warning("tracking store %s refused a waiting write (%s): %s", *what)
                self.queue.popleft()
                if not self.queue:
                    self.retry_at = 0.0
                    self._wait = FIRST_RETRY_S
                    logger.info("tracking store %s is back", redact(self.tracking_uri))
            return len(self.queue)


def _kept(op: dict[str, Any]) -> dict[str, Any]:
    """``op`` as it waits: its files copied (the caller may delete them)."""
    if op["op"] not in ("log_artifact", "log_model"):
        return op
    target = os.path.join(_state["folder"], uuid.uuid4().hex, os.path.basename(op["path"]))
    os.makedirs(os.path.dirname(target))
    (shutil.copytree if os.path.isdir(op["path"]) else shutil.copyfile)(op["path"], target)
    return {**op, "path": target}


def writer(tracking_uri: str) -> Writer:
    """The writer of ``tracking_uri`` in this process."""
    with _registry:
        if tracking_uri not in _writers:
            _writers[tracking_uri] = Writer(tracking_uri)
        return _writers[tracking_uri]


def pending() -> int:
    """How many writes of this process wait for their store."""
    return sum(len(each.queue) for each in list(_writers.values()))


def drain(timeout_s: float) -> int:
    """Retry the waiting writes each second for ``timeout_s``; the number still waiting."""
    deadline = time.monotonic() + timeout_s
    while True:
        for each in list(_writers.values()):
            each.retry_at = 0.0
        left = sum(each.drain_once() for each in list(_writers.values()))
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(1.0)


@contextmanager
def outage_queue(drain_s: float = 300.0) -> Iterator[None]:
    """Inside the block, writes to an unreachable store wait in order; at its end they are sent
    (for at most ``drain_s`` seconds) and what still waits is dropped with a warning."""
    previous, _state["folder"] = _state["folder"], tempfile.mkdtemp(prefix="asymvlm-mlflow-")
    try:
        yield
    finally:
        if pending():
            logger.info("MLflow: %d write(s) waited for the store; sending them", pending())
            drain(drain_s)
        for each in list(_writers.values()):
            if each.queue:
                what = len(each.queue), redact(each.tracking_uri)
                logger.warning("%d tracking writes never reached %s and are dropped", *what)
                each.queue.clear()
        shutil.rmtree(_state["folder"], ignore_errors=True)
        _state["folder"] = previous
