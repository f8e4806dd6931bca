"""The console and the log file: what a person running the pipeline sees.

By default the console shows this project's own messages (loggers ``asymvlm`` and
``pipelines``) at INFO, one line each, and its warnings; everything else -- Ray, Tune, Train,
Ray Data, MLflow, Python warnings -- goes at WARNING and above into a log file (under the
output when it is local). ``verbose`` shows everything, on the console too, at INFO.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

__all__ = ["configure", "log_file_for", "quiet_third_party"]

OURS = ("asymvlm", "pipelines")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_state = {"verbose": False}


class _Console(logging.Formatter):
    """``message`` for INFO, ``warning: message`` / ``error: message`` above."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        return text


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (test capture, redirection)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        """Above a progress bar when one is showing (tqdm), else a plain line."""
        bars = sys.modules.get("tqdm")
        if bars is not None and getattr(bars.tqdm, "_instances", None):
            try:
                bars.tqdm.write(self.format(record), file=sys.stderr)
                return
            except Exception:  # fall back to a plain line
                pass
        super().emit(record)


class _Ours(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".")[0] in OURS


def log_file_for(output: str | None, name: str) -> str:
    """``<output>/logs/<name>.log`` for a local output, else one in the temp folder."""
    if output and "://" not in output:
        folder = os.path.join(os.path.abspath(output), "logs")
    else:
        import tempfile

        folder = os.path.join(tempfile.gettempdir(), "asymvlm-logs")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{name}.log")


def configure(verbose: bool = False, log_file: str | None = None) -> None:
    """Console and file handlers on the root logger (idempotent: a second call replaces them)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_asymvlm", False):
            root.removeHandler(handler)
            handler.close()
    console = _CurrentStderr()
    console._asymvlm = True  # type: ignore[attr-defined]
    if verbose:
        console.setFormatter(logging.Formatter(_FORMAT))
        console.setLevel(logging.INFO)
    else:
        console.setFormatter(_Console())
        console.addFilter(_Ours())
    root.addHandler(console)
    if log_file:
        to_file = logging.FileHandler(log_file)
        to_file._asymvlm = True  # type: ignore[attr-defined]
        to_file.setFormatter(logging.Formatter(_FORMAT))
        to_file.setLevel(logging.INFO if verbose else logging.WARNING)
        root.addHandler(to_file)
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
    """Ray's and MLflow's loggers bring their own console handlers: send their records to ours
    (the file, or everything when verbose) instead. Call again after ``ray.init``."""
    level = logging.INFO if _state["verbose"] else logging.WARNING
    for name in (
        "ray",
        "ray.data",
        "ray.tune",
        "ray.train",
        "ray.serve",
        "mlflow",
        "alembic",
        "urllib3",
        "filelock",
        "py.warnings",
    ):
        lg = logging.getLogger(name)
        for handler in list(lg.handlers):
            lg.removeHandler(handler)
        lg.propagate = True
        lg.setLevel(level)


@contextlib.contextmanager
def quiet_transformers():
    """transformers at ERROR and without its progress bars (weight loading, shards) for the
    block, unless ``--verbose``; restored after it."""
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
