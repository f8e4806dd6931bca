"""One training run (App. B.4) without Ray: :func:`train_and_evaluate` (K at once:
:func:`train_and_evaluate_packed`) and the public API's :func:`train` into an output folder."""

from asymvlm.runner.packed import train_and_evaluate_packed
from asymvlm.runner.single import RunSpec, TrainingRun, train, train_and_evaluate

__all__ = ["RunSpec", "TrainingRun", "train", "train_and_evaluate", "train_and_evaluate_packed"]
