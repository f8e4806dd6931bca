"""Ray's lifecycle, owned by the entry points: :class:`RaySession` starts or joins Ray, the
Ray wiring below it only checks that Ray is there (:func:`require_ray`).

An entry point (``pipelines/*.py``, ``asymvlm embed``) opens one :class:`RaySession` and hands
it to what needs Ray; Ray starts (or joins ``$RAY_ADDRESS``) when the session is first used --
so a stage with nothing to do starts nothing -- and is shut down at the end of the session if
the session started it. Library functions take a running cluster.

Credentials stay on the nodes.

Ray Tune copies the driver's ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN`` and ``AWS_SECURITY_TOKEN`` into the ``runtime_env`` of every trial actor
(``ray.tune.execution.class_cache``), and Ray's runtime-env agent writes runtime_envs into its
log; the dashboard shows them too. Credentials belong to the nodes' own environment (instance
roles, Kubernetes secrets; a local ``ray.init()`` hands the driver's environment to its workers
anyway), so :func:`keep_credentials_on_nodes` removes those names from Tune's propagation list
before any trial starts. Tested in ``tests/test_credentials.py`` (which fails if a Ray upgrade
moves the list).

MLflow may stumble. :func:`tracking_spool` gives the entry point's process a spool folder
(:func:`asymvlm.tracking.use_spool`): the driver writes every MLflow record (the sweep's and
trials' runs, evaluations, the report), and while the tracking server cannot be reached its
writes wait there, in order, and the job goes on; at the end they are drained, and any still
waiting are named with the command that replays them.

Trials start in Ray's prestarted workers: Tune gives every trainable actor a ``runtime_env``
(its ``DEFAULT_ENV_VARS``, ``PL_DISABLE_FORK`` for PyTorch Lightning, which this project does
not use, plus the propagated variables), and an actor with a non-empty ``runtime_env`` cannot
take a prestarted worker: Ray starts a new process for it. :func:`keep_credentials_on_nodes`
therefore also empties ``DEFAULT_ENV_VARS`` (benchmarks/sweep_overhead.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("pipelines")

CREDENTIAL_VARIABLES = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"}
)


def keep_credentials_on_nodes() -> None:
    """Stop Ray Tune from copying the driver's AWS credentials into trial runtime_envs, and
    from giving trial actors a runtime_env of its own (``PL_DISABLE_FORK``), so that trials can
    start in Ray's prestarted workers (module docstring)."""
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE = (
        frozenset(class_cache.ENV_VARS_TO_PROPAGATE) - CREDENTIAL_VARIABLES
    )
    class_cache.DEFAULT_ENV_VARS = {}


#: How long the end of a job waits for MLflow to take a write that waits in its spool.
DRAIN_S = 60.0


def spool_folder(output: str) -> str:
    """Where the driver's MLflow writes wait while the store is away: ``<output>/mlflow-spool``
    for a local output; for an object-store output a folder on the driver's node,
    ``$ASYMVLM_SPOOL_DIR`` or ``~/.cache/asymvlm/mlflow-spool/<hash of the output URI>``."""
    from asymvlm import storage

    if not storage.is_remote(output):
        return os.path.join(os.path.abspath(output), "mlflow-spool")
    root = os.environ.get("ASYMVLM_SPOOL_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "asymvlm", "mlflow-spool"
    )
    return os.path.join(root, hashlib.sha256(output.encode()).hexdigest()[:16])


@contextmanager
def tracking_spool(output: str, drain_s: float = DRAIN_S) -> Iterator[str]:
    """The MLflow writes of this process wait in :func:`spool_folder` while their store is
    unreachable; at the end they are sent, for as long as they land and for ``drain_s`` seconds
    once none does, and those still waiting are named in one line with the command that
    replays them."""
    from asymvlm import tracking

    folder = spool_folder(output)
    tracking.use_spool(folder)
    try:
        yield folder
    finally:
        if tracking.pending():
            logger.info(
                "MLflow: %d write(s) waited in %s; sending them (giving up after %.0f "
                "s without one landing)",
                tracking.pending(),
                folder,
                drain_s,
            )
            tracking.drain(drain_s)
        tracking.use_spool(None)  # what still waits is named, with the command that replays it


def ship_by_value(module: str) -> None:
    """Send the functions and classes of ``module`` to Ray's workers by value, not by reference:
    workers may not have ``pipelines/`` on their path (a cluster started without
    ``--working-dir``), while the installed ``asymvlm`` they do have. Called by every module
    whose functions run in workers (trials, Train loops, Serve replicas)."""
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[module])


def require_ray(what: str) -> None:
    """A :class:`RuntimeError` unless Ray is running: the Ray wiring takes a running cluster
    (an entry point's :class:`RaySession`)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError(
            f"{what} needs a running Ray: start it at the entry point "
            "(pipelines.session.RaySession)"
        )


class RaySession:
    """Ray for one entry point: joined or started on first :meth:`require` (or at once with
    ``eager``), shut down when the ``with`` block ends if this session started it. A Ray that
    is already running (a test's, a notebook's) is used as it is and left running."""

    def __init__(self, *, eager: bool = False) -> None:
        self.started = False
        self._eager = eager

    def __enter__(self) -> RaySession:
        if self._eager:
            self.require()
        return self

    def require(self) -> None:
        """Ray, now: joined or started if it is not running yet."""
        self.started |= _init_ray()

    def __exit__(self, *exc: object) -> None:
        if self.started:  # an explicit shutdown is ~1 s faster than Ray's exit hooks
            import ray

            ray.shutdown()
            self.started = False


def _init_ray() -> bool:
    """Join the cluster at ``$RAY_ADDRESS`` (set by ``ray job submit``) or start a local Ray;
    True when this call started or joined it (False: already initialised).

    Quiet unless ``--verbose`` (:mod:`asymvlm.logs`): the workers' output is not streamed to
    the driver (each finished trial is one line from the driver instead), Ray's own logging goes
    to the log file at WARNING, Ray Data shows no progress bars and Tune writes no CSV/JSON/
    TensorBoard files of its own (MLflow has the story)."""
    import ray

    from asymvlm import logs

    keep_credentials_on_nodes()
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if ray.is_initialized():
        return False
    verbose = logs.verbose()
    ray.init(
        address=os.environ.get("RAY_ADDRESS"),
        include_dashboard=False,
        log_to_driver=verbose,
        logging_level=logging.INFO if verbose else logging.WARNING,
    )
    logs.quiet_third_party()
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = verbose
    return True
