"""The console and the log file: this project's messages (loggers ``asymvlm``, ``asymvlm_ray``,
``pipelines``) at INFO on the console, one line each; every other library's (Ray, MLflow,
warnings) at WARNING and above into a log file; ``verbose``: everything, on the console too."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings

OURS = ("asymvlm", "asymvlm_ray", "pipelines")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_THIRD_PARTY = (
    "ray ray.data ray.tune ray.train ray.serve mlflow alembic urllib3 filelock py.warnings"
).split()
_state = {"verbose": False}


class _Brief(logging.Formatter):
    """``message``; ``warning: message`` from WARNING up."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        return f"{record.levelname.lower()}: {text}" if record.levelno >= logging.WARNING else text


class _Console(logging.StreamHandler):
    """To whatever ``sys.stderr`` is now (capture, redirection), above a progress bar (tqdm)."""

    stream = property(lambda self: sys.stderr, lambda self, value: None)  # type: ignore[assignment]

    def emit(self, record: logging.LogRecord) -> None:
        bars = getattr(sys.modules.get("tqdm"), "tqdm", None)
        with bars.external_write_mode(file=sys.stderr) if bars else contextlib.nullcontext():
            super().emit(record)


def log_file_for(output: str | None, name: str) -> str:
    """``<output>/logs/<name>.log`` for a local output, else one in the temp folder."""
    if output and "://" not in output:
        folder = os.path.join(os.path.abspath(output), "logs")
    else:
        folder = os.path.join(tempfile.gettempdir(), "asymvlm-logs")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{name}.log")


def configure(verbose: bool = False, log_file: str | None = None) -> None:
    """Console and file handlers on the root logger (a second call replaces them)."""
    # MLflow, imported later, would put its own console handler back on its loggers.
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_asymvlm", False)]:
        root.removeHandler(handler)
        handler.close()
    console = _Console()
    console.setFormatter(logging.Formatter(_FORMAT) if verbose else _Brief())
    if not verbose:
        console.addFilter(lambda record: record.name.split(".")[0] in OURS)
    handlers: list[logging.Handler] = [console]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
        handlers[-1].setFormatter(logging.Formatter(_FORMAT))
        handlers[-1].setLevel(logging.INFO if verbose else logging.WARNING)
    for handler in handlers:
        handler._asymvlm = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name in OURS:
        logging.getLogger(name).setLevel(logging.INFO)
    logging.captureWarnings(True)
    if not verbose:
        warnings.simplefilter("default")
    _state["verbose"] = verbose
    quiet_third_party()


def verbose() -> bool:
    return _state["verbose"]


def quiet_third_party() -> None:
    """Send Ray's and MLflow's records to our handlers instead of theirs (again after
    ``ray.init``; an MLflow imported after :func:`configure` adds none)."""
    for name in _THIRD_PARTY:
        lg = logging.getLogger(name)
        for handler in list(lg.handlers):
            lg.removeHandler(handler)
        lg.propagate = True
        lg.setLevel(logging.INFO if _state["verbose"] else logging.WARNING)


@contextlib.contextmanager
def quiet_transformers():
    """transformers at ERROR and without its progress bars for the block (unless verbose)."""
    from transformers.utils import logging as hf_logging

    if _state["verbose"]:
        yield
        return
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
