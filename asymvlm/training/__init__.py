"""Training an adapter on cached embeddings (App. B.4): :class:`Trainer` (split in memory),
:class:`StreamingTrainer` (captions streamed), :class:`PackedTrainer` (K runs as one model).

Importing this package (or its :class:`TrainConfig`) imports no torch; the trainers are
imported on first use."""

import importlib
from typing import Any

#: name -> the module of this package that defines it
_LAZY = {
    "TrainConfig": "train_config",
    "EpochRow": "trainer",
    "History": "trainer",
    "Trainer": "trainer",
    "resolve_device": "trainer",
    "StreamingTrainer": "stream",
    "open_stream": "stream",
    "use_streaming": "stream",
    "PackedTrainer": "packed_trainer",
    "check_packable": "packed_trainer",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
