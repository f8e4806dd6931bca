"""Ray's lifecycle, owned by the entry points (:class:`RaySession`); the rest checks for it."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from asymvlm.errors import ConfigError

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
        raise RuntimeError(f"{what} needs a running Ray (asymvlm_ray.session.RaySession)")


#: How long a named cluster's head may take to accept a connection (one that is starting up).
ANSWER_WAIT_S = 5.0


def cluster_address(configured: str | None = None) -> str:
    """The Ray an entry point runs on: the cluster of the config's ``ray.address`` or
    ``$RAY_ADDRESS`` once its head answers (else a :class:`ConfigError` saying what to do); without
    either ``"local"``: a new local Ray, not one an earlier cluster left in Ray's temp folder."""
    source = "ray.address" if configured else "RAY_ADDRESS"
    address = configured or os.environ.get("RAY_ADDRESS") or "local"
    if address in ("local", "auto"):  # auto: Ray's own search, asked for by name
        return address
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "ray"):
        raise ConfigError(
            f"{source}={address} is not a Ray head's address ({scheme}:// is the dashboard's, "
            "for `ray job submit`): give the head's HOST:PORT (port 6379 by default), submit "
            "this script with `ray job submit`, or unset it to run on a local Ray"
        )
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{source}={address}: expected HOST:PORT of a Ray cluster's head")
    deadline = time.monotonic() + ANSWER_WAIT_S
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            return address
        except OSError as exc:
            if time.monotonic() > deadline:
                reason = exc.strerror or type(exc).__name__
                raise ConfigError(
                    f"no Ray cluster answers at {address} ({source}: {reason}): start it "
                    f"(`ray start --head`), point {source} at a running head, or unset it to "
                    "run on a local Ray"
                ) from None
            time.sleep(1.0)


class RaySession:
    """Ray for one entry point: joined (:func:`cluster_address`) or started on first
    :meth:`require` (or at once with ``eager``), shut down at the end if this session started
    it; ``init``: more arguments of ``ray.init`` (a config's ``ray`` section)."""

    def __init__(self, *, eager: bool = False, init: dict[str, Any] | None = None) -> None:
        self.started = False
        self._eager = eager
        self._init = init or {}

    def __enter__(self) -> RaySession:
        if self._eager:
            self.require()
        return self

    def require(self) -> None:
        """Join or start Ray, quiet unless ``--verbose``."""
        import ray
        from ray.data import DataContext

        from asymvlm import logs

        keep_credentials_on_nodes()
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        if ray.is_initialized():
            return
        verbose = logs.verbose()
        level = logging.INFO if verbose else logging.WARNING
        init = dict(self._init)
        address = cluster_address(init.pop("address", None))
        quiet = {"include_dashboard": False, "log_to_driver": verbose, "logging_level": level}
        ray.init(address=address, **quiet, **init)
        self.started = True
        logs.quiet_third_party()
        DataContext.get_current().enable_progress_bars = verbose

    def __exit__(self, *exc: object) -> None:
        import ray

        if self.started:
            ray.shutdown()
        self.started = False
