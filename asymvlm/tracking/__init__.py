"""MLflow tracking, the only package that talks to MLflow: where runs go (:mod:`.store`), runs
(:mod:`.runs`), writes that wait while the store is away (:mod:`.writer`), reads (:mod:`.queries`).
The pipeline run is the root; its sweeps, trials, evaluations and report are nested under it."""

from asymvlm.tracking.queries import (
    child_runs,
    download,
    experiment_runs,
    invalid_input,
    json_artifact,
    last_step,
    model_run,
    pinned_requirements,
    signature,
)
from asymvlm.tracking.runs import Run, ended, open_run, resume_run, run
from asymvlm.tracking.store import (
    default_tracking_uri,
    git_commit,
    global_tracking_uri,
    relocate_local_store,
)
from asymvlm.tracking.writer import drain, outage_queue, pending

__all__ = [
    "Run",
    "child_runs",
    "default_tracking_uri",
    "download",
    "drain",
    "ended",
    "experiment_runs",
    "git_commit",
    "global_tracking_uri",
    "invalid_input",
    "json_artifact",
    "last_step",
    "model_run",
    "open_run",
    "outage_queue",
    "pending",
    "pinned_requirements",
    "relocate_local_store",
    "resume_run",
    "run",
    "signature",
]
