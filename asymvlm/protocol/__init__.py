"""The paper's protocol (App. B.4): a run is train, then evaluate -- without Ray.

* :class:`RunSpec` -- one run, typed (tables, splits, hyper-parameters, checkpoint cadence);
* :func:`run_protocol` / :class:`TrainingRun` -- seed, load the training split (holding out a
  validation part when the tables have none), build the method and its trainer, continue from a
  saved state, train, then evaluate retrieval on the validation and test splits;
* :func:`run_packed_protocol` -- K runs of one method (other lr / seed) trained as one batched
  model (:class:`~asymvlm.training.PackedTrainer`), each evaluated as its own run;
* :func:`train` -- ``asymvlm train``: a run into a local checkpoint folder, resumable.

The Ray layer (``pipelines/``) runs the same functions in Tune trials and Ray Train workers.
"""

from asymvlm.protocol.folder import train
from asymvlm.protocol.packed import check_packable_specs, run_packed_protocol
from asymvlm.protocol.run import EpochHook, TrainingRun, run_protocol, training_data
from asymvlm.protocol.spec import RunSpec

__all__ = [
    "EpochHook",
    "RunSpec",
    "TrainingRun",
    "check_packable_specs",
    "run_packed_protocol",
    "run_protocol",
    "train",
    "training_data",
]
