"""MLflow runs through their store's writer, with MLflow's standard tags: :func:`run` (a block),
:func:`open_run` (ended later), :func:`resume_run` (RUNNING again), :class:`Run` of an id."""

from __future__ import annotations

import getpass
import json
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from asymvlm.tracking import writer as writers
from asymvlm.tracking.store import git_commit

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def source_name() -> str:
    """The entry point for MLflow's Source column (``pipelines/full.py``, ``asymvlm analyze``)."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(script) == "asymvlm":
        return " ".join(["asymvlm", *[a for a in sys.argv[1:] if not a.startswith("-")][:1]])
    if script.startswith(_REPO + os.sep):
        return os.path.relpath(script, _REPO)
    return os.path.basename(script) or "python"


def standard_tags(description: str | None = None) -> dict[str, str]:
    """MLflow's own tags, which fill the UI's Source, User and Description."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = "unknown"
    tags = {
        "mlflow.source.git.commit": git_commit(),
        "mlflow.source.name": source_name(),
        "mlflow.source.type": "JOB" if os.environ.get("RAY_JOB_ID") else "LOCAL",
        "mlflow.user": user,
    }
    return tags | ({"mlflow.note.content": description} if description else {})


class Run:
    """One MLflow run, written through :class:`mlflow.MlflowClient` (no global active run: any
    number can be open at once). ``id``: None while its creation waits for the store."""

    def __init__(self, run_id: str | None, tracking_uri: str, key: str | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.key = key or uuid.uuid4().hex
        self.ended = False
        if run_id is not None:
            self._writer.ids[self.key] = run_id

    @property
    def _writer(self) -> writers.Writer:
        """Its store's writer (made at first use: a new SQLite store takes a second or two)."""
        return writers.writer(self.tracking_uri)

    @property
    def id(self) -> str | None:
        return self._writer.ids.get(self.key)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (Tune saves its callbacks) by its key: unpickled, its id is the writer's."""
        return {"uri": self.tracking_uri, "key": self.key, "ended": self.ended}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(None, state["uri"], state["key"])  # type: ignore[misc]
        self.ended = state["ended"]

    def _write(self, op: str, **fields: Any) -> None:
        self._writer.write({"op": op, "run": self.key, **fields})

    def _batches(self, kind: str, items: list[list[Any]], size: int) -> None:
        for start in range(0, len(items), size):
            self._write("log_batch", **{kind: items[start : start + size]})

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Params, as MLflow keeps them (strings of at most 6000 characters)."""
        items = [
            [str(k), (v if isinstance(v, str) else json.dumps(v, default=str))[:6000]]
            for k, v in params.items()
        ]
        self._batches("params", items, 100)

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> None:
        """Finite numbers only (None, NaN and non-numbers are left out)."""
        self.log_steps([(metrics, step, time.time())])

    def log_steps(self, rows: Iterable[tuple[Mapping[str, Any], int, float]]) -> None:
        """The metrics of several steps in one request: (metrics, step, when in seconds) each."""
        items = [
            [str(k), float(v), int(1000 * at), int(step)]
            for metrics, step, at in rows
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        ]
        self._batches("metrics", items, 1000)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [[str(k), str(v)[:5000]] for k, v in tags.items() if v is not None]
        self._batches("tags", items, 100)

    def log_artifact(self, path: str) -> None:
        """Upload file or folder ``path`` (a copy waits while the store is away)."""
        self._write("log_artifact", path=os.path.abspath(path))

    def log_text(self, name: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)
            self.log_artifact(os.path.join(tmp, name))

    def log_json(self, name: str, payload: Any) -> None:
        self.log_text(name, json.dumps(payload, indent=2, default=_json_default))

    def log_model(self, name: str, loader_module: str, data_path: str, **options: Any) -> None:
        """Pyfunc model ``name``: the files of ``data_path``, loaded by the installed module
        ``loader_module``'s ``_load_pyfunc`` (no pickle); ``options`` of its ``log_model``."""
        path = os.path.abspath(data_path)
        self._write("log_model", name=name, loader=loader_module, path=path, options=options)

    def end(self, status: str = "FINISHED", reason: str | None = None) -> None:
        """FINISHED, FAILED (``reason`` tagged ``failure_reason``) or KILLED; once only."""
        if self.ended:
            return
        if reason:
            self.set_tags({"failure_reason": reason, "mlflow.note.content": f"{status}: {reason}"})
        self._write("set_terminated", status=status, end_time=int(1000 * time.time()))
        self.ended = True


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
    start_time: float | None = None,
    key: str | None = None,
) -> Run:
    """Start a run (RUNNING) in ``experiment``, ended with :meth:`Run.end`; ``start_time``
    (seconds, default now): when what it records began; ``key``: :class:`Run`'s."""
    out = Run(None, tracking_uri, key)
    if isinstance(parent, Run) and parent.tracking_uri == tracking_uri:
        link = {"parent_key": parent.key}  # resolved when the run is created: it may wait too
    else:
        link = {"parent_id": parent.id if isinstance(parent, Run) else parent}
    all_tags = {**standard_tags(description), "kind": kind, **(tags or {})}
    out._write(
        "create_run",
        experiment=experiment,
        name=name,
        tags={k: str(v)[:5000] for k, v in all_tags.items() if v is not None},
        start_time=int(1000 * (time.time() if start_time is None else start_time)),
        **link,
    )
    if params:
        out.log_params(params)
    return out


def resume_run(tracking_uri: str, run_id: str, key: str | None = None) -> Run:
    """The existing run ``run_id``, RUNNING again (a resumed sweep goes on writing to it)."""
    out = Run(run_id, tracking_uri, key)
    out._write("update_run", status="RUNNING")
    return out


@contextmanager
def run(tracking_uri: str, experiment: str, name: str, **options: Any) -> Iterator[Run]:
    """A run for the block (``options`` of :func:`open_run`), ended as :func:`ended` says."""
    handle = open_run(tracking_uri, experiment, name, **options)
    with ended(lambda: handle):
        yield handle


@contextmanager
def ended(handle: Callable[[], Run | None]) -> Iterator[None]:
    """End the run ``handle()`` returns (asked at the end; None: none) as the block ends:
    FINISHED, FAILED with the reason if it raises, KILLED on Ctrl-C."""
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
