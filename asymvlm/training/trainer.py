"""The single-process (or one DDP worker's) trainer: :class:`Trainer` and its optimiser.

The whole split lives on the device as tensors; every epoch draws one permutation and slices
batches out of it -- no per-sample Python, no DataLoader. Optimiser and schedule follow the
protocol: SGD with momentum (or AdamW), cosine annealing to 1e-6 stepped per iteration.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from asymvlm.distributed import GlobalBatchLoss, epoch_generator, shard_rows
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.methods import Method
from asymvlm.splits import SplitTensors
from asymvlm.training.config import TrainConfig, autocast_dtype

__all__ = [
    "GRAD_BAD",
    "LOSS_BAD",
    "NO_BAD_STEP",
    "EpochRow",
    "History",
    "Trainer",
    "make_optimizer",
    "steps_per_epoch",
]

#: One epoch's statistics (``epoch``, ``train_loss``, ``lr``, kappa quantiles ...).
EpochRow = dict[str, float]
#: The rows of the epochs trained so far.
History = list[EpochRow]


def steps_per_epoch(n_items: int, batch_size: int) -> int:
    """Full batches per epoch; the ragged tail is dropped unless it is the only batch."""
    if n_items < 1 or batch_size < 1:
        raise ValueError(f"need at least one item and batch_size >= 1, got {n_items}, {batch_size}")
    return max(1, n_items // batch_size)


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


#: The first bad step of an epoch when none went bad (larger than any step code).
NO_BAD_STEP = 2**62
#: Bits of a step's code (``step * 4 + bits``): its loss, its gradient was non-finite.
LOSS_BAD, GRAD_BAD = 1, 2


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
        if method.trainable:  # the image input it takes: raw projections for official PFE/ProbVLM
            image_rows = method.image_rows(data.image_emb, data.image_norm)
            if image_rows is not data.image_emb:
                data = replace(data, image_emb=image_rows)
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
        #: The code of the epoch's first bad step (``NO_BAD_STEP``: none), kept on the device.
        self.first_bad = torch.full((), NO_BAD_STEP, dtype=torch.long, device=self.device)
        self._prepared = False
        self._params = [p for p in method.parameters() if p.requires_grad]
        self.autocast = autocast_dtype(cfg.precision, self.device)
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
            # in blocks: torch.isfinite on the whole split would build full-size temporaries
            if not all(bool(torch.isfinite(b).all()) for b in tensor.split(65536)):
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

    def divergence(self, code: int, deferred: bool) -> NonFiniteError:
        """The error of step code ``code`` (``step * 4`` + :data:`LOSS_BAD` /
        :data:`GRAD_BAD` bits) in the running epoch; ``deferred``: detected at the epoch's
        end (accelerators)."""
        step, bits = divmod(code, 4)
        what = " and ".join(
            name for bit, name in ((LOSS_BAD, "loss"), (GRAD_BAD, "gradient")) if bits & bit
        )
        when = " (detected at the end of the epoch)" if deferred else ""
        return NonFiniteError(
            f"non-finite {what} at epoch {self.epoch + 1} of {self.cfg.epochs}, step {step + 1} "
            f"of {self.steps}{when} {self._where()}: the run diverged; lower the learning rate"
        )

    def step_code(self, loss: torch.Tensor) -> torch.Tensor:
        """0-d long on the device: 0 when the step is fine, else :data:`LOSS_BAD` /
        :data:`GRAD_BAD` bits (the loss, the gradients' max-norm non-finite)."""
        code = (~torch.isfinite(loss.detach())).long() * LOSS_BAD
        grads = [p.grad for p in self._params if p.grad is not None]
        if grads:
            norms = torch.stack(torch._foreach_norm(grads, math.inf))  # NaN/inf propagate
            code = code + (~torch.isfinite(norms).all()).long() * GRAD_BAD
        return code

    # -- the algorithm: start, then per epoch begin_epoch, step..., end_epoch ------------------
    def start(self) -> None:
        """Called once before the first epoch of a fresh run (with the whole training split):
        the method's ``fit_start`` calibration, then :meth:`prepare`."""
        assert self._full_data is not None, "start() belongs before the first epoch"
        self.method.fit_start(self._full_data.image_emb, self._full_data.text_emb)
        self.prepare()

    def prepare(self) -> None:
        """Drop the whole split (only this worker's shard is trained on) and wrap the loss for
        DDP; done once, by :meth:`start` or before the first epoch of a resumed run."""
        if self._full_data is None and self._prepared:
            return
        self._full_data, self._prepared = None, True
        if self.world_size > 1 and self.method.trainable:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.loss_module = DistributedDataParallel(
                GlobalBatchLoss(self.method), device_ids=device_ids
            )

    def begin_epoch(self) -> None:
        """Before an epoch's steps: prepared, the method in training mode, no bad step yet."""
        assert self.optimizer is not None and self.scheduler is not None
        self.prepare()
        self.method.train()
        self.first_bad.fill_(NO_BAD_STEP)

    def train_epoch(self) -> EpochRow:
        """One pass over a fresh permutation of the captions; returns the epoch's statistics."""
        self.begin_epoch()
        total = torch.zeros((), device=self.device)
        for index, (image_batch, text_batch) in enumerate(self.epoch_batches()):
            loss = self.step(image_batch, text_batch, index)
            total += loss.detach()
        return self.end_epoch(total)

    def end_epoch(self, total: torch.Tensor, first_bad: torch.Tensor | None = None) -> EpochRow:
        """Close the running epoch whose summed step losses are ``total`` (0-d, on the device):
        raise for a recorded bad step (``first_bad``, default this trainer's), non-finite
        parameters or statistics, else count the epoch and return its row. (Also the end of a
        packed member's epoch, :class:`~asymvlm.training.packed.PackedTrainer`.)"""
        first_bad = self.first_bad if first_bad is None else first_bad
        # One read per epoch: the mean loss, the first bad step, the parameters' max-norm.
        norms = [n.float() for n in torch._foreach_norm(self._params, math.inf)]
        param_max = torch.stack(norms).max() if norms else total.new_zeros(())
        loss_sum, bad_step, param_max = torch.stack(
            [total.double(), first_bad.double(), param_max.double()]
        ).tolist()
        if bad_step < NO_BAD_STEP:
            raise self.divergence(int(bad_step), deferred=True)
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

    def epoch_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This epoch's ``self.steps`` paired (image, text) batches: slices of one permutation
        of the captions drawn from :func:`epoch_generator` (a subclass may stream them,
        :class:`~asymvlm.training.stream.StreamingTrainer`)."""
        generator = epoch_generator(self.cfg.seed, self.rank, self.epoch, self.device)
        perm = torch.randperm(self.data.text_emb.shape[0], generator=generator, device=self.device)
        for step in range(self.steps):
            idx = perm[step * self.batch_size : (step + 1) * self.batch_size]
            yield self.data.image_emb[self.data.text_to_image[idx]], self.data.text_emb[idx]

    def step(
        self, image_batch: torch.Tensor, text_batch: torch.Tensor, index: int = 0
    ) -> torch.Tensor:
        """Step ``index`` (0-based) of the epoch on a paired batch; a non-finite loss or
        gradient is caught before the optimiser step (at once on the CPU, deferred elsewhere;
        see the class)."""
        assert self.optimizer is not None and self.scheduler is not None
        with torch.autocast(
            self.device.type,
            dtype=self.autocast or torch.float32,
            enabled=self.autocast is not None,
        ):
            loss = self.loss_module(image_batch, text_batch, self.epoch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        code = self.step_code(loss)
        if self.sync_free:
            bits = int(code)
            if bits:
                raise self.divergence(index * 4 + bits, deferred=False)
        else:  # device-side: keep the first bad step's code, no host sync
            candidate = torch.where(code > 0, code + index * 4, NO_BAD_STEP)
            torch.minimum(self.first_bad, candidate, out=self.first_bad)
        self.optimizer.step()
        self.scheduler.step()
        return loss

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
        on_epoch_end: Callable[[EpochRow], None] | None = None,
    ) -> History:
        """Train for the remaining epochs (all of them for a fresh trainer)."""
        history: History = []
        if not self.method.trainable:
            if self._full_data is not None:  # post-hoc methods: fitted once, on the whole split
                self.method.fit_posthoc(self._full_data)
                self._full_data = None
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
            self.prepare()
