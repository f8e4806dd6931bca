"""MLflow's model API as the rest of the package uses it: the base of a served model, its bad
input, its signature and its requirements -- so that only this package imports MLflow.

The models themselves (an adapter with embeddings or captions in) are defined where the
scoring is (:mod:`asymvlm.scoring.models`) and logged with :meth:`asymvlm.tracking.Run.
log_pyfunc`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PythonModel", "invalid_input", "pinned_requirements", "signature"]

try:  # mlflow is a dependency, but keep `import asymvlm.tracking` cheap to fail clearly
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover
    PythonModel = object  # type: ignore[assignment,misc]


def invalid_input(message: str) -> Exception:
    """The error a served model raises for bad input: MLflow's scoring server answers it with
    HTTP 400 and ``message``."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def signature(example_input: Any, example_output: Any) -> Any:
    """The model signature of an input and an output example (pandas DataFrames)."""
    from mlflow.models import infer_signature

    return infer_signature(example_input, example_output)


def pinned_requirements(*packages: str) -> list[str]:
    """``package==version`` of each installed package (given, not inferred: inferring them
    costs a subprocess per model); a package that is not installed is named without a pin."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for package in packages:
        try:
            out.append(f"{package}=={version(package).split('+')[0]}")
        except PackageNotFoundError:
            out.append(package)
    return out
