"""The writer of a tracking store: every write in order, straight to the store, or -- while the
store is unreachable after MLflow's own retries and this process has a spool folder
(:func:`use_spool`) -- queued behind the writes that wait, their files copied into the folder,
and sent when the store is back (:func:`drain` at the end of a job)."""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import re
import shutil
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

from asymvlm.config import redact
from asymvlm.errors import one_line
from asymvlm.tracking.store import experiment_id, global_tracking_uri

logger = logging.getLogger(__name__)

__all__ = ["Writer", "drain", "is_transient", "pending", "use_spool", "writer"]

#: The package that travels with a logged model (its ``code_paths``): asymvlm itself.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_RETRY_S, MAX_RETRY_S = 5.0, 60.0

_DATABASE_DOWN = re.compile(
    r"database is locked|could not connect|connection refused|server closed|timed? ?out", re.I
)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached (a refused or reset connection, a
    timeout, MLflow's retries exhausted, a locked database), not that the write is wrong.
    Decided by the errors' types (and a database error's first line), never by a message that
    might quote a logged value."""
    import requests

    kinds = (
        ConnectionError,
        TimeoutError,
        requests.ConnectionError,
        requests.Timeout,
        requests.exceptions.RetryError,
        requests.exceptions.ChunkedEncodingError,
    )
    chain = [exc]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) and cause not in chain:
        chain.append(cause)
    for cause in chain:
        if isinstance(cause, kinds):
            return True
        first_line = str(cause).split("\n", 1)[0]
        if type(cause).__name__ == "OperationalError" and _DATABASE_DOWN.search(first_line):
            return True
    return False


def _unreachable(tracking_uri: str) -> OSError | None:
    """Why the host of an HTTP store takes no connection (None: it does, or it is no server):
    a quick look before the waiting writes are tried, as MLflow's retries take minutes."""
    import requests

    parts = urllib.parse.urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if requests.utils.get_environ_proxies(tracking_uri):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname, port), timeout=10).close()
    except OSError as exc:
        return exc
    return None


# -- one write per MLflow call --------------------------------------------------------------------
def _id(writer: Writer, key: str) -> str:
    try:
        return writer.ids[key]
    except KeyError:
        raise ValueError(f"run {key} was never created in {redact(writer.tracking_uri)}") from None


def _create_run(writer: Writer, op: dict[str, Any]) -> None:
    tags = dict(op["tags"])
    parent = op.get("parent_id") or (op.get("parent_key") and _id(writer, op["parent_key"]))
    if parent:
        tags["mlflow.parentRunId"] = parent
    experiment = experiment_id(writer.client, op["experiment"], writer.tracking_uri)
    created = writer.client.create_run(
        experiment, run_name=op["name"], tags=tags, start_time=op.get("start_time")
    )
    writer.ids[op["run"]] = created.info.run_id


def _log_batch(writer: Writer, op: dict[str, Any]) -> None:
    from mlflow.entities import Metric, Param, RunTag

    writer.client.log_batch(
        _id(writer, op["run"]),
        metrics=[Metric(k, v, timestamp, step) for k, v, timestamp, step in op.get("metrics", [])],
        params=[Param(k, v) for k, v in op.get("params", [])],
        tags=[RunTag(k, v) for k, v in op.get("tags", [])],
    )


def _log_artifact(writer: Writer, op: dict[str, Any]) -> None:
    writer.client.log_artifact(_id(writer, op["run"]), op["path"], op.get("artifact_path"))


def _log_pyfunc(writer: Writer, op: dict[str, Any]) -> None:
    import mlflow

    run_id = _id(writer, op["run"])
    with (
        global_tracking_uri(writer.tracking_uri),
        mlflow.start_run(run_id=run_id, log_system_metrics=False),
    ):
        mlflow.pyfunc.log_model(
            name=op["name"], python_model=op["python_model"], code_paths=[PACKAGE], **op["options"]
        )
    writer.client.update_run(run_id, status="RUNNING")  # leaving start_run ended it


def _set_terminated(writer: Writer, op: dict[str, Any]) -> None:
    writer.client.set_terminated(_id(writer, op["run"]), op["status"], op.get("end_time"))


def _update_run(writer: Writer, op: dict[str, Any]) -> None:
    writer.client.update_run(_id(writer, op["run"]), status=op["status"])


APPLY: dict[str, Callable[[Writer, dict[str, Any]], None]] = {
    "create_run": _create_run,
    "log_batch": _log_batch,
    "log_artifact": _log_artifact,
    "log_pyfunc": _log_pyfunc,
    "set_terminated": _set_terminated,
    "update_run": _update_run,
}


