"""One training run (App. B.4), the :class:`Trainer` of a :class:`TrainConfig` (the split on the
device): SGD-momentum or AdamW, cosine per step to ``min_lr``, a caption permutation per epoch."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from asymvlm.distributed import GlobalBatchLoss, epoch_generator, shard_rows
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.methods import Method
from asymvlm.splits import SplitTensors
from asymvlm.training.train_config import DEVICE, TrainConfig


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` = CUDA when available; a device this machine lacks is a ConfigError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not DEVICE.match(device):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ConfigError(f"--device {device}: CUDA is not available on this machine ({n} GPUs)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available on this machine")
    return dev


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``precision`` on ``device`` (None: full fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


#: One epoch's statistics (``epoch``, ``train_loss``, ``lr``, kappa quantiles ...).
EpochRow = dict[str, float]
History = list[EpochRow]
#: What a step's non-finite code (1: loss, 2: gradient, 3: both) names.
BAD = {1: "loss", 2: "gradient", 3: "loss and gradient"}


def steps_per_epoch(n_items: int, batch_size: int) -> int:
    """Full batches per epoch; the ragged tail is dropped unless it is the only batch."""
    if n_items < 1 or batch_size < 1:
        raise ValueError(f"need at least one item and batch_size >= 1, got {n_items}, {batch_size}")
    return max(1, n_items // batch_size)


def layout(n_text: int, batch_size: int, world_size: int) -> tuple[int, int]:
    """(one worker's batch size, steps per epoch): the same on every worker."""
    global_batch = min(batch_size, n_text)
    if global_batch % world_size:
        raise ValueError(f"batch_size {global_batch} is not divisible by {world_size} workers")
    batch = global_batch // world_size
    return batch, steps_per_epoch(n_text // world_size, batch)


def make_optimizer(method: Method, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD with momentum or AdamW over the trainable parameters (fused kernels when available)."""
    params = [p for p in method.parameters() if p.requires_grad]
    kwargs: dict[str, Any] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if cfg.optimizer == "sgd":
        kwargs["momentum"] = cfg.momentum
    cls = torch.optim.SGD if cfg.optimizer == "sgd" else torch.optim.AdamW
    try:
        return cls(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # older torch / unsupported device
        return cls(params, **kwargs)


def non_finite(x: torch.Tensor) -> int:
    """The first row of ``x`` holding a non-finite value, -1 when none does (a row's minimum
    and maximum are finite when all its values are: no temporary the size of ``x``)."""
    low, high = torch.aminmax(x.reshape(len(x), -1), dim=1)
    bad = (~(low.isfinite() & high.isfinite())).nonzero()
    return int(bad[0, 0]) if len(bad) else -1


def bad_code(losses: torch.Tensor, grad_norms: torch.Tensor) -> torch.Tensor:
    """Per member: 1 where the loss is non-finite, + 2 where a gradient is (no host sync)."""
    return (~torch.isfinite(losses)).long() + 2 * (~torch.isfinite(grad_norms)).long()


class Trainer:
    """Trains one method on one split in device memory (with ``world_size`` > 1 this worker's
    shard, the loss over the global batch). A non-finite loss or gradient raises
    :class:`~asymvlm.errors.NonFiniteError` at the end of its epoch, which is not counted."""

    def __init__(
        self,
        method: Method,
        cfg: TrainConfig,
        data: SplitTensors,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.method = method
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.device = data.image_emb.device
        method.to(self.device)
        n_text, n_image = data.text_emb.shape[0], data.image_emb.shape[0]
        if n_text == 0 or n_image == 0:
            raise ConfigError(
                f"cannot train {method.name} on an empty split ({n_image} images, "
                f"{n_text} captions)"
            )
        if method.trainable:  # the rows evaluation and scoring encode (Method.split_inputs)
            image_rows, text_rows = method.split_inputs(data)
            data = replace(data, image_emb=image_rows, text_emb=text_rows)
        for kind, tensor, ids in (
            ("caption", data.text_emb, getattr(data.split, "caption_ids", None)),
            ("image", data.image_emb, getattr(data.split, "image_ids", None)),
        ):
            if (row := non_finite(tensor)) >= 0:
                name = f"{ids[row]!r} (row {row})" if ids is not None else f"row {row}"
                raise NonFiniteError(
                    f"non-finite {kind} embedding for {kind} {name} of the training data: fix "
                    "the input, it is not a training problem"
                )
        self.batch_size, self.steps = self._layout(n_text)
        self._whole: SplitTensors | None = data  # until the first epoch: fit_start sees it all
        rows: Any = slice(None)
        if world_size > 1:
            rows = shard_rows(n_text, rank, world_size, cfg.seed).to(self.device)
        shard = data.text_emb[rows], data.text_to_image[rows]
        self.data = SplitTensors(data.image_emb, *shard, data.split)  # this worker's rows
        self.epoch = 0
        self.first_bad = torch.zeros((), dtype=torch.long, device=self.device)
        self._params = [p for p in method.parameters() if p.requires_grad]
        self.autocast = autocast_dtype(cfg.precision, self.device)
        self.loss_module: torch.nn.Module = GlobalBatchLoss(method)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if method.trainable:
            self.optimizer = make_optimizer(method, cfg)
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=max(1, cfg.epochs * self.steps), eta_min=cfg.min_lr
            )
        generator = torch.Generator().manual_seed(0)  # a fixed caption sample for kappa stats
        probe = torch.randperm(self.data.text_emb.shape[0], generator=generator)[:1024]
        self._probe = probe.to(self.device)

    def _layout(self, n_text: int) -> tuple[int, int]:
        return layout(n_text, self.cfg.batch_size, self.world_size)

    def diverged(self, what: str, step: int | None = None) -> NonFiniteError:
        """The error of a non-finite ``what`` in the running epoch (at 0-based ``step``)."""
        at = f"at epoch {self.epoch + 1} of {self.cfg.epochs}"
        if step is not None:
            at += f", step {step + 1} of {self.steps}"
        rank = f", rank {self.rank}" if self.world_size > 1 else ""
        return NonFiniteError(
            f"non-finite {what} {at} ({self.method.name}, {self.cfg.optimizer} lr "
            f"{self.cfg.lr:g}{rank}): the run diverged; lower the learning rate"
        )

    # -- the loop: start, then per epoch begin_epoch, step..., end_epoch ----------------------
    def start(self) -> None:
        """Once before the first epoch of a fresh run: ``fit_start`` on the whole split."""
        if self._whole is not None:
            self.method.fit_start(self._whole.image_emb, self._whole.text_emb)

    def begin_epoch(self) -> None:
        """Before an epoch's steps: the whole split dropped, the loss wrapped for DDP (once)."""
        if self._whole is not None and self.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.loss_module = DistributedDataParallel(self.loss_module, device_ids=ids)
        self._whole = None
        self.method.train()
        self.first_bad.zero_()

    def epoch_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This epoch's (image, text) batches: slices of a (seed, rank, epoch) permutation."""
        generator = epoch_generator(self.cfg.seed, self.rank, self.epoch, self.device)
        perm = torch.randperm(self.data.text_emb.shape[0], generator=generator, device=self.device)
        images, texts = self.data.image_emb, self.data.text_emb
        owners = self.data.text_to_image[perm]
        for start in range(0, self.steps * self.batch_size, self.batch_size):
            end = start + self.batch_size
            yield images[owners[start:end]], texts[perm[start:end]]

    def step(self, images: torch.Tensor, texts: torch.Tensor, index: int = 0) -> torch.Tensor:
        """One SGD step on a paired batch (step ``index`` of the epoch); a non-finite loss or
        gradient is recorded in :attr:`first_bad` as ``4 * index + code``."""
        assert self.optimizer is not None and self.scheduler is not None
        with torch.autocast(self.device.type, self.autocast, enabled=self.autocast is not None):
            loss = self.loss_module(images, texts, self.epoch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in self._params if p.grad is not None]
        norm = torch.stack(torch._foreach_norm(grads)).sum() if grads else loss.new_zeros(())
        code = bad_code(loss.detach(), norm)
        first = (self.first_bad == 0) & (code > 0)
        self.first_bad.copy_(torch.where(first, 4 * index + code, self.first_bad))
        self.optimizer.step()
        self.scheduler.step()
        return loss.detach()

    def train_epoch(self) -> EpochRow:
        self.begin_epoch()
        total = torch.zeros((), device=self.device)
        for index, (images, texts) in enumerate(self.epoch_batches()):
            total += self.step(images, texts, index)
        return self.end_epoch(total)

    def end_epoch(self, total: torch.Tensor, first_bad: torch.Tensor | None = None) -> EpochRow:
        """Close the epoch whose step losses sum to ``total``: one host read of the loss, the
        first bad step and the parameters' max-norm; raises when the run diverged."""
        first_bad = self.first_bad if first_bad is None else first_bad
        norms = torch._foreach_norm(self._params, math.inf) if self._params else []
        param_max = torch.stack(norms).max() if norms else total.new_zeros(())
        values = torch.stack([total.double(), first_bad.double(), param_max.double()])
        loss_sum, bad, param_max = values.tolist()
        if bad > 0:
            raise self.diverged(BAD[int(bad) % 4], int(bad) // 4)
        row = {"epoch": self.epoch + 1, "train_loss": loss_sum / self.steps, **self.stats()}
        bad_keys = [key for key, value in row.items() if not math.isfinite(value)]
        if not math.isfinite(param_max) or bad_keys:
            raise self.diverged(", ".join(bad_keys) or "parameters")
        self.epoch += 1
        return row

    @torch.no_grad()
    def stats(self) -> EpochRow:
        """Learning rate, learnable scalars and kappa quantiles on a fixed caption sample."""
        out: dict[str, float] = {}
        if self.optimizer is not None:
            out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        out.update(self.method.training_stats())
        self.method.eval()
        kappa = self.method.kappa(self.data.text_emb[self._probe])
        if kappa is not None:
            q = torch.tensor([0.05, 0.5, 0.95], device=kappa.device)
            p05, p50, p95 = torch.quantile(kappa.float(), q).tolist()
            out.update(kappa_mean=float(kappa.mean()), kappa_p05=p05, kappa_p50=p50, kappa_p95=p95)
        return out

    def fit(
        self, progress: bool = True, on_epoch_end: Callable[[EpochRow], None] | None = None
    ) -> History:
        """Train the remaining epochs (a post-hoc method is fitted once instead)."""
        if not self.method.trainable:
            if self._whole is not None:
                self.method.fit_posthoc(self._whole)
                self._whole = None
            return []
        if self.epoch == 0:
            self.start()
        history: History = []
        name = f"train {self.method.name}"
        for _ in tqdm(range(self.epoch, self.cfg.epochs), desc=name, disable=not progress):
            t0 = time.perf_counter()
            row = self.train_epoch()
            row["epoch_seconds"] = time.perf_counter() - t0
            history.append(row)
            if on_epoch_end is not None:
                on_epoch_end(row)
        return history

    # -- resumability: the permutations are pure functions of (seed, rank, epoch) -------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "method": self.method.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "epoch": self.epoch,
            "seed": self.cfg.seed,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.cfg.seed:
            raise CheckpointError(
                f"checkpoint was trained with seed {state['seed']}, this run has {self.cfg.seed}"
            )
        self.method.load_state_dict(state["method"])
        if self.optimizer is not None and self.scheduler is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        self.epoch = int(state["epoch"])
