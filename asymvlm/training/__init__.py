"""Training an adapter on cached embeddings (paper App. B.4): :class:`Trainer` (split in memory),
:class:`StreamingTrainer` (captions streamed from the parquet parts), :class:`PackedTrainer`
(K runs of one method as one batched model). The whole run (train, evaluate) is
:mod:`asymvlm.protocol`.
"""

from asymvlm.training.config import TrainConfig, autocast_dtype, resolve_device
from asymvlm.training.packed import PackedTrainer, check_packable
from asymvlm.training.stream import CaptionStream, StreamingTrainer, open_stream, use_streaming
from asymvlm.training.trainer import EpochRow, History, Trainer, make_optimizer, steps_per_epoch

__all__ = [
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
