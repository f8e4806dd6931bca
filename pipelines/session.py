"""Ray's lifecycle, owned by the entry points: :class:`RaySession` starts or joins Ray on first
use; the Ray wiring below only checks that Ray is there (:func:`require_ray`). The MLflow spool
of an entry point's process: :func:`tracking_spool`."""

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
#: How long the end of a job waits for MLflow to take a write that waits in its spool.
DRAIN_S = 300.0


def keep_credentials_on_nodes() -> None:
    """Ray Tune copies the driver's AWS credentials into every trial actor's runtime_env (then
    into Ray's logs); Ray has no public switch, so they are taken off its list. Its default
    env var (``PL_DISABLE_FORK``) goes too: an actor with a runtime_env cannot take a
    prestarted worker (benchmarks/sweep_overhead.py)."""
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE = (
        frozenset(class_cache.ENV_VARS_TO_PROPAGATE) - CREDENTIAL_VARIABLES
    )
    class_cache.DEFAULT_ENV_VARS = {}


def spool_folder(output: str) -> str:
    """Where the driver's MLflow writes wait while the store is away: ``<output>/mlflow-spool``,
    or for an object-store output ``$ASYMVLM_SPOOL_DIR`` (default ``~/.cache/asymvlm/
    mlflow-spool``) ``/<hash of the output URI>``."""
    from asymvlm import storage

    if not storage.is_remote(output):
        return os.path.join(os.path.abspath(output), "mlflow-spool")
    root = os.environ.get("ASYMVLM_SPOOL_DIR") or os.path.expanduser(
        "~/.cache/asymvlm/mlflow-spool"
    )
    return os.path.join(root, hashlib.sha256(output.encode()).hexdigest()[:16])


@contextmanager
def tracking_spool(output: str, drain_s: float = DRAIN_S) -> Iterator[str]:
    """MLflow writes of this process wait in :func:`spool_folder` while their store is away;
    at the end they are sent (giving up after ``drain_s`` s without one landing)."""
    from asymvlm import tracking

    folder = spool_folder(output)
    tracking.use_spool(folder)
    try:
        yield folder
    finally:
        if tracking.pending():
            logger.info(
                "MLflow: %d write(s) waited in %s; sending them", tracking.pending(), folder
            )
            tracking.drain(drain_s)
        tracking.use_spool(None)  # what still waits is dropped, with a warning


def require_ray(what: str) -> None:
    """A :class:`RuntimeError` unless Ray is running (an entry point's :class:`RaySession`)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError(f"{what} needs a running Ray (pipelines.session.RaySession)")


class RaySession:
    """Ray for one entry point: joined (``$RAY_ADDRESS``) or started on first :meth:`require`
    (or at once with ``eager``), shut down at the end if this session started it."""

    def __init__(self, *, eager: bool = False) -> None:
        self.started = False
        self._eager = eager

    def __enter__(self) -> RaySession:
        if self._eager:
            self.require()
        return self

    def require(self) -> None:
        self.started |= _init_ray()

    def __exit__(self, *exc: object) -> None:
        if self.started:
            import ray

            ray.shutdown()
            self.started = False


def _init_ray() -> bool:
    """Join or start Ray, quiet unless ``--verbose``; True when this call did."""
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
