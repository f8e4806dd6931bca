"""Reading runs back: a sweep's trials, an experiment's runs, a run's artifacts and models."""

from __future__ import annotations

import json
from typing import Any

from asymvlm.tracking.store import global_tracking_uri, relocate_once

__all__ = ["child_runs", "download", "experiment_runs", "json_artifact", "last_step", "model_run"]


def child_runs(
    tracking_uri: str, parent_run_id: str, *, stage: str | None = None, status: str = "FINISHED"
) -> list[Any]:
    """The runs nested under ``parent_run_id`` (a sweep's trials; ``stage`` "grid", or "seeds":
    those tagged ``seed_stage``, the grid trial at the chosen lr included, else those tagged
    ``stage: seeds``), with ``status`` (FINISHED by default)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    base = f"tags.mlflow.parentRunId = '{parent_run_id}'"
    if status:
        base += f" and attributes.status = '{status}'"

    def search(extra: str) -> list[Any]:
        return client.search_runs([parent.info.experiment_id], base + extra, max_results=10000)

    if stage == "seeds":
        return search(" and tags.seed_stage = 'true'") or search(" and tags.stage = 'seeds'")
    return search(f" and tags.stage = '{stage}'" if stage else "")


def last_step(tracking_uri: str, run_id: str, key: str) -> int:
    """The largest step at which run ``run_id`` has metric ``key`` (0: none)."""
    from mlflow import MlflowClient

    history = MlflowClient(tracking_uri).get_metric_history(run_id, key)
    return max((int(m.step) for m in history), default=0)


def experiment_runs(tracking_uri: str, experiment: str) -> tuple[str, list[Any]]:
    """(experiment id, its runs, oldest first); ValueError if there is no such experiment."""
    from mlflow import MlflowClient

    from asymvlm.config import redact

    relocate_once(tracking_uri)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"no MLflow experiment {experiment!r} at {redact(tracking_uri)}")
    runs = client.search_runs([exp.experiment_id], max_results=10000)
    return exp.experiment_id, sorted(runs, key=lambda r: r.info.start_time)


def json_artifact(tracking_uri: str, run_id: str, path: str) -> Any:
    """A run's JSON artifact, parsed."""
    from mlflow.artifacts import download_artifacts

    local = download_artifacts(run_id=run_id, artifact_path=path, tracking_uri=tracking_uri)
    with open(local) as fh:
        return json.load(fh)


def download(uri: str, tracking_uri: str | None = None) -> str:
    """A local copy of the artifacts or model at ``uri`` (``runs:/<run>/<path>``,
    ``models:/<name>/<version>``, ``mlflow-artifacts:/...``), resolved through the store
    ``tracking_uri`` (default: ``$MLFLOW_TRACKING_URI``); returns its local path."""
    import mlflow

    if tracking_uri:
        relocate_once(tracking_uri)
    with global_tracking_uri(tracking_uri or None):  # runs:/ URIs resolve through it
        return mlflow.artifacts.download_artifacts(artifact_uri=uri)


def model_run(uri: str, tracking_uri: str | None = None) -> dict[str, Any] | None:
    """The run that logged the model ``uri`` (``runs:/<run>/<path>``, ``models:/<name>/<version>``
    or ``models:/<name>@<alias>``): ``{"run_id", "run_name", "experiment", "metrics",
    "params"}`` with the run's latest metric values; None for other URIs."""
    from mlflow import MlflowClient

    from asymvlm.config import redact

    if tracking_uri:
        relocate_once(tracking_uri)
    with global_tracking_uri(tracking_uri or None):
        client = MlflowClient(tracking_uri or None)
        if uri.startswith("runs:/"):
            run_id = uri.removeprefix("runs:/").split("/", 1)[0]
        elif uri.startswith("models:/"):
            name, at, alias = uri.removeprefix("models:/").partition("@")
            if at:
                version = client.get_model_version_by_alias(name, alias)
            else:
                name, _, number = name.partition("/")
                version = client.get_model_version(name, number.split("/")[0])
            run_id = version.run_id
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
