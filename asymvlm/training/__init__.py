"""Training an adapter on cached embeddings (paper App. B.4), single process or one DDP worker.

The whole split lives on the device as tensors; every epoch draws one permutation and slices
batches out of it -- no per-sample Python, no DataLoader. Optimiser and schedule follow the
protocol: SGD with momentum (or AdamW), cosine annealing to 1e-6 stepped per iteration.

* :class:`TrainConfig` -- the hyper-parameters (validated, frozen);
* :class:`Trainer` -- one method on one split: ``start``, then per epoch ``begin_epoch``,
  ``step`` ..., ``end_epoch`` (the public hooks the other trainers build on), resumable through
  ``state_dict`` (adapter, optimiser, scheduler, RNG, epoch);
* :class:`StreamingTrainer` -- the same over captions streamed from the parquet parts (tables
  bigger than memory, :mod:`asymvlm.training.stream`);
* :class:`PackedTrainer` -- K runs of one method (other lr / seed) as one batched model
  (:mod:`asymvlm.training.packed`).

A diverged run stops: a non-finite loss, gradient or parameter raises
:class:`~asymvlm.errors.NonFiniteError` naming the method, learning rate, epoch and step.

The protocol of a whole run (train, then evaluate the validation and test splits) is
:mod:`asymvlm.protocol`; checkpoint folders are :mod:`asymvlm.checkpoints`.
"""

from asymvlm.training.config import OPTIMIZER_KEYS, TrainConfig, autocast_dtype, resolve_device
from asymvlm.training.packed import PACKABLE_FIELDS, PackedTrainer, check_packable
from asymvlm.training.stream import CaptionStream, StreamingTrainer, open_stream, use_streaming
from asymvlm.training.trainer import (
    EpochRow,
    History,
    Trainer,
    make_optimizer,
    steps_per_epoch,
)

__all__ = [
    "OPTIMIZER_KEYS",
    "PACKABLE_FIELDS",
    "CaptionStream",
    "EpochRow",
    "History",
    "PackedTrainer",
    "StreamingTrainer",
    "TrainConfig",
    "Trainer",
    "autocast_dtype",
    "check_packable",
    "make_optimizer",
    "open_stream",
    "resolve_device",
    "steps_per_epoch",
    "use_streaming",
]
