"""Starting or joining Ray for the pipelines, with credentials kept on the nodes.

Ray Tune copies the driver's ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN`` and ``AWS_SECURITY_TOKEN`` into the ``runtime_env`` of every trial actor
(``ray.tune.execution.class_cache``), and Ray's runtime-env agent writes runtime_envs into its
log; the dashboard shows them too. Credentials belong to the nodes' own environment (instance
roles, Kubernetes secrets; a local ``ray.init()`` hands the driver's environment to its workers
anyway), so :func:`keep_credentials_on_nodes` removes those names from Tune's propagation list
before any trial starts. Tested in ``tests/test_credentials.py`` (which fails if a Ray upgrade
moves the list).

Trials start in Ray's prestarted workers: Tune gives every trainable actor a ``runtime_env``
(its ``DEFAULT_ENV_VARS``, ``PL_DISABLE_FORK`` for PyTorch Lightning, which this project does
not use, plus the propagated variables), and an actor with a non-empty ``runtime_env`` cannot
take a prestarted worker: Ray starts a new process for it. :func:`keep_credentials_on_nodes`
therefore also empties ``DEFAULT_ENV_VARS``; and a local Ray started by :func:`init_ray`
preloads the modules a trial imports (torch, the training protocol, scipy.stats) into its
prestarted workers (``RAY_preload_python_modules``; where the machine's memory allows it), so
that the first epoch of the first trials does not wait for ~2.5 s of imports per process
(benchmarks/sweep_overhead.py).
"""

from __future__ import annotations

import logging
import os

CREDENTIAL_VARIABLES = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"}
)


#: What a trial process imports before its first epoch (torch's optimisers import
#: torch._dynamo; the metrics scipy.stats): preloaded into the prestarted workers of a local Ray.
TRIAL_MODULES = ("torch", "torch._dynamo", "scipy.stats", "asymvlm.training", "pipelines.trials")
PRELOAD_BYTES_PER_WORKER = 260 * 1024**2  # measured: private memory of TRIAL_MODULES, CPU torch


def keep_credentials_on_nodes() -> None:
    """Stop Ray Tune from copying the driver's AWS credentials into trial runtime_envs, and
    from giving trial actors a runtime_env of its own (``PL_DISABLE_FORK``), so that trials can
    start in Ray's prestarted workers (module docstring)."""
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE = (
        frozenset(class_cache.ENV_VARS_TO_PROPAGATE) - CREDENTIAL_VARIABLES
    )
    class_cache.DEFAULT_ENV_VARS = {}


def _preload_trial_modules() -> None:
    """Set ``RAY_preload_python_modules`` (unless set: "" turns it off) for a local Ray whose
    prestarted workers -- one per CPU -- can afford them: a worker with :data:`TRIAL_MODULES`
    imported holds ~250 MB more private memory than an idle one, so preloading is left out where
    that would take more than 1/16 of the machine's memory (many cores, little memory)."""
    import importlib.util

    cpus = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if cpus * PRELOAD_BYTES_PER_WORKER > memory / 16:
        return
    found = [m for m in TRIAL_MODULES if importlib.util.find_spec(m) is not None]
    os.environ.setdefault("RAY_preload_python_modules", ",".join(found))


def init_ray() -> bool:
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
    if not os.environ.get("RAY_ADDRESS"):  # a local Ray: its workers start with these imported
        _preload_trial_modules()
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
