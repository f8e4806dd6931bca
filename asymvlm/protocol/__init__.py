"""The paper's protocol (App. B.4) without Ray: train, then evaluate (:func:`run_protocol`,
:func:`run_packed_protocol` for K runs at once); :func:`train` and :mod:`.api`: the public API."""

from asymvlm.protocol.packed import check_packable_specs, run_packed_protocol
from asymvlm.protocol.run import EpochHook, RunSpec, TrainingRun, run_protocol, train, training_data

__all__ = ["EpochHook", "RunSpec", "TrainingRun", "check_packable_specs", "run_packed_protocol"]
__all__ += ["run_protocol", "train", "training_data"]
