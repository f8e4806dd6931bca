"""Training an adapter on cached embeddings (App. B.4): :class:`Trainer` (split in memory),
:class:`StreamingTrainer` (captions streamed), :class:`PackedTrainer` (K runs as one model)."""

from asymvlm.training.packed import PackedTrainer, check_packable
from asymvlm.training.stream import CaptionStream, StreamingTrainer, open_stream, use_streaming
from asymvlm.training.trainer import EpochRow, History, TrainConfig, Trainer, resolve_device

__all__ = ["CaptionStream", "EpochRow", "History", "PackedTrainer", "StreamingTrainer", "Trainer"]
__all__ += ["TrainConfig", "check_packable", "open_stream", "resolve_device", "use_streaming"]
