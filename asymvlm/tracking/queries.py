"""Reading runs back (a sweep's trials, an experiment's runs, artifacts, models), and MLflow's
model API as the served models use it (:mod:`asymvlm.scoring.models`)."""

from __future__ import annotations

import json
import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from asymvlm.config import redact
from asymvlm.errors import ConfigError
from asymvlm.tracking.store import global_tracking_uri, relocate_once

#: The URIs read through a tracking store (an ``s3://`` or ``gs://`` URI is read directly).
STORE_URIS = ("runs:/", "models:/", "mlflow-artifacts:/")


def _reading(tracking_uri: str | None) -> None:
    """Refuse a SQLite store that is not there (MLflow would create an empty one to read)."""
    if (tracking_uri or "").startswith("sqlite:///") and not os.path.isfile(tracking_uri[10:]):
        raise ConfigError(f"no MLflow store at {tracking_uri} (no such file)")
    if tracking_uri:
        relocate_once(tracking_uri)


def _client(tracking_uri: str | None) -> Any:
    from mlflow import MlflowClient

    _reading(tracking_uri)
    return MlflowClient(tracking_uri or None)


def child_runs(
    tracking_uri: str, parent_run_id: str, *, stage: str | None = None, status: str = "FINISHED"
) -> list[Any]:
    """The runs nested under ``parent_run_id`` with ``status`` ("": any); ``stage`` "grid", or
    "seeds" (tagged ``seed_stage``, else ``stage: seeds``)."""
    client = _client(tracking_uri)
    experiment = client.get_run(parent_run_id).info.experiment_id
    base = f"tags.mlflow.parentRunId = '{parent_run_id}'"
    base += f" and attributes.status = '{status}'" if status else ""

    def search(extra: str) -> list[Any]:
        return client.search_runs([experiment], base + extra, max_results=10000)

    if stage == "seeds":
        return search(" and tags.seed_stage = 'true'") or search(" and tags.stage = 'seeds'")
    return search(f" and tags.stage = '{stage}'" if stage else "")


def last_step(tracking_uri: str, run_id: str, key: str) -> int:
    """The largest step at which run ``run_id`` has metric ``key`` (0: none)."""
    history = _client(tracking_uri).get_metric_history(run_id, key)
    return max((int(m.step) for m in history), default=0)


def experiment_runs(tracking_uri: str, experiment: str) -> tuple[str, list[Any]]:
    """(experiment id, its runs, oldest first); ConfigError if there is no such experiment."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ConfigError(f"no MLflow experiment {experiment!r} at {redact(tracking_uri)}")
    runs = client.search_runs([exp.experiment_id], max_results=10000)
    return exp.experiment_id, sorted(runs, key=lambda r: r.info.start_time)


def json_artifact(tracking_uri: str, run_id: str, path: str) -> Any:
    """A run's JSON artifact, parsed."""
    from mlflow.artifacts import download_artifacts

    local = download_artifacts(run_id=run_id, artifact_path=path, tracking_uri=tracking_uri)
    with open(local) as fh:
        return json.load(fh)


def download(uri: str, tracking_uri: str | None = None) -> str:
    """The path of a local copy of ``uri`` (``runs:/``, ``models:/``, ``mlflow-artifacts:/``),
    read through the store ``tracking_uri`` (default ``$MLFLOW_TRACKING_URI``)."""
    import mlflow

    if uri.startswith(STORE_URIS):
        _reading(tracking_uri)
    with global_tracking_uri(tracking_uri):
        return mlflow.artifacts.download_artifacts(artifact_uri=uri)


def model_run(uri: str, tracking_uri: str | None = None) -> dict[str, Any] | None:
    """The run that logged the model ``uri`` (``runs:/<run>/<path>``, ``models:/<name>/<version>``
    or ``models:/<name>@<alias>``) with its latest metrics and params; None for other URIs."""
    client = _client(tracking_uri)
    with global_tracking_uri(tracking_uri):  # the model registry follows it
        if uri.startswith("runs:/"):
            run_id = uri.removeprefix("runs:/").split("/", 1)[0]
        elif uri.startswith("models:/"):
            name, at, alias = uri.removeprefix("models:/").partition("@")
            name, _, number = name.partition("/")
            found = client.get_model_version_by_alias(name, alias) if at else None
            run_id = (found or client.get_model_version(name, number.split("/")[0])).run_id
        else:
            return None
        run = client.get_run(run_id)
        experiment = client.get_experiment(run.info.experiment_id)
    return {
        "run_id": run_id,
        "run_name": run.info.run_name,
        "experiment": experiment.name if experiment else None,
        "tracking_uri": redact(tracking_uri) if tracking_uri else None,
        "metrics": dict(run.data.metrics),
        "params": dict(run.data.params),
    }


def invalid_input(message: str) -> Exception:
    """The error a served model raises for bad input (MLflow's server answers HTTP 400)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def signature(example_input: Any, example_output: Any) -> Any:
    """The model signature of an input and an output example (pandas DataFrames)."""
    from mlflow.models import infer_signature

    return infer_signature(example_input, example_output)


def pinned_requirements(*packages: str) -> list[str]:
    """``package==version`` of each installed package (unpinned when not installed)."""
    out = []
    for package in packages:
        try:
            out.append(f"{package}=={version(package).split('+')[0]}")
        except PackageNotFoundError:
            out.append(package)
    return out
