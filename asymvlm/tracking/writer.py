"""The writer of a tracking store: every write, in order, straight to the store or behind the
writes that wait in its spool (:mod:`asymvlm.tracking.spool` tells how and why); the process's
spool folder (:func:`use_spool`), the writes waiting (:func:`pending`, :func:`drain`) and the
replay of a spool a process left behind (:func:`replay`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from asymvlm.config import redact
from asymvlm.errors import one_line
from asymvlm.tracking.spool import META, REJECTED, Spool, SpoolError, spool_folders
from asymvlm.tracking.store import experiment_id, global_tracking_uri

logger = logging.getLogger(__name__)

__all__ = [
    "Writer",
    "drain",
    "is_transient",
    "pending",
    "pending_line",
    "replay",
    "use_spool",
    "writer",
]

#: The package that travels with a logged model (its ``code_paths``): asymvlm itself.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The tag holding a run's key: a waiting run is looked for by it before it is created.
KEY_TAG = "asymvlm.run_key"
FIRST_RETRY_S, MAX_RETRY_S = 5.0, 60.0


# -- which failures wait ------------------------------------------------------------------------
_DATABASE_DOWN = re.compile(
    r"database is locked|could not connect|connection refused|server closed|timed? ?out", re.I
)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached (after MLflow's own retries: refused
    or reset connections, timeouts, 5xx answers; a database that is locked or down), rather than
    that the write itself is wrong. Decided by the errors' types, never by a message that might
    quote a logged value (but a database error's first line)."""
    import requests

    kinds = (
        ConnectionError,
        TimeoutError,
        requests.ConnectionError,
        requests.Timeout,
        requests.exceptions.RetryError,
        requests.exceptions.ChunkedEncodingError,
    )
    for cause in _causes(exc):
        if isinstance(cause, kinds):
            return True
        first_line = str(cause).split("\n", 1)[0]
        if type(cause).__name__ == "OperationalError" and _DATABASE_DOWN.search(first_line):
            return True
    return False


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it came from, outermost first."""
    chain = [exc]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) and cause not in chain:
        chain.append(cause)
    return chain


def _reason(exc: BaseException | None) -> str:
    """The root of ``exc``, on one line ("[Errno 111] Connection refused", "timed out")."""
    return one_line(_causes(exc)[-1]) if exc is not None else "no error"


def _unreachable(tracking_uri: str) -> OSError | None:
    """Why the host of an HTTP store takes no connection at all (None: it does, or the store is
    not a server, or a proxy is in the way): a look before the spool is tried, as MLflow's own
    retries take minutes to give up on a host that is down."""
    import requests

    parts = urllib.parse.urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if requests.utils.get_environ_proxies(tracking_uri):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
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
    key, client = op["run"], writer.client
    if key in writer.ids:
        return  # created before this write was counted
    experiment = experiment_id(client, op["experiment"], writer.tracking_uri)
    if op.get("spooled"):  # created, but the answer or the key map was lost?
        found = client.search_runs([experiment], f"tags.`{KEY_TAG}` = '{key}'", max_results=1)
        if found:
            writer.bind(key, found[0].info.run_id)
            return
    tags = dict(op["tags"])
    parent = op.get("parent_id") or (op.get("parent_key") and _id(writer, op["parent_key"]))
    if parent:
        tags["mlflow.parentRunId"] = parent
    created = client.create_run(
        experiment, run_name=op["name"], tags=tags, start_time=op.get("start_time")
    )
    writer.bind(key, created.info.run_id)


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
    # Leaving start_run ended the run; it is still being written: RUNNING again.
    writer.client.update_run(run_id, status="RUNNING")


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


# -- the writer of a store ------------------------------------------------------------------------
class Writer:
    """Every write to one tracking store, in order: straight to it while nothing waits, else
    behind the waiting ones in the spool ``folder`` (None: no spool, failures raise)."""

    def __init__(self, tracking_uri: str, folder: str | None = None) -> None:
        from mlflow import MlflowClient

        self.tracking_uri, self.folder = tracking_uri, folder
        self.client = MlflowClient(tracking_uri)
        self.ids: dict[str, str] = {}  # run key -> MLflow run id
        self.spool: Spool | None = None
        self.lock = threading.RLock()
        self.error: BaseException | None = None  # why the spool last failed to drain
        self.applied = self.rejected = 0
        self._retry_at, self._wait = 0.0, FIRST_RETRY_S
        self.use(folder)

    @property
    def pending(self) -> int:
        return self.spool.pending if self.spool else 0

    def run_id(self, key: str) -> str | None:
        return self.ids.get(key)

    def bind(self, key: str, run_id: str) -> None:
        with self.lock:
            self.ids[key] = run_id
            if self.spool:
                self.spool.bind({key: run_id})

    def use(self, folder: str | None) -> None:
        """Spool into ``folder`` from now on; a spool left there by a process that ended is
        taken over (its writes go first). Writes waiting in the former folder stay there."""
        with self.lock:
            if self.spool is not None and folder != self.folder:
                if self.spool.pending:
                    logger.warning("%s", _line(self.spool.pending, self.spool.folder))
                self.spool.close()
                self.spool = None
            self.folder = folder
            if self.spool is None and folder and os.path.isfile(os.path.join(folder, META)):
                try:
                    self.attach(Spool(folder))
                except SpoolError:  # held by another live process: it applies it
                    pass

    def attach(self, spool: Spool | None = None) -> None:
        """Write behind ``spool`` (default: the one in this writer's folder, or a folder of
        this process's own beside it when another process holds that one)."""
        if spool is None and self.spool is None:
            assert self.folder is not None
            try:
                spool = Spool(self.folder, self.tracking_uri)
            except SpoolError:  # held by another live process
                spool = Spool(f"{self.folder}-{os.getpid()}", self.tracking_uri)
        if spool is not None:
            self.spool = spool
            spool.bind(self.ids)
            self.ids.update(spool.run_ids)

    def write(self, op: dict[str, Any]) -> None:
        """Apply ``op`` now, or keep it in the spool behind the waiting writes."""
        with self.lock:
            if not self.pending:
                try:
                    APPLY[op["op"]](self, op)
                    return
                except Exception as exc:
                    if self.folder is None or not is_transient(exc):
                        raise
                    self.attach()
                    self._failed(exc)
                    assert self.spool is not None
                    logger.warning(
                        "tracking store %s unreachable (%s): its writes wait in %s "
                        "and land when it is back",
                        redact(self.tracking_uri),
                        _reason(exc),
                        self.spool.folder,
                    )
            assert self.spool is not None
            self.spool.append(op)
            if time.monotonic() >= self._retry_at:
                self.drain_once()

    def _failed(self, exc: BaseException) -> None:
        self.error = exc
        self._retry_at = time.monotonic() + self._wait
        self._wait = min(2 * self._wait, MAX_RETRY_S)

    def drain_once(self) -> int:
        """Apply the waiting writes in order until the store fails again; the writes left. A
        write the store refuses is set aside (``rejected.jsonl``) with a warning."""
        with self.lock:
            spool = self.spool
            if spool is None or not spool.pending:
                return 0
            waiting = spool.pending
            if (down := _unreachable(self.tracking_uri)) is not None:
                self._failed(down)
                return waiting
            while spool.pending:
                op = spool.ops[spool.applied]
                try:
                    APPLY[op["op"]](self, spool.head())
                    self.applied += 1
                except Exception as exc:
                    if is_transient(exc):
                        self._failed(exc)
                        return spool.pending
                    self.rejected += 1
                    spool.reject(exc)
                    logger.warning(
                        "tracking store %s refused a waiting write (%s of run %s), "
                        "set aside in %s: %s",
                        redact(self.tracking_uri),
                        op["op"],
                        op["run"],
                        spool.folder,
                        one_line(exc),
                    )
                spool.advance()
            self._retry_at, self._wait = 0.0, FIRST_RETRY_S
            logger.info(
                "tracking store %s is back: %d waiting writes landed",
                redact(self.tracking_uri),
                waiting,
            )
            spool.compact()
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
    """Where writes wait while their store is unreachable, for this process (one spool per
    store in it); None: nowhere, a write that fails raises. A spool left in ``directory`` by
    a process that ended is applied before the writes to its store that follow."""
    with _registry:
        _state["directory"] = os.path.abspath(directory) if directory else None
        for uri, each in _writers.items():
            each.use(_folder(uri))


def pending() -> int:
    """How many writes of this process wait for their store."""
    with _registry:
        return sum(each.pending for each in _writers.values())


def drain(timeout_s: float) -> int:
    """Try the waiting writes (every second) until all landed, or until ``timeout_s`` passed
    without one landing (a store that is back but slow is waited for); the number still
    waiting."""
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


def _line(count: int, folder: str) -> str:
    return f"{count} tracking writes wait in {folder}; replay them with `asymvlm replay {folder}`"


def pending_line() -> str | None:
    """One line naming the writes that still wait and the command that replays them (None
    when none wait), for the end of a run."""
    with _registry:
        spools = [each.spool for each in _writers.values() if each.spool and each.spool.pending]
    if not spools:
        return None
    folders = {os.path.dirname(spool.folder) for spool in spools}
    where = folders.pop() if len(folders) == 1 else " ".join(s.folder for s in spools)
    return _line(sum(spool.pending for spool in spools), where)


def replay(directory: str, tracking_uri: str | None = None) -> int:
    """Apply the spool in ``directory`` (or every spool in its folders), left by a process that
    ended, to its store (``tracking_uri``: instead of the one recorded, e.g. when that one is
    redacted or the store moved); the number of writes applied. Applying it again applies
    nothing. :class:`SpoolError` when it is not a spool, is in use, or its store is still
    unreachable."""
    directory = os.path.abspath(directory)
    folders = spool_folders(directory)
    if not folders:
        raise SpoolError(f"{directory}: not a tracking spool (no {META} in it or its folders)")
    applied = 0
    for folder in folders:
        spool = Spool(folder)
        try:
            uri = tracking_uri or spool.meta["tracking_uri"]
            if tracking_uri and redact(tracking_uri) != spool.meta["tracking_uri"]:
                logger.info(
                    "%s: recorded for %s, applied to %s",
                    folder,
                    spool.meta["tracking_uri"],
                    redact(tracking_uri),
                )
            if tracking_uri is None and spool.meta.get("credentials"):
                raise SpoolError(
                    f"{folder}: its store {uri} needs credentials; give its URI with --mlflow-uri"
                )
            one = Writer(uri)
            one.attach(spool)
            waiting = spool.pending
            if one.drain_once():
                raise SpoolError(
                    f"{folder}: the tracking store {redact(uri)} is still "
                    f"unreachable ({_reason(one.error)}); "
                    f"{spool.pending} of {waiting} writes wait"
                )
            applied += one.applied
            logger.info(
                "%s: %d writes applied to %s%s",
                folder,
                one.applied,
                redact(uri),
                f", {one.rejected} refused ({REJECTED})" if one.rejected else "",
            )
        finally:
            spool.close()
    return applied
