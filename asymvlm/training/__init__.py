"""Single-process training on cached embeddings (paper App. B.4), usable without Ray.

The whole split lives on the device as tensors; every epoch draws one permutation and slices
batches out of it -- no per-sample Python, no DataLoader. Optimiser and schedule follow the
protocol: SGD with momentum (or AdamW), cosine annealing to 1e-6 stepped per iteration.
``Trainer`` keeps everything resumable in ``state_dict`` (adapter, optimiser, scheduler, RNG,
epoch), which the Ray Train wrapper (pipelines/) reuses.

A diverged run stops: a non-finite loss, gradient or parameter raises
:class:`~asymvlm.errors.NonFiniteError` naming the method, learning rate, epoch and step
(:class:`Trainer`). Checkpoint folders (:func:`save_checkpoint`) are published atomically as a
whole, so a killed run never leaves a half-written or mixed checkpoint, and :func:`train`
resumes one bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from asymvlm import tables
from asymvlm.distributed import GlobalBatchLoss, epoch_generator, shard_rows
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.methods import Method, build_method, check_method_name

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"
HISTORY_FILE = "history.jsonl"
TRAINER_FILE = "trainer.pt"
#: Every file a checkpoint folder may hold; anything else in it is not ours to replace.
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, HISTORY_FILE, TRAINER_FILE)


_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


@pydantic_dataclass(config=ConfigDict(extra="forbid"))
class TrainConfig:
    """Hyper-parameters; defaults are the paper's protocol (App. B.4, Table A.1).

    Validated on construction (pydantic): unknown fields, wrong types and out-of-range values
    (epochs < 1, lr <= 0 or NaN, batch < 1, unknown method/optimizer ...) raise
    :class:`pydantic.ValidationError`, which every entry point reports as one line
    (:func:`asymvlm.config.validation_message`).
    """

    method: str = "asymvlm-vmf"
    epochs: Annotated[int, Field(ge=1)] = 200
    lr: PositiveFloat = 1e-2
    optimizer: Literal["sgd", "adamw"] = "sgd"  # SGD with momentum, or AdamW
    momentum: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.9
    weight_decay: NonNegativeFloat = 5e-4
    batch_size: Annotated[int, Field(ge=1)] = 2048
    min_lr: NonNegativeFloat = 1e-6
    hidden_dim: Annotated[int, Field(ge=1)] = 1024
    depth: Annotated[int, Field(ge=1)] = 3
    seed: Annotated[int, Field(ge=0)] = 0
    adapter_input: Literal["raw", "unit"] = "raw"  # raw = embedding * norm (official)
    device: str = "auto"  # "auto" = cuda when available
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on cuda
    method_kwargs: dict[str, Any] = field(default_factory=dict)

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        return check_method_name(value)

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {value!r}")
        return value

    def method_args(self) -> dict[str, Any]:
        return {"hidden_dim": self.hidden_dim, "depth": self.depth, **self.method_kwargs}


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` = CUDA when available; an explicit device that this machine lacks is a
    :class:`~asymvlm.errors.ConfigError`."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not _DEVICE.match(device):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {device}: only {torch.cuda.device_count()} GPU(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available on this machine")
    return dev


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@dataclass
class SplitTensors:
    """One split on the device: what training and evaluation consume."""

    image_emb: torch.Tensor  # [n_image, d] unit
    text_emb: torch.Tensor  # [n_text, d] adapter input (raw or unit)
    text_to_image: torch.Tensor  # [n_text] long
    split: tables.EmbeddingSplit

    @property
    def dim(self) -> int:
        return self.image_emb.shape[1]

    def subset(self, images: np.ndarray, texts: np.ndarray) -> SplitTensors:
        """Image rows ``images`` and caption rows ``texts`` (of those images), renumbered."""
        split = self.split.subset(images, texts)
        device = self.image_emb.device
        return SplitTensors(
            image_emb=self.image_emb[torch.as_tensor(images, device=device)],
            text_emb=self.text_emb[torch.as_tensor(texts, device=device)],
            text_to_image=torch.as_tensor(split.text_image_index, device=device),
            split=split,
        )


def load_split(
    root: str, split: str, adapter_input: str = "raw", device: str | torch.device = "cpu"
) -> SplitTensors:
    """Read and validate ``ROOT/<split>`` and move it to ``device``.

    A split without images or without captions is a :class:`~asymvlm.tables.TableError`
    naming it (nothing can be trained or evaluated on it).
    """
    data = tables.read_split(root, split)
    if len(data.image_ids) == 0 or len(data.caption_ids) == 0:
        raise tables.TableError(
            f"{root}/{split}: the split is empty ({len(data.image_ids)} images, "
            f"{len(data.caption_ids)} captions); training and evaluation need at least one of each"
        )
    device = torch.device(device)
    return SplitTensors(
        image_emb=torch.tensor(data.image_embeddings, dtype=torch.float32, device=device),
        text_emb=torch.tensor(data.text_inputs(adapter_input), dtype=torch.float32, device=device),
        text_to_image=torch.tensor(data.text_image_index, dtype=torch.long, device=device),
        split=data,
    )


def hold_out_images(
    data: SplitTensors, fraction: float, seed: int = 0
) -> tuple[SplitTensors, SplitTensors]:
    """Split one split into (rest, held-out) by image: a seeded ``fraction`` of the images and
    all their captions form the held-out part -- a validation split for data sets that ship
    only train and test (COCO 2017, CC). The choice depends only on the image ids and seed."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"hold-out fraction must be in (0, 1), got {fraction}")
    ids = data.split.image_ids
    n_image = len(ids)
    order = np.argsort([hashlib.sha256(f"{seed}:{i}".encode()).hexdigest() for i in ids])
    held = np.zeros(n_image, dtype=bool)
    held[order[: max(1, int(round(fraction * n_image)))]] = True
    owner = data.text_to_image.cpu().numpy()
    rest, out = (data.subset(np.flatnonzero(keep), np.flatnonzero(keep[owner]))
                 for keep in (~held, held))  # fmt: skip
    return rest, out


