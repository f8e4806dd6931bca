"""MLflow runs, created, filled and ended through their store's writer
(:mod:`asymvlm.tracking.writer`): :func:`run` (a block), :func:`open_run` (ended later),
:func:`resume_run` (a run that ended, RUNNING again), each with MLflow's standard tags."""

from __future__ import annotations

import getpass
import json
import logging
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from asymvlm.tracking import writer as writers
from asymvlm.tracking.store import git_commit
from asymvlm.tracking.writer import PACKAGE

logger = logging.getLogger(__name__)

__all__ = ["PACKAGE", "Run", "existing_run", "open_run", "resume_run", "run", "source_name"]

_REPO = os.path.dirname(PACKAGE)
_MAX_PARAM = 6000  # MLflow's limit on a param value


def source_name() -> str:
    """The entry point, as MLflow's Source column shows it: ``pipelines/full.py``,
    ``asymvlm analyze``..."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(script) == "asymvlm" or script.endswith(os.path.join("asymvlm", "cli.py")):
        sub = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
        return f"asymvlm {sub}".strip()
    if script.startswith(_REPO + os.sep):
        return os.path.relpath(script, _REPO)
    return os.path.basename(script) or "python"


def standard_tags(description: str | None = None, source: str | None = None) -> dict[str, str]:
    """MLflow's own tags, which fill the UI's Source, User and Description."""
    tags = {
        "mlflow.source.git.commit": git_commit(),
        "mlflow.source.name": source or source_name(),
        "mlflow.source.type": "JOB" if os.environ.get("RAY_JOB_ID") else "LOCAL",
        "mlflow.user": _user(),
    }
    if description:
        tags["mlflow.note.content"] = description
    return tags


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "unknown"


class Run:
    """One MLflow run, written through :class:`mlflow.MlflowClient` (no global active run, so
    any number can be open at once, e.g. one per running trial), by way of its store's writer.

    ``id`` is the MLflow run id; None while its creation waits for the store. ``key`` names
    the run in the writer's queue.
    """

    def __init__(self, client, run_id: str | None, tracking_uri: str) -> None:
        self.client, self.tracking_uri = client, tracking_uri
        self.key = uuid.uuid4().hex
        self.ended = False
        self._writer = writers.writer(tracking_uri)
        if run_id is not None:
            self._writer.bind(self.key, run_id)

    @property
    def id(self) -> str | None:
        return self._writer.run_id(self.key)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (Tune saves its callbacks) with its id, without its writer."""
        state = {k: v for k, v in self.__dict__.items() if k != "_writer"}
        return {**state, "_id": self.id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        run_id = state.pop("_id", None)
        self.__dict__.update(state)
        self._writer = writers.writer(self.tracking_uri)
        if run_id is not None:
            self._writer.bind(self.key, run_id)

    def _write(self, op: str, **fields: Any) -> None:
        self._writer.write({"op": op, "run": self.key, **fields})

    # -- values --------------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [[str(k), _param(v)] for k, v in params.items()]
        for start in range(0, len(items), 100):
            self._write("log_batch", params=items[start : start + 100])

    def log_metrics(
        self, metrics: Mapping[str, Any], step: int = 0, timestamp: float | None = None
    ) -> None:
        """Finite numbers only (None, NaN and non-numbers are left out); ``timestamp`` in
        seconds (default: now)."""
        self.log_metric_rows([(step, metrics, time.time() if timestamp is None else timestamp)])

    def log_metric_rows(self, rows: list[tuple[int, Mapping[str, Any], float]]) -> None:
        """Several steps' metrics at once: ``(step, metrics, timestamp in seconds)`` each, in
        one request per 1000 values (finite numbers only, as :meth:`log_metrics`)."""
        items = [
            [str(k), float(v), int(1000 * ts), int(step)]
            for step, metrics, ts in rows
            for k, v in metrics.items()
            if _finite(v)
        ]
        for start in range(0, len(items), 1000):
            self._write("log_batch", metrics=items[start : start + 1000])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [[str(k), str(v)[:5000]] for k, v in tags.items() if v is not None]
        for start in range(0, len(items), 100):
            self._write("log_batch", tags=items[start : start + 100])

    # -- files ---------------------------------------------------------------------------------
    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        """Upload file or folder ``path`` (a copy waits while the store is away)."""
        self._write("log_artifact", path=os.path.abspath(path), artifact_path=artifact_path)

    def log_text(self, name: str, text: str, artifact_path: str | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, name)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            self.log_artifact(path, artifact_path)

    def log_json(self, name: str, payload: Any, artifact_path: str | None = None) -> None:
        self.log_text(name, json.dumps(payload, indent=2, default=_json_default), artifact_path)

    def log_pyfunc(self, name: str, python_model: Any, **options: Any) -> None:
        """Log ``python_model`` (a :class:`~asymvlm.tracking.PythonModel`) as the pyfunc model
        ``name`` of this run, with this package as its code (``options``: ``artifacts``,
        ``pip_requirements``, ``signature``, ``input_example`` of ``mlflow.pyfunc.log_model``)."""
        self._write("log_pyfunc", name=name, python_model=python_model, options=options)

    # -- the end -------------------------------------------------------------------------------
    def end(self, status: str = "FINISHED", reason: str | None = None) -> None:
        """FINISHED, FAILED (with ``reason`` as tag ``failure_reason`` and description) or
        KILLED; a second call does nothing."""
        if self.ended:
            return
        if reason:
            self.set_tags({"failure_reason": reason, "mlflow.note.content": f"{status}: {reason}"})
        self._write("set_terminated", status=status, end_time=None)  # None: now
        self.ended = True


def _param(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:_MAX_PARAM]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _json_default(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def open_run(
    tracking_uri: str,
    experiment: str,
    name: str,
    *,
    kind: str,
    parent: str | Run | None = None,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    description: str | None = None,
    source: str | None = None,
    start_time: float | None = None,
) -> Run:
    """Start a run (status RUNNING) in ``experiment``; the caller ends it with :meth:`Run.end`.
    ``start_time`` (seconds; default now): when what the run records began, for a run opened
    later by a writer thread."""
    writer = writers.writer(tracking_uri)
    out = Run(writer.client, None, tracking_uri)
    all_tags = {
        **standard_tags(description, source),
        "kind": kind,
        **(tags or {}),
    }
    if isinstance(parent, Run) and parent.tracking_uri == tracking_uri:
        link = {"parent_key": parent.key}  # resolved when the run is created: it may wait too
    else:
        link = {"parent_id": parent.id if isinstance(parent, Run) else parent}
    out._write(
        "create_run",
        experiment=experiment,
        name=name,
        tags={k: str(v)[:5000] for k, v in all_tags.items() if v is not None},
        start_time=None if start_time is None else int(1000 * start_time),
        **link,
    )
    if params:
        out.log_params(params)
    return out


def resume_run(tracking_uri: str, run_id: str) -> Run:
    """Reopen the existing run ``run_id`` (status RUNNING again, ``ended`` False), so that a
    resumed sweep goes on writing to the same run."""
    out = Run(writers.writer(tracking_uri).client, run_id, tracking_uri)
    out._write("update_run", status="RUNNING")
    return out


def existing_run(tracking_uri: str, run_id: str) -> Run:
    """An existing run as it is (ended: only tags and metrics are added to it)."""
    out = Run(writers.writer(tracking_uri).client, run_id, tracking_uri)
    out.ended = True
    return out


@contextmanager
def run(tracking_uri: str, experiment: str, name: str, **options: Any) -> Iterator[Run]:
    """A run for the block (``options`` as for :func:`open_run`: kind, parent, params, tags,
    description, source): FINISHED at its end, FAILED with the reason if it raises, KILLED on
    Ctrl-C."""
    handle = open_run(tracking_uri, experiment, name, **options)
    with ended(lambda: handle):
        yield handle


@contextmanager
def ended(handle: Callable[[], Run | None]) -> Iterator[None]:
    """End the run ``handle()`` returns as the block ends: FINISHED, FAILED with the reason if
    the block raises, KILLED on Ctrl-C (``handle`` is asked at the end, so a run still being
    opened on another thread can be given; None: no run to end)."""
    try:
        yield
    except KeyboardInterrupt:
        if (run_ := handle()) is not None:
            run_.end("KILLED", "interrupted")
        raise
    except BaseException as exc:
        if (run_ := handle()) is not None:
            run_.end("FAILED", " ".join(str(exc).split())[:500] or type(exc).__name__)
        raise
    if (run_ := handle()) is not None:
        run_.end("FINISHED")
