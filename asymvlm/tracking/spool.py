"""Writes that wait for their tracking store: a local, durable, ordered spool.

Every write of :mod:`asymvlm.tracking.runs` (a run's creation, its metrics, params and tags,
its artifacts and models, its end) goes through the writer of its tracking URI
(:class:`~asymvlm.tracking.writer.Writer`, one per store and process). While nothing waits, a
write goes straight to the store. When the store cannot be reached even after MLflow's own HTTP
retries (connection refused or reset, a timeout, a 5xx answer, a SQLite database that stays
locked: :func:`~asymvlm.tracking.writer.is_transient`) and a spool folder is configured
(:func:`~asymvlm.tracking.use_spool`), the write is appended to the spool instead, and every
later write to that store waits behind it: the order of the writes, across all runs of the
store, is kept. The caller goes on; a write that is wrong in itself (a bad value, an unknown
run) still raises. Without a spool folder nothing changes: every failure raises, as before.

The spool of a store is the folder ``<spool folder>/store-<hash of the URI>``, holding

* ``spool.json`` -- the store it belongs to (its URI with any password redacted);
* ``ops.jsonl`` -- the writes, one JSON object per line, appended and fsync'd one by one;
* ``applied`` -- how many of them reached the store (written after each one);
* ``runs.json`` -- run key -> MLflow run id, written as soon as a run is created. A run is named
  in the writes by a key made with its :class:`~asymvlm.tracking.Run` (a run created during an
  outage has no MLflow id yet); a parent and the experiment are resolved when the write lands;
* ``files/`` -- copies of the files to upload (artifacts; a model's python_model and options,
  pickled with cloudpickle, and its artifact files), which the caller may delete meanwhile;
* ``rejected.jsonl`` -- writes the store refused when they landed (a warning names each).

The spool drains in order: a later write tries it again (after 5 s, then backing off to one
try a minute), and :func:`~asymvlm.tracking.drain` tries it until it is empty or time is up.
Once all landed, the log is emptied (the key map stays). If the store does not come back before
the process ends, the spool stays: ``asymvlm replay SPOOL_FOLDER [--mlflow-uri URI]``
(:func:`~asymvlm.tracking.replay`) applies it once the store is back, and a process that uses
the same spool folder again applies it first.

Writes land at least once: one that reached the store just before the process died, and was not
counted yet, is applied again. That is harmless: the run is not created twice (the key map, and
the run's ``asymvlm.run_key`` tag searched for before a waiting run is created), params and tags
are set to the same values, artifacts are overwritten, and a metric logged again with the same
key, value, step and timestamp is dropped by MLflow's SQL stores, a tracking server over a
database included (the metric's primary key: its history keeps one point). A model logged again
is a second logged model of the same name on the run; ``runs:/<run>/<name>`` loads the latest.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
import uuid
from typing import Any

from asymvlm import storage
from asymvlm.config import redact
from asymvlm.errors import AsymVLMError, one_line

__all__ = ["Spool", "SpoolError", "spool_folders"]

META, _OPS, _APPLIED, _RUNS, REJECTED, _FILES, _LOCK = (
    "spool.json",
    "ops.jsonl",
    "applied",
    "runs.json",
    "rejected.jsonl",
    "files",
    "lock",
)


class SpoolError(AsymVLMError, RuntimeError):
    """A folder that is not a spool, is in use, or whose store is still unreachable."""


def spool_folders(directory: str) -> list[str]:
    """The spool ``directory`` is, or the spools in its folders (none: not a spool)."""
    if os.path.isfile(os.path.join(directory, META)):
        return [directory]
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    return [
        os.path.join(directory, n)
        for n in names
        if os.path.isfile(os.path.join(directory, n, META))
    ]


# -- the folder -----------------------------------------------------------------------------------
class Spool:
    """The spool folder of one store (see the module's doc), held by one process at a time."""

    def __init__(self, folder: str, tracking_uri: str | None = None) -> None:
        """Open the spool in ``folder``, made for ``tracking_uri`` if it is not one yet."""
        self.folder = folder
        if not os.path.isfile(self._path(META)):
            if tracking_uri is None:
                raise SpoolError(f"{folder}: not a tracking spool (no {META} in it)")
            os.makedirs(folder, exist_ok=True)
            safe = redact(tracking_uri)
            _write_json(
                self._path(META), {"tracking_uri": safe, "credentials": safe != tracking_uri}
            )
        with open(self._path(META)) as fh:
            self.meta: dict[str, Any] = json.load(fh)
        self._lock = open(self._path(_LOCK), "a")  # noqa: SIM115 -- held until close()
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise SpoolError(f"{folder}: the spool is in use by another process") from None
        self.ops: list[dict[str, Any]] = []
        if os.path.exists(self._path(_OPS)):
            with open(self._path(_OPS), "rb") as fh:
                *lines, torn = fh.read().split(b"\n")
            for number, line in enumerate(lines, 1):
                try:
                    self.ops.append(json.loads(line))
                except json.JSONDecodeError:
                    raise SpoolError(f"{folder}: line {number} of {_OPS} is damaged") from None
            if torn:  # a last line cut short: its write never returned; drop it
                _write_text(self._path(_OPS), "".join(json.dumps(o) + "\n" for o in self.ops))
        else:  # never written, or emptied (maybe before its count was reset): all landed
            _write_text(self._path(_APPLIED), "0")
        self.applied = int(_read(self._path(_APPLIED)) or 0)
        self.run_ids: dict[str, str] = json.loads(_read(self._path(_RUNS)) or "{}")

    def _path(self, *parts: str) -> str:
        return os.path.join(self.folder, *parts)

    @property
    def pending(self) -> int:
        return len(self.ops) - self.applied

    def append(self, op: dict[str, Any]) -> None:
        """Keep ``op`` (its files copied in) at the end of the log, on disk when this returns."""
        stored = self._stored(op)
        with open(self._path(_OPS), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(stored) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.ops.append(stored)

    def _stored(self, op: dict[str, Any]) -> dict[str, Any]:
        """``op`` as it is kept: its files copied, its times fixed now, its model pickled."""
        kind, now = op["op"], int(1000 * time.time())
        if kind == "create_run" and op.get("start_time") is None:
            return {**op, "start_time": now}
        if kind == "set_terminated" and op.get("end_time") is None:
            return {**op, "end_time": now}
        if kind == "log_artifact":
            return {**op, "path": self._copy(op["path"])}
        if kind == "log_pyfunc":
            import cloudpickle

            options = dict(op["options"])
            artifacts = {k: self._copy(v) for k, v in options.pop("artifacts", {}).items()}
            model = self._copy(None, cloudpickle.dumps((op["python_model"], options)))
            return {
                "op": kind,
                "run": op["run"],
                "name": op["name"],
                "model": model,
                "artifacts": artifacts,
            }
        return op

    def _copy(self, path: str | None, data: bytes = b"") -> str:
        """A copy of file or folder ``path`` (or ``data``, as a file) under ``files/``, synced;
        its path relative to the spool."""
        name = os.path.join(_FILES, uuid.uuid4().hex, os.path.basename(path) if path else "model")
        target = self._path(name)
        os.makedirs(os.path.dirname(target))
        if path is None:
            with open(target, "wb") as fh:
                fh.write(data)
        elif os.path.isdir(path):
            shutil.copytree(path, target)
        else:
            shutil.copyfile(path, target)
        for root, _, files in os.walk(target) if os.path.isdir(target) else [("", [], [target])]:
            for file in files:
                with open(os.path.join(root, file), "rb") as fh:
                    os.fsync(fh.fileno())
        return name

    def head(self) -> dict[str, Any]:
        """The first waiting write, ready to apply (its files' paths, its model unpickled)."""
        op = {**self.ops[self.applied], "spooled": True}
        if op["op"] == "log_artifact":
            op["path"] = self._path(op["path"])
        elif op["op"] == "log_pyfunc":
            import cloudpickle

            with open(self._path(op.pop("model")), "rb") as fh:
                op["python_model"], op["options"] = cloudpickle.load(fh)
            op["options"]["artifacts"] = {k: self._path(v) for k, v in op.pop("artifacts").items()}
        return op

    def advance(self) -> None:
        """The first waiting write landed (or was refused): count it."""
        self.applied += 1
        _write_text(self._path(_APPLIED), str(self.applied))

    def bind(self, ids: dict[str, str]) -> None:
        if any(self.run_ids.get(k) != v for k, v in ids.items()):
            self.run_ids.update(ids)
            _write_json(self._path(_RUNS), self.run_ids)

    def reject(self, exc: BaseException) -> None:
        with open(self._path(REJECTED), "a", encoding="utf-8") as fh:
            fh.write(json.dumps({**self.ops[self.applied], "error": one_line(exc)}) + "\n")

    def compact(self) -> None:
        """Everything landed: empty the log and drop the copies (the key map stays)."""
        if self.ops and not self.pending:
            os.replace(self._path(_OPS), self._path(_OPS + ".done"))
            _write_text(self._path(_APPLIED), "0")
            os.remove(self._path(_OPS + ".done"))
            shutil.rmtree(self._path(_FILES), ignore_errors=True)
            self.ops, self.applied = [], 0

    def close(self) -> None:
        self._lock.close()  # releases the lock


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return ""


_write_text = storage.write_text


def _write_json(path: str, payload: Any) -> None:
    _write_text(path, json.dumps(payload, indent=1))
