"""One training run as the paper trains (App. B.4), without Ray: train, then evaluate
(:func:`train_and_evaluate`, :func:`train_and_evaluate_packed` for K runs at once); :func:`train`
(a run into an output folder) is the public API's."""

from asymvlm.runner.packed import check_packable_specs, train_and_evaluate_packed
from asymvlm.runner.single import (
    EpochHook,
    RunSpec,
    TrainingRun,
    train,
    train_and_evaluate,
    training_data,
)

__all__ = [
    "EpochHook",
    "RunSpec",
    "TrainingRun",
    "check_packable_specs",
    "train",
    "train_and_evaluate",
    "train_and_evaluate_packed",
    "training_data",
]
