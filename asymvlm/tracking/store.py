"""Where runs go: the tracking URI (default a SQLite store ``<output>/mlflow.db``, artifacts in
``<output>/mlartifacts``), the experiment, and a local store that can be moved
(:func:`relocate_local_store`: MLflow records absolute ``file://`` artifact locations)."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, lru_cache

logger = logging.getLogger(__name__)

__all__ = [
    "default_artifact_location",
    "default_tracking_uri",
    "experiment_id",
    "git_commit",
    "relocate_local_store",
]

ARTIFACTS_DIR = "mlartifacts"

# Artifact downloads inside reports and evaluations: no per-file progress bars.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def default_tracking_uri(output: str) -> str:
    """A local SQLite store beside the outputs (MLflow >= 3.13 refuses a bare ./mlruns)."""
    return "sqlite:///" + os.path.join(os.path.abspath(output), "mlflow.db")


def _database(tracking_uri: str) -> str | None:
    prefix = "sqlite:///"
    return tracking_uri.removeprefix(prefix) if tracking_uri.startswith(prefix) else None


def default_artifact_location(tracking_uri: str) -> str | None:
    """Artifacts of a local SQLite store go beside the database (``mlartifacts/``), not into
    ``./mlruns`` of whatever directory the run started in; servers choose their own (None)."""
    database = _database(tracking_uri)
    if database is None:
        return None
    return "file://" + os.path.join(os.path.dirname(os.path.abspath(database)), ARTIFACTS_DIR)


def experiment_id(client, name: str, tracking_uri: str) -> str:
    """The id of experiment ``name``, created (artifacts beside a SQLite store) if missing."""
    relocate_once(tracking_uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return client.create_experiment(name, artifact_location=default_artifact_location(tracking_uri))


# Tables and columns of MLflow's SQL schema that hold artifact locations.
_LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def relocate_local_store(tracking_uri: str) -> int:
    """Point a moved SQLite store at the ``mlartifacts`` folder beside it; returns the number of
    locations rewritten (0 when the store is where it was written, or not a local store).

    The old root is read from the recorded locations (``file://<old>/mlartifacts/...``); only
    locations under it are rewritten, and only when ``<old>/mlartifacts`` is gone or is not the
    folder beside the database.
    """
    database = _database(tracking_uri)
    if database is None or not os.path.isfile(database):
        return 0
    here = "file://" + os.path.join(os.path.dirname(os.path.abspath(database)), ARTIFACTS_DIR)
    with sqlite3.connect(database) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "experiments" not in tables:
            return 0
        roots = set()
        for (location,) in db.execute("SELECT artifact_location FROM experiments"):
            if location and location.startswith("file://") and f"/{ARTIFACTS_DIR}" in location:
                roots.add(location[: location.rindex(f"/{ARTIFACTS_DIR}") + len(ARTIFACTS_DIR) + 1])
        moved = 0
        for old in sorted(roots - {here}):
            if os.path.isdir(old.removeprefix("file://")) and not os.path.isdir(
                here.removeprefix("file://")
            ):
                continue  # the artifacts are still only at the old place: leave it
            for table, column in _LOCATION_COLUMNS:
                if table not in tables:
                    continue
                columns = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
                if column not in columns:
                    continue
                cur = db.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                    f"WHERE substr({column}, 1, ?) = ?",
                    (here, len(old) + 1, len(old), old),
                )
                moved += cur.rowcount
        if moved:
            logger.info("MLflow store %s moved: artifact locations now under %s", database, here)
    return moved


@cache
def relocate_once(tracking_uri: str) -> int:
    """:func:`relocate_local_store`, once per store and process (every run opened goes through
    :func:`experiment_id`; the store does not move under a running process)."""
    return relocate_local_store(tracking_uri)


@lru_cache(maxsize=8)
def git_commit(path: str | None = None) -> str:
    """The commit of the checkout holding ``path`` (this package by default), or "unknown"."""
    where = path or os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


@contextmanager
def global_tracking_uri(tracking_uri: str | None) -> Iterator[None]:
    """MLflow's global tracking URI set to ``tracking_uri`` for the block (None: unchanged),
    for the APIs that only read the global one (``mlflow.start_run``, ``runs:/`` URIs of
    logged models); restored after it."""
    import mlflow

    if tracking_uri is None:
        yield
        return
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
