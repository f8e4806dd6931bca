"""Single-process training on cached embeddings (paper App. B.4), usable without Ray.

The whole split lives on the device as tensors; every epoch draws one permutation and slices
batches out of it -- no per-sample Python, no DataLoader. Optimiser and schedule follow the
protocol: SGD with momentum (or AdamW), cosine annealing to 1e-6 stepped per iteration.
``Trainer`` keeps everything resumable in ``state_dict`` (adapter, optimiser, scheduler, RNG,
epoch). :func:`run_protocol` is the paper's whole protocol for one run (train, evaluate on the
validation and test splits); the Ray Train wrapper (``pipelines/train.py``) runs it on every
worker.

A diverged run stops: a non-finite loss, gradient or parameter raises
:class:`~asymvlm.errors.NonFiniteError` naming the method, learning rate, epoch and step
(:class:`Trainer`). Checkpoint folders (:func:`save_checkpoint`) are published atomically as a
whole, so a killed run never leaves a half-written or mixed checkpoint, and :func:`train`
resumes one bit for bit.

Modules: :mod:`~asymvlm.training.config` (hyper-parameters, devices),
:mod:`~asymvlm.training.data` (splits on the device, hold-out),
:mod:`~asymvlm.training.trainer` (the trainer), :mod:`~asymvlm.training.checkpoint`
(checkpoint folders) and :mod:`~asymvlm.training.protocol` (a whole run: the
protocol, and ``asymvlm train``'s run into a checkpoint folder).
"""

from asymvlm.training.checkpoint import (
    CHECKPOINT_FILES,
    CONFIG_FILE,
    HISTORY_FILE,
    RESUME_MAY_DIFFER,
    TRAINER_FILE,
    WEIGHTS_FILE,
    check_output,
    check_resumable,
    checkpoint_to_resume,
    discard_checkpoint,
    load_checkpoint,
    provenance,
    publish_folder,
    read_checkpoint_meta,
    read_history,
    recover_checkpoint,
    save_checkpoint,
)
from asymvlm.training.config import TrainConfig, autocast_dtype, resolve_device
from asymvlm.training.data import SplitTensors, hold_out_images, load_split, steps_per_epoch
from asymvlm.training.packed import (
    PackedTrainer,
    check_packable,
    check_packable_specs,
    run_packed_protocol,
)
from asymvlm.training.protocol import (
    RunSpec,
    RunState,
    TrainingRun,
    run_protocol,
    train,
    training_data,
)
from asymvlm.training.trainer import Trainer, make_optimizer

__all__ = [
    "CHECKPOINT_FILES",
    "CONFIG_FILE",
    "HISTORY_FILE",
    "PackedTrainer",
    "RESUME_MAY_DIFFER",
    "RunSpec",
    "RunState",
    "TRAINER_FILE",
    "WEIGHTS_FILE",
    "SplitTensors",
    "TrainConfig",
    "Trainer",
    "TrainingRun",
    "autocast_dtype",
    "check_output",
    "check_packable",
    "check_packable_specs",
    "check_resumable",
    "checkpoint_to_resume",
    "discard_checkpoint",
    "hold_out_images",
    "load_checkpoint",
    "load_split",
    "make_optimizer",
    "publish_folder",
    "read_checkpoint_meta",
    "read_history",
    "recover_checkpoint",
    "resolve_device",
    "run_packed_protocol",
    "run_protocol",
    "save_checkpoint",
    "provenance",
    "steps_per_epoch",
    "train",
    "training_data",
]
