"""The paper's protocol (App. B.4) without Ray: a run is train, then evaluate
(:func:`run_protocol`, :func:`run_packed_protocol` for K runs at once, :func:`train` for
``asymvlm train``; :mod:`asymvlm.protocol.api` for ``asymvlm evaluate`` and ``score``: the
package's public API). ``pipelines/`` runs the same functions in Tune trials and Ray Train
workers.
"""

from asymvlm.protocol.packed import check_packable_specs, run_packed_protocol
from asymvlm.protocol.run import EpochHook, RunSpec, TrainingRun, run_protocol, train, training_data

__all__ = ["EpochHook", "RunSpec", "TrainingRun", "check_packable_specs", "run_packed_protocol"]
__all__ += ["run_protocol", "train", "training_data"]
