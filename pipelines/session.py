"""Ray's lifecycle, owned by the entry points (:class:`RaySession`); the rest checks for it."""

from __future__ import annotations

import logging
import os
from typing import Any

CREDENTIAL_VARIABLES = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"}
)


def keep_credentials_on_nodes() -> None:
    """Off Tune's list of variables copied into every trial actor's runtime_env (and Ray's logs):
    AWS credentials, and its default variable (a runtime_env forbids prestarted workers)."""
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE = (
        frozenset(class_cache.ENV_VARS_TO_PROPAGATE) - CREDENTIAL_VARIABLES
    )
    class_cache.DEFAULT_ENV_VARS = {}


def require_ray(what: str) -> None:
    """A :class:`RuntimeError` unless Ray is running (an entry point's :class:`RaySession`)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError(f"{what} needs a running Ray (pipelines.session.RaySession)")


class RaySession:
    """Ray for one entry point: joined (``$RAY_ADDRESS``) or started on first :meth:`require`
    (or at once with ``eager``), shut down at the end if this session started it; ``init``:
    more arguments of ``ray.init`` (a config's ``ray`` section, e.g. its runtime_env)."""

    def __init__(self, *, eager: bool = False, init: dict[str, Any] | None = None) -> None:
        self.started, self._eager, self._init = False, eager, init or {}

    def __enter__(self) -> RaySession:
        if self._eager:
            self.require()
        return self

    def require(self) -> None:
        self.started |= _init_ray(self._init)

    def __exit__(self, *exc: object) -> None:
        import ray

        if self.started:
            ray.shutdown()
        self.started = False


def _init_ray(init: dict[str, Any]) -> bool:
    """Join or start Ray with ``init``, quiet unless ``--verbose``; True when this call did."""
    import ray
    from ray.data import DataContext

    from asymvlm import logs

    keep_credentials_on_nodes()
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if ray.is_initialized():
        return False
    verbose = logs.verbose()
    level = logging.INFO if verbose else logging.WARNING
    address = os.environ.get("RAY_ADDRESS")
    quiet = {"include_dashboard": False, "log_to_driver": verbose, "logging_level": level}
    ray.init(address=address, **quiet, **init)
    logs.quiet_third_party()
    DataContext.get_current().enable_progress_bars = verbose
    return True