def make_optimizer(method: Method, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD with momentum or AdamW over the trainable parameters (fused kernels when available)."""
    params = [p for p in method.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        cls, kwargs = torch.optim.SGD, {"momentum": cfg.momentum}
    elif cfg.optimizer == "adamw":
        cls, kwargs = torch.optim.AdamW, {}
    else:
        raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {cfg.optimizer!r}")
    try:
        return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # older torch / unsupported device
        return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **kwargs)


def steps_per_epoch(n_items: int, batch_size: int) -> int:
    """Full batches per epoch; the ragged tail is dropped unless it is the only batch."""
    if n_items < 1 or batch_size < 1:
        raise ValueError(f"need at least one item and batch_size >= 1, got {n_items}, {batch_size}")
    return max(1, n_items // batch_size)


#: ``Trainer._first_bad`` when no step of the epoch went bad (larger than any step code).
_NO_BAD_STEP = 2**62
_LOSS_BAD, _GRAD_BAD = 1, 2  # bits of a step's code: ``step * 4 + bits``


def _first_bad_row(x: torch.Tensor) -> int:
    return int((~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)).nonzero()[0, 0])


class Trainer:
    """Trains one method on one split held in device memory.

    With ``world_size`` > 1 (inside a ``torch.distributed`` process group, e.g. a Ray Train
    worker) this worker trains on its shard of the captions (:func:`shard_rows`) with a local
    batch of ``batch_size / world_size``; the objective spans the global batch and gradients are
    averaged by DDP (:mod:`asymvlm.distributed`), so N workers equal one process with the full
    batch. ``data`` is the whole split: :meth:`start` calibrates on all of it, identically on
    every worker, and only the shard is kept afterwards.

    Divergence stops the run with :class:`~asymvlm.errors.NonFiniteError` ("non-finite loss at
    epoch 3 of 10, step 17 of 24 (asymvlm-vmf, sgd lr 0.5): ..."; epochs and steps count from
    1). Every step checks the loss and the gradients' max-norm (one ``torch._foreach_norm``)
    after the backward pass and before the optimiser step:

    * on the CPU, where reading a flag costs no device sync, the check is immediate: the run
      stops at the exact step, before that step's update touches the parameters;
    * on accelerators (CUDA, MPS) no step adds a host sync: the first bad step is recorded in a
      device-side scalar and read together with the epoch's mean loss, which is read anyway, so
      the run stops at the end of that epoch, naming the first bad step (the later updates of
      that epoch are discarded with the run; no checkpoint is written from it).

    After every epoch the parameters and the logged statistics are checked as well (a finite
    gradient can still overflow a parameter). Embeddings given to the trainer must be finite
    (checked once, on construction). Gradients are checked after DDP's all-reduce, so every
    worker stops at the same step.
    """

    def __init__(
        self,
        method: Method,
        cfg: TrainConfig,
        data: SplitTensors,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.method, self.cfg = method, cfg
        self.rank, self.world_size = rank, world_size
        self.device = data.image_emb.device
        self.method.to(self.device)
        n_text, n_image = data.text_emb.shape[0], data.image_emb.shape[0]
        if n_text == 0 or n_image == 0:
            raise ConfigError(
                f"cannot train {method.name} on an empty split ({n_image} images, "
                f"{n_text} captions)"
            )
        self._check_inputs(data)
        global_batch = min(cfg.batch_size, n_text)
        if global_batch % world_size:
            raise ValueError(f"batch_size {global_batch} is not divisible by {world_size} workers")
        self.batch_size = global_batch // world_size  # per worker
        rows = shard_rows(n_text, rank, world_size, cfg.seed).to(self.device)
        self._full_data: SplitTensors | None = data
        self.data = SplitTensors(
            image_emb=data.image_emb,
            text_emb=data.text_emb[rows] if world_size > 1 else data.text_emb,
            text_to_image=data.text_to_image[rows] if world_size > 1 else data.text_to_image,
            split=data.split,
        )
        # Same number of steps on every worker (collectives must match): the smallest shard.
        self.steps = steps_per_epoch(n_text // world_size, self.batch_size)
        self.epoch = 0
        # CPU: a flag read is free, so a bad step raises at once; elsewhere it is deferred.
        self.sync_free = self.device.type == "cpu"
        self._step_index = 0  # 0-based step within the running epoch (messages say 1-based)
        self._first_bad = torch.full((), _NO_BAD_STEP, dtype=torch.long, device=self.device)
        self._params = [p for p in method.parameters() if p.requires_grad]
        self.autocast = _autocast_dtype(cfg.precision, self.device)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.loss_module: torch.nn.Module = GlobalBatchLoss(method)
        if method.trainable:
            self.optimizer = make_optimizer(method, cfg)
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=max(1, cfg.epochs * self.steps), eta_min=cfg.min_lr
            )
        # A fixed caption subsample to summarise kappa every epoch.
        n_local = self.data.text_emb.shape[0]
        probe = torch.randperm(n_local, generator=torch.Generator().manual_seed(0))
        self._probe = probe[:4096].to(self.device)

    # -- divergence ---------------------------------------------------------------------------
    @staticmethod
    def _check_inputs(data: SplitTensors) -> None:
        """Non-finite embeddings would only surface as a "diverged" loss; name the row instead."""
        for kind, tensor, ids in (
            ("caption", data.text_emb, getattr(data.split, "caption_ids", None)),
            ("image", data.image_emb, getattr(data.split, "image_ids", None)),
        ):
            if not bool(torch.isfinite(tensor).all()):
                row = _first_bad_row(tensor)
                name = f"{ids[row]!r} (row {row})" if ids is not None else f"row {row}"
                raise NonFiniteError(
                    f"non-finite {kind} embedding for {kind} {name} of the training data: fix "
                    "the input, it is not a training problem"
                )

    def _where(self) -> str:
        lr = f"{self.cfg.optimizer} lr {self.cfg.lr:g}"
        rank = f", rank {self.rank}" if self.world_size > 1 else ""
        return f"({self.method.name}, {lr}{rank})"

    def _diverged(self, code: int, deferred: bool) -> NonFiniteError:
        step, bits = divmod(code, 4)
        what = " and ".join(
            name for bit, name in ((_LOSS_BAD, "loss"), (_GRAD_BAD, "gradient")) if bits & bit
        )
        when = " (detected at the end of the epoch)" if deferred else ""
        return NonFiniteError(
            f"non-finite {what} at epoch {self.epoch + 1} of {self.cfg.epochs}, step {step + 1} "
            f"of {self.steps}{when} {self._where()}: the run diverged; lower the learning rate"
        )

    def _step_code(self, loss: torch.Tensor) -> torch.Tensor:
        """0-d long on the device: 0 when the step is fine, else loss/gradient bits."""
        code = (~torch.isfinite(loss.detach())).long() * _LOSS_BAD
        grads = [p.grad for p in self._params if p.grad is not None]
        if grads:
            norms = torch.stack(torch._foreach_norm(grads, math.inf))  # NaN/inf propagate
            code = code + (~torch.isfinite(norms).all()).long() * _GRAD_BAD
        return code

    # -- the algorithm ------------------------------------------------------------------------
    def start(self) -> None:
        """Called once before the first epoch of a fresh run (with the whole training split)."""
        assert self._full_data is not None, "start() belongs before the first epoch"
        self.method.fit_start(self._full_data.image_emb, self._full_data.text_emb)
        self._ready()

    def _ready(self) -> None:
        """Drop the whole split (only the shard is trained on) and wrap the loss for DDP."""
        self._full_data = None
        if self.world_size > 1 and self.method.trainable:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.loss_module = DistributedDataParallel(
                GlobalBatchLoss(self.method), device_ids=device_ids
            )

    def train_epoch(self) -> dict[str, float]:
        """One pass over a fresh permutation of the captions; returns the epoch's statistics."""
        assert self.optimizer is not None and self.scheduler is not None
        if self._full_data is not None:
            self._ready()
        self.method.train()
        generator = epoch_generator(self.cfg.seed, self.rank, self.epoch, self.device)
        perm = torch.randperm(self.data.text_emb.shape[0], generator=generator, device=self.device)
        total = torch.zeros((), device=self.device)
        self._first_bad.fill_(_NO_BAD_STEP)
        for step in range(self.steps):
            self._step_index = step
            idx = perm[step * self.batch_size : (step + 1) * self.batch_size]
            loss = self.step(
                self.data.image_emb[self.data.text_to_image[idx]], self.data.text_emb[idx]
            )
            total += loss.detach()
        # One read per epoch: the mean loss, the first bad step, the parameters' max-norm.
        norms = [n.float() for n in torch._foreach_norm(self._params, math.inf)]
        param_max = torch.stack(norms).max() if norms else total.new_zeros(())
        loss_sum, first_bad, param_max = torch.stack(
            [total.double(), self._first_bad.double(), param_max.double()]
        ).tolist()
        if first_bad < _NO_BAD_STEP:
            raise self._diverged(int(first_bad), deferred=True)
        if not math.isfinite(param_max):
            raise NonFiniteError(
                f"non-finite parameters after epoch {self.epoch + 1} of {self.cfg.epochs} "
                f"{self._where()}: the run diverged; lower the learning rate"
            )
        self.epoch += 1
        row = {"epoch": self.epoch, "train_loss": loss_sum / self.steps, **self.stats()}
        bad = [key for key, value in row.items() if not math.isfinite(value)]
        if bad:
            raise NonFiniteError(
                f"non-finite {', '.join(bad)} after epoch {self.epoch} of {self.cfg.epochs} "
                f"{self._where()}: the run diverged; lower the learning rate"
            )
        return row

    def step(self, image_batch: torch.Tensor, text_batch: torch.Tensor) -> torch.Tensor:
        """One optimisation step on a paired batch; a non-finite loss or gradient is caught
        before the optimiser step (at once on the CPU, deferred elsewhere; see the class)."""
        assert self.optimizer is not None and self.scheduler is not None
        with torch.autocast(
            self.device.type,
            dtype=self.autocast or torch.float32,
            enabled=self.autocast is not None,
        ):
            loss = self.loss_module(image_batch, text_batch, self.epoch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        code = self._step_code(loss)
        if self.sync_free:
            bits = int(code)
            if bits:
                raise self._diverged(self._step_index * 4 + bits, deferred=False)
        else:  # device-side: keep the first bad step's code, no host sync
            candidate = torch.where(code > 0, code + self._step_index * 4, _NO_BAD_STEP)
            torch.minimum(self._first_bad, candidate, out=self._first_bad)
        self.optimizer.step()
        self.scheduler.step()
        return loss

    @torch.no_grad()
    def stats(self) -> dict[str, float]:
        """Learning rate, learnable scalars and kappa quantiles on a fixed caption sample."""
        out: dict[str, float] = {}
        if self.optimizer is not None:
            out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        out.update(self.method.training_stats())
        self.method.eval()
        kappa = self.method.kappa(self.data.text_emb[self._probe])
        if kappa is not None:
            q = torch.quantile(kappa.float(), torch.tensor([0.05, 0.5, 0.95], device=kappa.device))
            out.update(
                kappa_mean=float(kappa.mean()),
                kappa_p05=float(q[0]),
                kappa_p50=float(q[1]),
                kappa_p95=float(q[2]),
            )
        return out

    def fit(
        self,
        progress: bool = True,
        on_epoch_end: Callable[[dict[str, float]], None] | None = None,
    ) -> list[dict[str, float]]:
        """Train for the remaining epochs (all of them for a fresh trainer)."""
        history: list[dict[str, float]] = []
        if not self.method.trainable:
            return history
        if self.epoch == 0:
            self.start()
        from tqdm.auto import tqdm

        bar = tqdm(
            range(self.epoch, self.cfg.epochs),
            desc=f"train {self.method.name}",
            unit="epoch",
            disable=not progress,
        )
        for _ in bar:
            t0 = time.perf_counter()
            row = self.train_epoch()
            row["epoch_seconds"] = time.perf_counter() - t0
            history.append(row)
            bar.set_postfix(loss=f"{row['train_loss']:.4f}")
            if on_epoch_end is not None:
                on_epoch_end(row)
        return history

    # -- resumability -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs. The random state is (seed, rank, epoch): every
        epoch's permutation is drawn from :func:`epoch_generator`; the global torch RNG, which
        nothing in an epoch draws from, is saved too for code that does."""
        return {
            "method": self.method.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "epoch": self.epoch,
            "rng": {
                "seed": self.cfg.seed,
                "world_size": self.world_size,
                "torch": torch.get_rng_state(),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rng = state.get("rng", {})
        if rng.get("seed", self.cfg.seed) != self.cfg.seed:
            raise CheckpointError(
                f"checkpoint was trained with seed {rng['seed']}, this run has {self.cfg.seed}"
            )
        self.method.load_state_dict(state["method"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        self.epoch = int(state["epoch"])
        if self._full_data is not None:
            self._ready()


# -- checkpoints ------------------------------------------------------------------------------
# A checkpoint is a folder holding (some of) CHECKPOINT_FILES:
#   config.json    everything needed to rebuild the method, plus "complete", "epoch", "epochs"
#   model.pt       the method's state_dict (CPU tensors)
#   history.jsonl  one row per epoch trained so far            (written by train())
#   trainer.pt     Trainer.state_dict(), to resume the run      (written by train())
# It is published as a whole (publish_folder): readers see the old folder or the new one.


def _sibling_paths(directory: str) -> tuple[str, str, str, str]:
    """(folder, staging, previous, discarded): the folder and its hidden siblings."""
    target = os.path.realpath(directory)
    parent, name = os.path.split(target)
    if not name:
        raise CheckpointError(f"{directory}: a checkpoint folder cannot be the file-system root")
    staging, previous, discarded = (
        os.path.join(parent, f".{name}.{tag}") for tag in ("writing", "previous", "discarded")
    )
    return target, staging, previous, discarded


def _remove_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync(path: str, folder: bool = False) -> None:
    """Flush a file (or a folder's entries) to disk, so a power cut cannot undo a rename."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not folder:  # some file systems cannot fsync a folder; a file must be flushed
            raise
    finally:
        os.close(fd)


def recover_checkpoint(directory: str) -> None:
    """Tidy up after a :func:`publish_folder` that was killed: if the new folder never took the
    old one's place, the old one (``.NAME.previous``) is put back; leftovers are deleted."""
    target, staging, previous, discarded = _sibling_paths(directory)
    if os.path.isdir(previous):
        if os.path.lexists(target):
            _remove_tree(previous)
        else:
            os.rename(previous, target)
    _remove_tree(staging)
    _remove_tree(discarded)


def publish_folder(directory: str, write: Callable[[str], None]) -> None:
    """Replace the folder ``directory`` as a whole by what ``write(staging)`` writes.

    ``write`` fills a fresh hidden sibling ``.NAME.writing``; its files are flushed to disk and
    it is renamed onto ``NAME`` (an existing ``NAME`` is first renamed aside to
    ``.NAME.previous``, deleted once the new one is in place). Killed at any point, this leaves
    the old folder, the new one, or the old one aside (put back by :func:`recover_checkpoint`),
    never a half-written or mixed folder. Local file systems only: this function is the
    boundary where another store would plug in.
    """
    target, staging, previous, _ = _sibling_paths(directory)
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        recover_checkpoint(directory)
        os.mkdir(staging)
        write(staging)
        for entry in os.listdir(staging):
            _fsync(os.path.join(staging, entry))
        _fsync(staging, folder=True)
        if os.path.lexists(target):
            os.rename(target, previous)
            try:
                os.rename(staging, target)
            except OSError:
                os.rename(previous, target)
                raise
            _fsync(parent, folder=True)
            _remove_tree(previous)
        else:
            os.rename(staging, target)
            _fsync(parent, folder=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename else ""
        raise CheckpointError(f"{directory}: cannot write the checkpoint: {reason}{where}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only left when something failed


def discard_checkpoint(directory: str) -> None:
    """Remove a checkpoint folder: renamed aside (atomic), then deleted."""
    target, _, _, discarded = _sibling_paths(directory)
    if os.path.lexists(target):
        recover_checkpoint(directory)
        os.rename(target, discarded)
        _remove_tree(discarded)


def save_checkpoint(
    directory: str,
    method: Method,
    cfg: TrainConfig,
    dim: int,
    extra: dict[str, Any] | None = None,
    *,
    epoch: int | None = None,
    complete: bool | None = None,
    trainer_state: dict[str, Any] | None = None,
    history: list[dict[str, float]] | None = None,
) -> None:
    """Write the checkpoint folder ``directory`` as a whole (:func:`publish_folder`).

    ``config.json`` holds everything needed to rebuild the method plus ``complete``, ``epoch``
    and ``epochs``; ``model.pt`` the weights; ``trainer.pt`` (:meth:`Trainer.state_dict`) and
    ``history.jsonl`` are written when given. ``epoch`` defaults to ``extra["epoch"]`` (the Ray
    Train path passes it there), else to the end of training; ``complete`` defaults to
    ``epoch >= epochs``. :func:`load_checkpoint` refuses an incomplete checkpoint unless told.
    """
    extra = dict(extra or {})
    epochs = cfg.epochs if method.trainable else 0
    given = extra.pop("epoch", None)
    epoch = int(epoch if epoch is not None else given if given is not None else epochs)
    meta = {
        "method": method.name,
        "dim": dim,
        "method_kwargs": cfg.method_args(),
        "adapter_input": cfg.adapter_input,
        "train_config": asdict(cfg),
        "complete": bool(epoch >= epochs if complete is None else complete),
        "epoch": epoch,
        "epochs": epochs,
        **extra,
    }
    config_text = json.dumps(meta, indent=2, allow_nan=False)
    history_text = None
    if history is not None:
        history_text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in history)
    weights = {k: v.detach().cpu() for k, v in method.state_dict().items()}

    def write(folder: str) -> None:
        torch.save(weights, os.path.join(folder, WEIGHTS_FILE))
        if trainer_state is not None:
            torch.save(trainer_state, os.path.join(folder, TRAINER_FILE))
        if history_text is not None:
            with open(os.path.join(folder, HISTORY_FILE), "w") as fh:
                fh.write(history_text)
        with open(os.path.join(folder, CONFIG_FILE), "w") as fh:
            fh.write(config_text)

    publish_folder(directory, write)


def read_checkpoint_meta(directory: str) -> dict[str, Any] | None:
    """The ``config.json`` of a checkpoint folder, or None when it has none.

    Checkpoints written before the ``complete`` flag existed were final ones: they read as
    complete.
    """
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:
            meta = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{directory}: unreadable {CONFIG_FILE} ({exc})") from exc
    if not isinstance(meta, dict) or "method" not in meta or "dim" not in meta:
        raise CheckpointError(f"{directory}: {CONFIG_FILE} is not a checkpoint's (no method/dim)")
    meta.setdefault("complete", True)
    return meta


def read_history(directory: str) -> list[dict[str, float]]:
    """The rows of ``history.jsonl`` (none when the folder has no history)."""
    path = os.path.join(directory, HISTORY_FILE)
    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        lines = [line for line in fh.read().splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: line {exc.lineno} is not JSON ({exc.msg})") from exc


def _state_mismatch(method: Method, state: Any) -> str | None:
    """What keeps ``state`` from loading into ``method`` (None when it fits)."""
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        return "it is not a dict of tensors"
    expected = method.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {list(state[k].shape)} vs {list(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)):
        if items:
            more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
            parts.append(f"{label} {', '.join(items[:3])}{more}")
    return "; ".join(parts) or None


def _methods_fitting(state: dict[str, torch.Tensor], dim: int, kwargs: dict[str, Any]) -> list[str]:
    """Registered methods whose weights (built like the checkpoint's) have ``state``'s layout."""
    from asymvlm.methods import METHODS

    out = []
    for name in sorted(METHODS):
        try:
            candidate = build_method(name, dim, **kwargs)
        except (TypeError, ValueError):
            continue
        if _state_mismatch(candidate, state) is None:
            out.append(name)
    return out


def load_checkpoint(
    directory: str, device: str | torch.device = "cpu", *, allow_incomplete: bool = False
) -> tuple[Method, dict[str, Any]]:
    """Rebuild the method saved by :func:`save_checkpoint`; returns (method, config dict).

    Raises :class:`CheckpointError` naming the folder when it holds no checkpoint, when
    ``model.pt`` is missing, unreadable or does not fit the method ``config.json`` names (with
    the registered methods it would fit), and for an incomplete checkpoint (a run still in
    progress, killed or diverged) unless ``allow_incomplete``.
    """
    if not os.path.isdir(directory):
        _, _, previous, _ = _sibling_paths(directory)
        hint = (
            f" (an interrupted write left the last checkpoint in {previous}; "
            "`asymvlm train --resume` puts it back)"
            if os.path.isdir(previous)
            else ""
        )
        raise CheckpointError(f"{directory}: no checkpoint there (no such folder){hint}")
    meta = read_checkpoint_meta(directory)
    if meta is None:
        raise CheckpointError(f"{directory}: not a checkpoint folder (no {CONFIG_FILE})")
    if not meta["complete"] and not allow_incomplete:
        raise CheckpointError(
            f"{directory}: incomplete checkpoint (epoch {meta.get('epoch')} of "
            f"{meta.get('epochs')}): finish the run with `asymvlm train ... --resume`, or use "
            "it as it is with --allow-incomplete"
        )
    weights = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise CheckpointError(f"{directory}: {CONFIG_FILE} but no {WEIGHTS_FILE} (a partial copy?)")
    name, dim = meta["method"], meta["dim"]
    kwargs = meta.get("method_kwargs", {})
    try:
        method = build_method(name, dim, **kwargs)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild method {name!r}: {exc}") from exc
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{weights}: unreadable ({exc})") from exc
    mismatch = _state_mismatch(method, state)
    if mismatch is not None:
        fits = _methods_fitting(state, dim, kwargs) if isinstance(state, dict) else []
        guess = f"the weights fit {', '.join(fits)}" if fits else "the weights fit no known method"
        raise CheckpointError(
            f"{directory}: {WEIGHTS_FILE} does not match {CONFIG_FILE}, which names method "
            f"{name!r} (dim {dim}): {mismatch}; {guess}"
        )
    method.load_state_dict(state)
    method.to(torch.device(device)).eval()
    return method, meta


# -- a training run into a checkpoint folder ----------------------------------------------------
#: Settings a resumed run may change: where it runs, not what it computes.
RESUME_MAY_DIFFER = frozenset({"device"})


def _location(root: str) -> str:
    return root if "://" in root else os.path.abspath(root)


def check_output(directory: str) -> None:
    """Refuse an output that cannot hold a checkpoint folder: an existing file, a folder (or
    nearest existing parent) that is not writable, or a folder holding other files (a
    checkpoint replaces its folder as a whole, so anything else in it would be deleted)."""
    target, _, _, _ = _sibling_paths(directory)
    if os.path.lexists(target) and not os.path.isdir(target):
        raise CheckpointError(f"{directory} is a file, not a checkpoint folder")
    if target == os.path.realpath(os.getcwd()):
        raise CheckpointError(f"{directory} is the current folder; name a new folder for it")
    ancestor = os.path.dirname(target)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise CheckpointError(f"{directory}: {ancestor} is a file, not a folder")
    for folder in (ancestor, target) if os.path.isdir(target) else (ancestor,):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise CheckpointError(f"{directory}: cannot write a checkpoint ({folder} is read-only)")
    if os.path.isdir(target):
        foreign = sorted(set(os.listdir(target)) - set(CHECKPOINT_FILES))
        if foreign:
            shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
            raise CheckpointError(
                f"{directory} holds files that are not part of a checkpoint ({shown}); a "
                "checkpoint replaces its whole folder: choose a new or empty folder"
            )


def checkpoint_to_resume(
    directory: str, *, resume: bool = False, overwrite: bool = False
) -> dict[str, Any] | None:
    """Check ``directory`` as a training run's output; returns the config of the checkpoint to
    continue (``resume``), or None to start fresh (no checkpoint there, or ``overwrite``).

    An existing checkpoint without ``resume`` or ``overwrite`` is a :class:`CheckpointError`;
    so is one that cannot be resumed (an incomplete checkpoint without its trainer state).
    """
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: pick one")
    check_output(directory)
    recover_checkpoint(directory)
    present = [f for f in CHECKPOINT_FILES if os.path.lexists(os.path.join(directory, f))]
    if not present or overwrite:
        return None
    if not resume:
        raise CheckpointError(
            f"{directory} already holds a checkpoint; pass --resume to continue it or "
            "--overwrite to replace it"
        )
    meta = read_checkpoint_meta(directory)
    needed = [CONFIG_FILE, WEIGHTS_FILE]
    if meta is not None and not meta["complete"]:
        needed += [TRAINER_FILE, HISTORY_FILE]
    missing = [f for f in needed if f not in present]
    if missing:
        raise CheckpointError(
            f"{directory}: cannot resume: the checkpoint has no {', '.join(missing)}; pass "
            "--overwrite to start over"
        )
    return meta


def check_resumable(
    directory: str, meta: dict[str, Any], cfg: TrainConfig, root: str, split: str
) -> None:
    """A checkpoint is continued only with the settings it was started with -- ``epochs``
    included, since they shape the cosine schedule -- and on the same embeddings; the
    differing fields are named in the :class:`CheckpointError`."""
    ours = json.loads(json.dumps(asdict(cfg)))
    theirs = dict(meta.get("train_config", {}))
    diffs = [
        f"{key} {theirs.get(key)!r} (checkpoint) vs {ours.get(key)!r} (now)"
        for key in sorted(set(ours) | set(theirs))
        if key not in RESUME_MAY_DIFFER and theirs.get(key) != ours.get(key)
    ]
    for key, then, now in (
        ("embeddings", _location(str(meta.get("embeddings"))), _location(root)),
        ("split", meta.get("split"), split),
    ):
        if key in meta and then != now:
            diffs.append(f"{key} {then!r} (checkpoint) vs {now!r} (now)")
    if diffs:
        raise CheckpointError(
            f"{directory}: cannot resume with other settings: {'; '.join(diffs)}. Resume with "
            "the checkpoint's settings, or pass --overwrite to start over"
        )


def train(
    root: str,
    split: str,
    cfg: TrainConfig,
    output: str | None = None,
    progress: bool = True,
    *,
    checkpoint_every: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> tuple[Method, list[dict[str, float]]]:
    """Load a split, build the method, train it and (with ``output``) write a checkpoint folder.

    The folder gets an incomplete checkpoint every ``checkpoint_every`` epochs (default: none)
    and a complete one at the end, each published as a whole (:func:`save_checkpoint`), so a
    killed run leaves the last checkpoint intact. An existing checkpoint in ``output`` is
    refused unless ``resume`` -- continue it with the same settings (:func:`check_resumable`);
    a complete one is returned untouched; with none there the run starts fresh -- or
    ``overwrite`` (the old checkpoint is discarded once the data is loaded). A resumed run ends
    where the uninterrupted one ends (bit for bit on the CPU) and its history holds every epoch
    once. A diverged run raises :class:`NonFiniteError`, leaving the last good (incomplete)
    checkpoint as it was: nothing is marked complete.

    Returns the trained method and the whole history (earlier epochs of a resumed run too).
    """
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ConfigError(f"--checkpoint-every must be >= 1, got {checkpoint_every}")
    previous = None
    if output is not None:
        previous = checkpoint_to_resume(output, resume=resume, overwrite=overwrite)
        if previous is not None:
            check_resumable(output, previous, cfg, root, split)
            if previous["complete"]:
                method, _ = load_checkpoint(output, resolve_device(cfg.device))
                return method, read_history(output)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    data = load_split(root, split, cfg.adapter_input, device)
    method = build_method(cfg.method, data.dim, **cfg.method_args())
    trainer = Trainer(method, cfg, data)
    history: list[dict[str, float]] = []
    last_good: str | None = None
    if previous is not None:
        assert output is not None
        _resume_trainer(output, trainer, device)
        history = read_history(output)
        if [row.get("epoch") for row in history] != list(range(1, trainer.epoch + 1)):
            raise CheckpointError(
                f"{output}: {HISTORY_FILE} does not hold epochs 1..{trainer.epoch} of "
                f"{TRAINER_FILE}; pass --overwrite to start over"
            )
        last_good = f"epoch {trainer.epoch} of {cfg.epochs}"
    elif output is not None and overwrite:
        discard_checkpoint(output)  # the replaced run's checkpoint goes before training starts
    extra = {
        "embeddings": _location(root),
        "split": split,
        "embedding_model": data.split.manifest.model,
    }

    def write(complete: bool) -> None:
        assert output is not None
        save_checkpoint(output, method, cfg, data.dim, extra, epoch=trainer.epoch,
                        complete=complete, trainer_state=trainer.state_dict(),
                        history=history)  # fmt: skip

    def on_epoch_end(row: dict[str, float]) -> None:
        nonlocal last_good
        history.append(row)
        every = checkpoint_every
        if output is not None and every and trainer.epoch % every == 0:
            if trainer.epoch < cfg.epochs:
                write(complete=False)
                last_good = f"epoch {trainer.epoch} of {cfg.epochs}"

    try:
        trainer.fit(progress=progress, on_epoch_end=on_epoch_end)
    except NonFiniteError as exc:
        if output is None:
            raise
        kept = (
            f"{output} keeps the last good checkpoint ({last_good}, incomplete)"
            if last_good
            else f"no checkpoint was written to {output}"
        )
        raise NonFiniteError(f"{exc}; {kept}") from exc
    method.eval()
    if output is not None:
        write(complete=True)
    return method, history


def _resume_trainer(directory: str, trainer: Trainer, device: torch.device) -> None:
    path = os.path.join(directory, TRAINER_FILE)
    try:
        state = torch.load(path, map_location=device, weights_only=True)
        trainer.load_state_dict(state)
    except (RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{path}: cannot resume from it ({exc})") from exc
