"""Where runs go: the tracking URI (default a SQLite store ``<output>/mlflow.db``, artifacts in
``<output>/mlartifacts``), the experiment, and a local store that was moved."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache

logger = logging.getLogger(__name__)

ARTIFACTS_DIR = "mlartifacts"
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
#: Tables and columns of MLflow's SQL schema that hold artifact locations.
_LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def default_tracking_uri(output: str) -> str:
    """A local SQLite store beside the outputs (MLflow >= 3.13 refuses a bare ./mlruns)."""
    return "sqlite:///" + os.path.join(os.path.abspath(output), "mlflow.db")


def _empty_store() -> str | None:
    """An empty SQLite store of this MLflow (its schema, no rows), made once in the cache folder
    (``$ASYMVLM_CACHE``, else ``~/.cache/asymvlm``); None when it cannot be made there."""
    import mlflow
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    folder = os.path.expanduser(os.environ.get("ASYMVLM_CACHE") or "~/.cache/asymvlm")
    path = os.path.join(folder, f"mlflow-{mlflow.__version__}-empty.db")
    if os.path.isfile(path):
        return path
    part = f"{path}.{os.getpid()}.part"
    try:
        os.makedirs(folder, exist_ok=True)
        engine = sqlalchemy.create_engine(f"sqlite:///{part}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(part, path)
    except Exception as exc:  # a read-only home, another MLflow: MLflow makes the store itself
        logger.debug("no empty MLflow store in %s: %s", folder, exc)
        return None
    finally:
        if os.path.exists(part):
            os.remove(part)
    return path


def seed_new_store(tracking_uri: str) -> None:
    """A SQLite store not there yet starts as a copy of :func:`_empty_store`: MLflow's schema
    migrations take ~5 s of a sweep's start (MLflow adds its default experiment as usual)."""
    database = os.path.abspath(tracking_uri.removeprefix("sqlite:///"))
    if not tracking_uri.startswith("sqlite:///") or os.path.exists(database):
        return
    if not os.path.isdir(os.path.dirname(database)) or not (empty := _empty_store()):
        return  # MLflow says what is wrong with the place
    part = f"{database}.{os.getpid()}.part"
    with suppress(OSError):
        shutil.copyfile(empty, part)
        os.link(part, database)  # unless another process made it meanwhile
    if os.path.exists(part):
        os.remove(part)


def _artifacts_beside(tracking_uri: str) -> str | None:
    """``file://<folder of the SQLite database>/mlartifacts``; None for other stores."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = os.path.abspath(tracking_uri.removeprefix("sqlite:///"))
    return "file://" + os.path.join(os.path.dirname(database), ARTIFACTS_DIR)


def experiment_id(client, name: str, tracking_uri: str) -> str:
    """The id of experiment ``name``, created (artifacts beside a SQLite store) if missing."""
    relocate_once(tracking_uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return client.create_experiment(name, artifact_location=_artifacts_beside(tracking_uri))


def relocate_local_store(tracking_uri: str) -> int:
    """Point a moved SQLite store (MLflow records absolute ``file://`` locations) at the
    ``mlartifacts`` folder beside it, unless the artifacts are still only at the old place;
    the number of locations rewritten."""
    here, database = _artifacts_beside(tracking_uri), tracking_uri.removeprefix("sqlite:///")
    if here is None or not os.path.isfile(database):
        return 0
    moved, mark = 0, f"/{ARTIFACTS_DIR}"
    with sqlite3.connect(database) as db:
        try:
            found = db.execute("SELECT artifact_location FROM experiments").fetchall()
        except sqlite3.OperationalError:  # not an MLflow store yet
            return 0
        roots = {
            loc[: loc.rindex(mark) + len(mark)]
            for (loc,) in found
            if loc and loc.startswith("file://") and mark in loc
        }
        for old in roots - {here}:
            if os.path.isdir(old.removeprefix("file://")) and not os.path.isdir(here[7:]):
                continue
            for table, column in _LOCATION_COLUMNS:
                moved += db.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                    f"WHERE substr({column}, 1, ?) = ?",
                    (here, len(old) + 1, len(old), old),
                ).rowcount
    if moved:
        logger.info("MLflow store %s moved: artifact locations now under %s", database, here)
    return moved


#: :func:`relocate_local_store`, once per store and process.
relocate_once = cache(relocate_local_store)


@cache
def git_commit() -> str:
    """The commit of the checkout holding this package, or "unknown"."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


@contextmanager
def global_tracking_uri(tracking_uri: str | None) -> Iterator[None]:
    """MLflow's global tracking URI for the block (None: unchanged), for ``runs:/`` URIs; after
    it, the one set before (MLflow mirrors it in ``$MLFLOW_TRACKING_URI``) or none."""
    import mlflow

    if not tracking_uri:
        yield
        return
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
