"""Packed trials: K runs of one method (other ``lr`` / ``seed``) as one batched model, the K
losses vmapped over stacked parameters; member k ends where its unpacked run ends."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.func import functional_call, vmap

from asymvlm.distributed import GlobalBatchLoss, epoch_generator
from asymvlm.errors import ConfigError, NonFiniteError
from asymvlm.methods import Method, build_method
from asymvlm.splits import SplitTensors
from asymvlm.training.trainer import EpochRow, History, TrainConfig, Trainer, bad_code

logger = logging.getLogger(__name__)

#: The :class:`TrainConfig` fields in which the members of a pack may differ.
PACKABLE_FIELDS = ("lr", "seed")


def check_packable(cfgs: Sequence[TrainConfig]) -> None:
    """:class:`ConfigError` unless the configurations differ only in :data:`PACKABLE_FIELDS`
    and do not stream (a pack holds its split in memory)."""
    must = f"share every setting but {' and '.join(PACKABLE_FIELDS)}"
    require_alike([c.model_dump() for c in cfgs], PACKABLE_FIELDS, "configuration", must)
    if cfgs[0].stream == "always":
        raise ConfigError(
            "packed trials hold the training split in memory and cannot stream it: with "
            "stream: always, set pack: 1 (each trial then streams on its own)"
        )


def require_alike(items: list[dict[str, Any]], free: Collection[str], noun: str, must: str) -> None:
    """:class:`ConfigError` naming the first difference unless ``items`` agree outside ``free``."""
    if not items:
        raise ConfigError(f"packed trials need at least one {noun}")
    shared = [{k: v for k, v in item.items() if k not in free} for item in items]
    for i, other in enumerate(shared[1:], start=1):
        diff = [k for k in shared[0] if shared[0][k] != other[k]]
        if diff:
            found = ", ".join(f"{k} ({shared[0][k]!r} vs {other[k]!r})" for k in diff)
            raise ConfigError(
                f"packed trials must {must}: {noun} {i} differs from {noun} 0 in {found}"
            )


def _rng_state(device: torch.device) -> list[torch.Tensor]:
    """The global CPU (and CUDA) RNG states."""
    cuda = [torch.cuda.get_rng_state(device)] if device.type == "cuda" else []
    return [torch.get_rng_state(), *cuda]


def _set_rng_state(state: Sequence[torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if len(state) > 1:
        torch.cuda.set_rng_state(state[1], device)


class PackedTrainer:
    """Trains K configurations of one method on one split as one batched model, each member
    built as its unpacked run builds it; after :meth:`fit`: ``histories[k]``, ``errors[k]``
    (None or the divergence message), ``methods[k]`` and ``trainers[k]``."""

    def __init__(self, cfgs: Sequence[TrainConfig], data: SplitTensors) -> None:
        check_packable(cfgs)
        self.cfgs = list(cfgs)
        self.device = data.image_emb.device
        self._cuda = [self.device] if self.device.type == "cuda" else []  # for torch's fork_rng
        self.methods: list[Method] = []
        self._rng: list[list[torch.Tensor]] = []  # each member's global RNG stream
        with torch.random.fork_rng(self._cuda):
            for cfg in cfgs:
                torch.manual_seed(cfg.seed)
                self.methods.append(build_method(cfg.method, data.dim, **cfg.method_args()))
                self._rng.append(_rng_state(self.device))
        self.trainers = [Trainer(m, cfg, data) for m, cfg in zip(self.methods, cfgs, strict=True)]
        self.histories: list[History] = [[] for _ in cfgs]
        self.errors: list[str | None] = [None] * len(cfgs)
        self.epoch = 0
        self._started = False
        self._template = GlobalBatchLoss(self.methods[0])  # functional_call swaps its tensors

    @contextmanager
    def member_rng(self, k: int) -> Iterator[None]:
        """Member ``k``'s global RNG stream for the duration."""
        with torch.random.fork_rng(self._cuda):
            _set_rng_state(self._rng[k], self.device)
            try:
                yield
            finally:
                self._rng[k] = _rng_state(self.device)

    def fit(
        self,
        on_epoch_end: Callable[[int, EpochRow], None] | None = None,
        on_state: Callable[[PackedTrainer], None] | None = None,
    ) -> list[History]:
        """Train every member for its remaining epochs. ``on_epoch_end(k, row)`` follows each
        epoch of member k; ``on_state(pack)`` follows when :meth:`state_dict` is whole."""
        hook = on_epoch_end or (lambda k, row: None)
        whole = on_state or (lambda pack: None)
        if not self.methods[0].trainable:  # post-hoc fits (or none), one by one
            for k, trainer in enumerate(self.trainers):
                with self.member_rng(k):
                    trainer.fit(progress=False)
            return self.histories
        if not self._started:
            self._started = True
            for k, trainer in enumerate(self.trainers):
                with self.member_rng(k):
                    trainer.start()
        for _ in range(self.epoch, self.cfgs[0].epochs):
            if all(error is not None for error in self.errors):
                break
            rows = self._packed_epoch()
            self.epoch += 1
            for k, row in rows.items():
                self.histories[k].append(row)
                hook(k, row)
            whole(self)
        return self.histories

    # -- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every member's trainer state, RNG stream, history and failure; the pack's epoch."""
        return {
            "trainers": [trainer.state_dict() for trainer in self.trainers],
            "rng": list(self._rng),
            "histories": [[dict(row) for row in history] for history in self.histories],
            "errors": list(self.errors),
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` of this pack."""
        with torch.random.fork_rng(self._cuda):  # each trainer sets the global RNG state
            for trainer, trainer_state in zip(self.trainers, state["trainers"], strict=True):
                trainer.load_state_dict(trainer_state)
        self._rng = list(state["rng"])
        self.errors = list(state["errors"])
        self.histories = [[dict(row) for row in history] for history in state["histories"]]
        self.epoch = int(state["epoch"])
        self._started = True

    # -- one epoch ----------------------------------------------------------------------------
    def _names(self, kind: str) -> list[str]:
        return [f"method.{name}" for name, _ in getattr(self.methods[0], f"named_{kind}")()]

    @contextmanager
    def _stacked(self) -> Iterator[tuple[list[torch.Tensor], dict[str, torch.Tensor]]]:
        """Each parameter of the K members stacked into one [K, ...] leaf, every member's
        parameter a view of its row (its own optimiser updates the row in place), and the
        stacked buffers; afterwards each member owns its storage again."""
        params = [list(m.parameters()) for m in self.methods]
        leaves = []
        for own in zip(*params, strict=True):
            leaf = torch.stack([p.detach() for p in own]).requires_grad_(own[0].requires_grad)
            for k, p in enumerate(own):
                p.data = leaf.detach()[k]
            leaves.append(leaf)
        members = (m.buffers() for m in self.methods)
        buffers = [torch.stack(own) for own in zip(*members, strict=True)]
        try:
            yield leaves, dict(zip(self._names("buffers"), buffers, strict=True))
        finally:
            for p in (p for member in params for p in member):
                p.grad, p.data = None, p.data.clone()

    def _losses(
        self, leaves: list[torch.Tensor], buffers: dict[str, torch.Tensor], images, texts, epoch
    ) -> torch.Tensor:
        """[K] losses: the method's loss vmapped over stacked members and batches [K, B, d]."""
        params = dict(zip(self._names("parameters"), leaves, strict=True))

        def one(p: dict, b: dict, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
            return functional_call(self._template, (p, b), (image, text, epoch))

        dtype = self.trainers[0].autocast
        with torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=bool(dtype)):
            return vmap(one, randomness="error")(params, buffers, images, texts)

    def _packed_epoch(self) -> dict[int, EpochRow]:
        """One epoch of every member at once; the rows of the members that finished it. A
        member that diverged in an earlier epoch keeps its row in the batch, without updates."""
        t0 = time.perf_counter()
        alive = [k for k, error in enumerate(self.errors) if error is None]
        lead, n_members = self.trainers[0], len(self.methods)
        data, batch = lead.data, lead.batch_size
        for trainer in self.trainers:
            trainer.begin_epoch()
        n = data.text_emb.shape[0]
        gens = [epoch_generator(cfg.seed, 0, self.epoch, self.device) for cfg in self.cfgs]
        perms = torch.stack([torch.randperm(n, device=self.device, generator=g) for g in gens])
        totals = torch.zeros(n_members, device=self.device)
        first_bad = torch.zeros(n_members, dtype=torch.long, device=self.device)
        with self._stacked() as (leaves, buffers):
            for step in range(lead.steps):
                idx = perms[:, step * batch : (step + 1) * batch]
                images, texts = data.image_emb[data.text_to_image[idx]], data.text_emb[idx]
                losses = self._losses(leaves, buffers, images, texts, self.epoch)
                for leaf in leaves:
                    leaf.grad = None
                losses.sum().backward()
                losses = losses.detach()
                grads = [
                    leaf.grad.reshape(n_members, -1) for leaf in leaves if leaf.grad is not None
                ]
                norms = torch.stack([torch.linalg.vector_norm(g, dim=1) for g in grads]).sum(0)
                code = bad_code(losses, norms)
                first_bad = torch.where((first_bad == 0) & (code > 0), 4 * step + code, first_bad)
                for k in alive:
                    trainer = self.trainers[k]
                    for p, leaf in zip(trainer.method.parameters(), leaves, strict=True):
                        p.grad = None if leaf.grad is None else leaf.grad[k]
                    trainer.optimizer.step()  # type: ignore[union-attr]
                    trainer.scheduler.step()  # type: ignore[union-attr]
                totals += losses
        rows: dict[int, EpochRow] = {}
        for k in alive:
            try:
                with self.member_rng(k):
                    rows[k] = self.trainers[k].end_epoch(totals[k], first_bad[k])
                rows[k]["epoch_seconds"] = time.perf_counter() - t0
            except NonFiniteError as exc:
                self.errors[k] = str(exc)
                logger.warning("packed member %d: %s", k, exc)
        return rows
