"""MLflow tracking: the only package that talks to MLflow.

* :mod:`~asymvlm.tracking.store` -- the tracking URI (a SQLite store beside the outputs by
  default), experiments, a local store that survives being moved;
* :mod:`~asymvlm.tracking.runs` -- :func:`run` / :func:`open_run`: a run with its name, kind,
  parent and MLflow's standard tags; metrics (step = epoch), params, artifacts, status;
  :func:`resume_run` reopens one;
* :mod:`~asymvlm.tracking.writer` -- every write in order, waiting while the store is
  unreachable (:func:`use_spool`, :func:`pending`, :func:`drain`);
* :mod:`~asymvlm.tracking.pyfunc` -- MLflow's model API (the served models themselves are
  :mod:`asymvlm.scoring.models`, logged with :meth:`Run.log_pyfunc`);
* :mod:`~asymvlm.tracking.queries` -- reading runs, their artifacts and models back.

The pipeline run is the root; its sweeps, their trials (per-epoch metrics, live), its
evaluations and its report are nested under it.
"""

from asymvlm.tracking.pyfunc import PythonModel, invalid_input, pinned_requirements, signature
from asymvlm.tracking.queries import (
    child_runs,
    download,
    experiment_runs,
    json_artifact,
    last_step,
    model_run,
)
from asymvlm.tracking.runs import (
    Run,
    ended,
    existing_run,
    open_run,
    resume_run,
    run,
    source_name,
    standard_tags,
)
from asymvlm.tracking.store import (
    default_artifact_location,
    default_tracking_uri,
    experiment_id,
    git_commit,
    global_tracking_uri,
    relocate_local_store,
)
from asymvlm.tracking.writer import drain, pending, use_spool

__all__ = [
    "PythonModel",
    "Run",
    "child_runs",
    "default_artifact_location",
    "default_tracking_uri",
    "download",
    "drain",
    "ended",
    "existing_run",
    "experiment_id",
    "experiment_runs",
    "git_commit",
    "global_tracking_uri",
    "invalid_input",
    "json_artifact",
    "last_step",
    "model_run",
    "open_run",
    "pending",
    "pinned_requirements",
    "relocate_local_store",
    "resume_run",
    "run",
    "signature",
    "source_name",
    "standard_tags",
    "use_spool",
]
