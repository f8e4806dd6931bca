"""The optional parts of the install: which extra (``pip install 'asymvlm[EXTRA]'``) provides
each optional module, and the line that says which to install; a leaf like :mod:`asymvlm.errors`."""

from __future__ import annotations

import importlib.util

#: The extra (``pip install 'asymvlm[EXTRA]'``) that provides each optional top-level module.
EXTRAS = {
    "ray": "ray",
    "fastapi": "ray",
    "mlflow": "tracking",
    "matplotlib": "report",
    "tabulate": "report",
    "markdown_it": "report",
    "transformers": "embed",
    "open_clip": "embed",
    "PIL": "embed",
    "s3fs": "s3",
    "eccv_caption": "eccv",
}


def missing_extra(exc: BaseException) -> str | None:
    """The extra to install, when ``exc`` (or its cause) is an optional module's ImportError."""
    cause: BaseException | None = exc
    while cause is not None:
        module = (getattr(cause, "name", None) or "").split(".")[0]
        if isinstance(cause, ImportError) and module in EXTRAS:
            return f"{module} is not installed: pip install 'asymvlm[{EXTRAS[module]}]'"
        cause = cause.__cause__
    return None


def check_extras(*extras: str) -> None:
    """Raise the ImportError of the first module of ``extras`` that is not installed."""
    for module, extra in EXTRAS.items():
        if extra in extras and importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
