"""One training run as the paper trains (App. B.4), without Ray: train, then evaluate
(:func:`train_and_evaluate`, :func:`train_and_evaluate_packed` for K runs at once); :func:`train`
(a run into an output folder) is the public API's."""

from asymvlm.runner.packed import train_and_evaluate_packed
from asymvlm.runner.single import RunSpec, TrainingRun, train, train_and_evaluate

__all__ = ["RunSpec", "TrainingRun", "train", "train_and_evaluate", "train_and_evaluate_packed"]