class Writer:
    """Every write to one tracking store, in order: straight to it while nothing waits, else
    queued, its files copied under ``folder`` (None: no spool, failures raise)."""

    def __init__(self, tracking_uri: str, folder: str | None = None) -> None:
        from mlflow import MlflowClient

        self.tracking_uri, self.folder = tracking_uri, folder
        self.client = MlflowClient(tracking_uri)
        self.ids: dict[str, str] = {}  # run key -> MLflow run id
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.lock = threading.RLock()
        self._retry_at, self._wait = 0.0, FIRST_RETRY_S

    @property
    def pending(self) -> int:
        return len(self.queue)

    def run_id(self, key: str) -> str | None:
        return self.ids.get(key)

    def bind(self, key: str, run_id: str) -> None:
        self.ids[key] = run_id

    def write(self, op: dict[str, Any]) -> None:
        """Apply ``op`` now, or queue it behind the waiting writes."""
        with self.lock:
            if not self.queue:
                try:
                    APPLY[op["op"]](self, op)
                    return
                except Exception as exc:
                    if self.folder is None or not is_transient(exc):
                        raise
                    self._failed(exc)
                    logger.warning(
                        "tracking store %s unreachable (%s): its writes wait (files in %s)",
                        redact(self.tracking_uri),
                        one_line(exc),
                        self.folder,
                    )
            self.queue.append(self._kept(op))
            if time.monotonic() >= self._retry_at:
                self.drain_once()

    def _kept(self, op: dict[str, Any]) -> dict[str, Any]:
        """``op`` as it waits: its times fixed now, its files copied (the caller may delete
        them)."""
        now = int(1000 * time.time())
        if op["op"] == "create_run" and op.get("start_time") is None:
            return {**op, "start_time": now}
        if op["op"] == "set_terminated" and op.get("end_time") is None:
            return {**op, "end_time": now}
        if op["op"] == "log_artifact":
            return {**op, "path": self._copy(op["path"])}
        if op["op"] == "log_pyfunc":
            artifacts = {k: self._copy(v) for k, v in op["options"].get("artifacts", {}).items()}
            return {**op, "options": {**op["options"], "artifacts": artifacts}}
        return op

    def _copy(self, path: str) -> str:
        assert self.folder is not None
        target = os.path.join(self.folder, uuid.uuid4().hex, os.path.basename(path))
        os.makedirs(os.path.dirname(target))
        (shutil.copytree if os.path.isdir(path) else shutil.copyfile)(path, target)
        return target

    def _failed(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + self._wait
        self._wait = min(2 * self._wait, MAX_RETRY_S)

    def drain_once(self) -> int:
        """Apply the waiting writes in order until the store fails again; the writes left. A
        write the store refuses is dropped with a warning."""
        with self.lock:
            if not self.queue:
                return 0
            if (down := _unreachable(self.tracking_uri)) is not None:
                self._failed(down)
                return len(self.queue)
            waiting = len(self.queue)
            while self.queue:
                op = self.queue[0]
                try:
                    APPLY[op["op"]](self, op)
                except Exception as exc:
                    if is_transient(exc):
                        self._failed(exc)
                        return len(self.queue)
                    logger.warning(
                        "tracking store %s refused a waiting write (%s of run %s): %s",
                        redact(self.tracking_uri),
                        op["op"],
                        op["run"],
                        one_line(exc),
                    )
                self.queue.popleft()
            self._retry_at, self._wait = 0.0, FIRST_RETRY_S
            logger.info(
                "tracking store %s is back: %d waiting writes landed",
                redact(self.tracking_uri),
                waiting,
            )
            if self.folder:
                shutil.rmtree(self.folder, ignore_errors=True)
            return 0


# -- the process's configuration ------------------------------------------------------------------
_state: dict[str, Any] = {"directory": None}
_writers: dict[str, Writer] = {}
_registry = threading.Lock()


def _folder(tracking_uri: str) -> str | None:
    directory = _state["directory"]
    if directory is None:
        return None
    return os.path.join(directory, "store-" + hashlib.sha1(tracking_uri.encode()).hexdigest()[:12])


def writer(tracking_uri: str) -> Writer:
    """The writer of ``tracking_uri`` in this process."""
    with _registry:
        if tracking_uri not in _writers:
            _writers[tracking_uri] = Writer(tracking_uri, _folder(tracking_uri))
        return _writers[tracking_uri]


def use_spool(directory: str | None) -> None:
    """Where the files of waiting writes are kept, for this process (None: a write to an
    unreachable store raises; writes still waiting are dropped, with a warning)."""
    with _registry:
        _state["directory"] = os.path.abspath(directory) if directory else None
        for uri, each in _writers.items():
            each.folder = _folder(uri)
            if directory is None and each.queue:
                logger.warning(
                    "%d tracking writes never reached %s and are dropped",
                    len(each.queue),
                    redact(uri),
                )
                each.queue.clear()


def pending() -> int:
    """How many writes of this process wait for their store."""
    with _registry:
        return sum(each.pending for each in _writers.values())


def drain(timeout_s: float) -> int:
    """Try the waiting writes (every second) until all landed, or until ``timeout_s`` passed
    without one landing; the number still waiting."""
    deadline = time.monotonic() + timeout_s
    before = None
    while True:
        with _registry:
            writers = list(_writers.values())
        left = sum(each.drain_once() for each in writers)
        if before is not None and left < before:  # progress: the store is back
            deadline = time.monotonic() + timeout_s
        before = left
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
