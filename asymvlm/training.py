"""Single-process training on cached embeddings (paper App. B.4), usable without Ray.

The whole split lives on the device as tensors; every epoch draws one permutation and slices
batches out of it -- no per-sample Python, no DataLoader. Optimiser and schedule follow the
protocol: SGD with momentum (or AdamW), cosine annealing to 1e-6 stepped per iteration.
``Trainer`` keeps everything resumable in ``state_dict`` (adapter, optimiser, scheduler, RNG,
epoch), which the Ray Train wrapper (pipelines/) reuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
from asymvlm.errors import ConfigError
from asymvlm.methods import Method, build_method

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"
HISTORY_FILE = "history.jsonl"


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
        from asymvlm.methods import METHODS

        if value not in METHODS:
            raise ValueError(f"unknown method {value!r}; known: {', '.join(sorted(METHODS))}")
        return value

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
    """Read and validate ``ROOT/<split>`` and move it to ``device``."""
    data = tables.read_split(root, split)
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
    return max(1, n_items // batch_size)


class Trainer:
    """Trains one method on one split held in device memory.

    With ``world_size`` > 1 (inside a ``torch.distributed`` process group, e.g. a Ray Train
    worker) this worker trains on its shard of the captions (:func:`shard_rows`) with a local
    batch of ``batch_size / world_size``; the objective spans the global batch and gradients are
    averaged by DDP (:mod:`asymvlm.distributed`), so N workers equal one process with the full
    batch. ``data`` is the whole split: :meth:`start` calibrates on all of it, identically on
    every worker, and only the shard is kept afterwards.
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
        n_text = data.text_emb.shape[0]
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
        for step in range(self.steps):
            idx = perm[step * self.batch_size : (step + 1) * self.batch_size]
            loss = self.step(
                self.data.image_emb[self.data.text_to_image[idx]], self.data.text_emb[idx]
            )
            total += loss.detach()
        self.epoch += 1
        return {"epoch": self.epoch, "train_loss": float(total) / self.steps, **self.stats()}

    def step(self, image_batch: torch.Tensor, text_batch: torch.Tensor) -> torch.Tensor:
        """One optimisation step on a paired batch."""
        assert self.optimizer is not None and self.scheduler is not None
        with torch.autocast(
            self.device.type,
            dtype=self.autocast or torch.float32,
            enabled=self.autocast is not None,
        ):
            loss = self.loss_module(image_batch, text_batch, self.epoch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
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
            raise ValueError(
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
def save_checkpoint(
    directory: str, method: Method, cfg: TrainConfig, dim: int, extra: dict[str, Any] | None = None
) -> None:
    """Write ``config.json`` (everything needed to rebuild the method) and ``model.pt``."""
    os.makedirs(directory, exist_ok=True)
    meta = {
        "method": method.name,
        "dim": dim,
        "method_kwargs": cfg.method_args(),
        "adapter_input": cfg.adapter_input,
        "train_config": asdict(cfg),
        **(extra or {}),
    }
    tmp = os.path.join(directory, WEIGHTS_FILE + ".tmp")
    torch.save({k: v.detach().cpu() for k, v in method.state_dict().items()}, tmp)
    os.replace(tmp, os.path.join(directory, WEIGHTS_FILE))
    with open(os.path.join(directory, CONFIG_FILE), "w") as fh:
        json.dump(meta, fh, indent=2)


def load_checkpoint(
    directory: str, device: str | torch.device = "cpu"
) -> tuple[Method, dict[str, Any]]:
    """Rebuild the method saved by :func:`save_checkpoint`; returns (method, config dict)."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not a checkpoint directory (no {CONFIG_FILE})")
    with open(path) as fh:
        meta = json.load(fh)
    method = build_method(meta["method"], meta["dim"], **meta.get("method_kwargs", {}))
    weights = os.path.join(directory, WEIGHTS_FILE)
    method.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    method.to(torch.device(device)).eval()
    return method, meta


def train(
    root: str,
    split: str,
    cfg: TrainConfig,
    output: str | None = None,
    progress: bool = True,
) -> tuple[Method, list[dict[str, float]]]:
    """Load a split, build the method, train it and (optionally) save a checkpoint."""
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    data = load_split(root, split, cfg.adapter_input, device)
    method = build_method(cfg.method, data.dim, **cfg.method_args())
    trainer = Trainer(method, cfg, data)
    log = None
    if output is not None:
        os.makedirs(output, exist_ok=True)
        log = open(os.path.join(output, HISTORY_FILE), "w")  # noqa: SIM115

    def on_epoch_end(row: dict[str, float]) -> None:
        if log is not None:
            log.write(json.dumps(row) + "\n")
            log.flush()

    try:
        history = trainer.fit(progress=progress, on_epoch_end=on_epoch_end)
    finally:
        if log is not None:
            log.close()
    method.eval()
    if output is not None:
        manifest = data.split.manifest
        save_checkpoint(
            output,
            method,
            cfg,
            data.dim,
            extra={"embeddings": root, "split": split, "embedding_model": manifest.model},
        )
    return method, history
