"""MLflow tracking: the only package that talks to MLflow.

* :mod:`~asymvlm.tracking.store` -- the tracking URI (a SQLite store beside the outputs by
  default), experiments, a local store that survives being moved;
* :mod:`~asymvlm.tracking.runs` -- :func:`run` / :func:`open_run`: a run with its name, kind,
  parent and MLflow's standard tags; metrics (step = epoch), params, artifacts, status;
* :mod:`~asymvlm.tracking.model` -- the adapter as an MLflow pyfunc model and adapters loaded
  back from a sweep;
* :mod:`~asymvlm.tracking.queries` -- reading runs and their JSON artifacts back.

The story in the UI: the pipeline run is the root; its sweeps, their trials (live: per-epoch
metrics as they happen), its evaluations (metrics + ``results.json``) and its report (markdown and
HTML with inline figures) are nested under it. A sweep run on its own is its own root.
Result tables (mean ± std over seeds) are plain Python in :mod:`asymvlm.results`.
"""

from asymvlm.tracking.model import (
    CaptionUncertaintyModel,
    load_sweep_adapters,
    log_uncertainty_model,
)
from asymvlm.tracking.queries import child_runs, experiment_runs, json_artifact
from asymvlm.tracking.runs import Run, ended, open_run, run, source_name, standard_tags
from asymvlm.tracking.store import (
    default_artifact_location,
    default_tracking_uri,
    experiment_id,
    git_commit,
    relocate_local_store,
)

__all__ = [
    "CaptionUncertaintyModel",
    "Run",
    "child_runs",
    "default_artifact_location",
    "default_tracking_uri",
    "ended",
    "experiment_id",
    "experiment_runs",
    "git_commit",
    "json_artifact",
    "load_sweep_adapters",
    "log_uncertainty_model",
    "open_run",
    "relocate_local_store",
    "run",
    "source_name",
    "standard_tags",
]
