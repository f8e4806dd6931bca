"""Packed trials: K configurations of one method trained in one process as one batched model.

The protocol (paper App. B.4) trains every method for several learning rates and seeds; at the
adapter sizes of the paper (~3 M parameters, d = 512) one run leaves most of a GPU idle, and on
a CPU a small adapter's step is dominated by per-operation overhead. :class:`PackedTrainer`
trains K members -- the same method and hyper-parameters, different ``lr`` and/or ``seed`` --
as one model: every step gathers the K members' batches into [K, B, d] tensors, stacks the
members' parameters and evaluates the method's own loss (:func:`~asymvlm.distributed.\
global_batch_loss`, Eq. 2 / App. A.3 for AsymVLM) for all of them at once with
``torch.func.vmap(functional_call(...))``; one backward pass of the summed losses leaves each
member's own gradient on its own parameters. Everything else stays per member, exactly as its
unpacked :class:`~asymvlm.training.Trainer` has it (each member *is* driven through its own
``Trainer``):

* its initialisation, built under its own seed as :class:`~asymvlm.protocol.TrainingRun`
  builds it (``torch.manual_seed(seed)``, then ``build_method``), and its own global-RNG
  stream, swapped in whenever member code may draw from it (``fit_start``, evaluation);
* its per-epoch permutation (``epoch_generator(seed, 0, epoch)``), optimiser state, cosine
  schedule (from its own lr), epoch rows (``train_loss``, ``lr``, kappa statistics) and
  divergence checks: a member whose loss, gradient or parameters become non-finite is stopped
  with the message its ``Trainer`` would raise, and the others go on.

So member k ends where its unpacked run ends, up to the rounding of batched matrix products
(tested to float tolerance in ``tests/test_packed.py``; ``epoch_seconds`` is the pack's epoch).

A method whose loss cannot be vmapped (data-dependent Python control flow, random draws,
custom autograd Functions without a vmap rule) or whose batched loss differs from its own is
detected by a probe before the first step; the pack then trains its members one after another
(each with its own RNG stream, so still equal to the unpacked runs) and logs why. Methods
without SGD training (``clip``, ``bayesvlm``) are fitted one after another as well.

Single process only (``world_size`` 1): a packed member is never a DDP worker. A pack holds its
split in memory: it never streams (``stream: always`` is refused, and so is ``auto`` for a split
that would stream; :func:`check_packable`). A pack resumes between epochs from
:meth:`PackedTrainer.state_dict` (every member's trainer state, RNG stream, history and failure)
and ends where the uninterrupted pack ends.

The protocol of K runs at once (train, then evaluate each) is
:func:`asymvlm.protocol.run_packed_protocol`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.func import functional_call, vmap

from asymvlm.distributed import GlobalBatchLoss, epoch_generator, is_distributed
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.methods import Method, build_method
from asymvlm.splits import SplitTensors
from asymvlm.training.config import TrainConfig
from asymvlm.training.trainer import GRAD_BAD, LOSS_BAD, NO_BAD_STEP, EpochRow, History, Trainer

__all__ = [
    "PACKABLE_FIELDS",
    "PackedEpochHook",
    "PackedStateHook",
    "PackedTrainer",
    "check_packable",
    "require_alike",
]

logger = logging.getLogger(__name__)

#: The :class:`TrainConfig` fields in which the members of a pack may differ.
PACKABLE_FIELDS = ("lr", "seed")
#: ``on_epoch_end(member, row)``: member index (0-based) and its epoch row.
PackedEpochHook = Callable[[int, EpochRow], None]
#: Called with the pack when its state is whole between epochs (:meth:`PackedTrainer.fit`).
PackedStateHook = Callable[["PackedTrainer"], None]
RngState = tuple[torch.Tensor, torch.Tensor | None]


def check_packable(cfgs: Sequence[TrainConfig]) -> None:
    """:class:`~asymvlm.errors.ConfigError` unless the configurations differ only in
    :data:`PACKABLE_FIELDS` (same method, protocol, epochs, batch size, optimiser,
    architecture, precision, device ...) and do not ask to stream (a pack holds its split in
    memory)."""
    require_alike(
        [c.model_dump() for c in cfgs],
        PACKABLE_FIELDS,
        "configuration",
        f"share every setting but {' and '.join(PACKABLE_FIELDS)}",
    )
    if cfgs[0].stream == "always":
        raise ConfigError(
            "packed trials hold the training split in memory and cannot stream it: with "
            "stream: always, set pack: 1 (each trial then streams on its own)"
        )


def require_alike(items: list[dict[str, Any]], free: Collection[str], noun: str, must: str) -> None:
    """:class:`ConfigError` ("packed trials must <must>: <noun> i differs from <noun> 0 in
    key (a vs b), ...") unless ``items`` agree outside ``free``; also when there are none."""
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


# -- the global RNG, per member -----------------------------------------------------------------
def _rng_state(device: torch.device) -> RngState:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: RngState, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _owned(obj: Any) -> Any:
    """``obj`` with every tensor copied into storage of its own (a member's parameter is a view
    of the pack's stacked leaf while it trains; saving the view would save the whole leaf)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {key: _owned(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_owned(value) for value in obj)
    return obj


def _signature(method: Method) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    tensors = [*method.named_parameters(), *method.named_buffers()]
    return [(name, tuple(t.shape), t.dtype) for name, t in tensors]


class PackedTrainer:
    """Trains K members (``(method, cfg)`` pairs of one method, differing only in lr and seed)
    on one split as one batched model; see the module docstring.

    ``rng_states``: each member's global RNG state at the start of training (what
    :meth:`build` records after building it); None: the current state, for every member.
    ``vmap=False`` trains the members one after another (the fallback, without the probe).

    After :meth:`fit`: ``histories[k]`` (member k's epoch rows), ``errors[k]`` (None, or the
    :class:`~asymvlm.errors.NonFiniteError` message that stopped it), ``methods[k]``,
    ``trainers[k]``, ``mode`` (``"packed"`` or ``"sequential"``) and ``note`` (why not packed).
    """

    def __init__(
        self,
        members: Sequence[tuple[Method, TrainConfig]],
        data: SplitTensors,
        *,
        rng_states: Sequence[RngState] | None = None,
        vmap: bool = True,
    ) -> None:
        if is_distributed():
            raise ConfigError("packed trials run in one process; not inside a DDP group")
        cfgs = [cfg for _, cfg in members]
        check_packable(cfgs)
        self.methods = [method for method, _ in members]
        self.cfgs = cfgs
        for k, method in enumerate(self.methods):
            if method.name != cfgs[0].method:
                raise ConfigError(
                    f"packed member {k} is {method.name}, its configuration says {cfgs[0].method}"
                )
            if _signature(method) != _signature(self.methods[0]):
                raise ConfigError(
                    f"packed member {k} has other parameters or shapes than member 0; a pack "
                    "needs one architecture"
                )
        self.device = data.image_emb.device
        if rng_states is not None and len(rng_states) != len(members):
            raise ValueError(f"{len(rng_states)} RNG states for {len(members)} members")
        self._rng = list(rng_states) if rng_states else [_rng_state(self.device)] * len(members)
        self.trainers = [Trainer(method, cfg, data) for method, cfg in members]
        self.trainable = self.methods[0].trainable
        self.histories: list[History] = [[] for _ in members]
        self.errors: list[str | None] = [None] * len(members)
        self.mode = "packed" if vmap and self.trainable else "sequential"
        self.note: str | None = None if vmap else "packing switched off (vmap=False)"
        self.epoch = 0  # epochs done by the pack (its live members)
        self._started = False
        self._template = GlobalBatchLoss(self.methods[0])  # functional_call swaps its tensors
        self._param_names = [f"method.{n}" for n, _ in self.methods[0].named_parameters()]
        self._buffer_names: list[str] = []
        self._params: list[list[torch.Tensor]] = []
        self._buffers: list[list[torch.Tensor]] = []
        self._leaves: list[torch.Tensor] = []  # the stacked parameters while training packed

    @classmethod
    def build(
        cls, cfgs: Sequence[TrainConfig], data: SplitTensors, *, vmap: bool = True
    ) -> PackedTrainer:
        """Build every member as :class:`~asymvlm.protocol.TrainingRun` builds its run --
        ``torch.manual_seed(cfg.seed)``, then ``build_method`` -- so member k's initial
        parameters and RNG stream are those of the unpacked run; the caller's global RNG
        state is left as it was."""
        check_packable(cfgs)
        device = data.image_emb.device
        outer = _rng_state(device)
        members, states = [], []
        try:
            for cfg in cfgs:
                torch.manual_seed(cfg.seed)
                members.append((build_method(cfg.method, data.dim, **cfg.method_args()), cfg))
                states.append(_rng_state(device))
        finally:
            _set_rng_state(outer, device)
        return cls(members, data, rng_states=states, vmap=vmap)

    def __len__(self) -> int:
        return len(self.methods)

    @contextmanager
    def member_rng(self, k: int) -> Iterator[None]:
        """Member ``k``'s global RNG stream for the duration (saved back afterwards)."""
        outer = _rng_state(self.device)
        _set_rng_state(self._rng[k], self.device)
        try:
            yield
        finally:
            self._rng[k] = _rng_state(self.device)
            _set_rng_state(outer, self.device)

    # -- training -----------------------------------------------------------------------------
    def fit(
        self,
        progress: bool = False,
        on_epoch_end: PackedEpochHook | None = None,
        on_state: PackedStateHook | None = None,
    ) -> list[History]:
        """Train every member for its remaining epochs; returns the histories (``histories``).

        A member that diverges is stopped (``errors[k]``, also logged as a warning); its
        history keeps the epochs before it. ``on_epoch_end(k, row)`` follows every epoch of
        member k; ``on_state(pack)`` follows the last of them, when :meth:`state_dict` is whole
        (packed: after each epoch of the pack; one after another: after each member's epoch).
        """
        hook = on_epoch_end or (lambda k, row: None)
        whole = on_state or (lambda pack: None)
        if not self.trainable:  # nothing to batch: post-hoc fits (or none), one by one
            for k, trainer in enumerate(self.trainers):
                with self.member_rng(k):
                    trainer.fit(progress=False)
            return self.histories
        if not self._started:
            self._start()
        if self.mode == "sequential":
            self._fit_sequential(hook, whole)
            return self.histories
        from tqdm.auto import tqdm

        epochs = self.cfgs[0].epochs
        bar = tqdm(
            range(self.epoch, epochs),
            desc=f"train {len(self)} x {self.methods[0].name}",
            unit="epoch",
            disable=not progress,
        )
        self._pack_leaves()
        try:
            for _ in bar:
                alive = [k for k in range(len(self)) if self.errors[k] is None]
                if not alive:
                    break
                rows = self._packed_epoch(alive)
                self.epoch += 1
                for k, row in rows.items():
                    self.histories[k].append(row)
                    hook(k, row)
                whole(self)
                losses = [f"{row['train_loss']:.4f}" for row in rows.values()]
                bar.set_postfix(loss=",".join(losses), alive=len(rows))
        finally:
            self._unpack_leaves()
        return self.histories

    def _start(self) -> None:
        """Every member's ``Trainer.start`` (``fit_start``: calibration...) in its own RNG
        stream, then the probe that decides between packed and sequential training."""
        for k, trainer in enumerate(self.trainers):
            with self.member_rng(k):
                trainer.start()
        self._collect()
        if self.mode == "packed":
            why = self._probe()
            if why is not None:
                self.mode, self.note = "sequential", why
                logger.warning(
                    "%s cannot be trained packed (%s): training its %d members one after another",
                    self.methods[0].name,
                    why,
                    len(self),
                )

    def _collect(self) -> None:
        """The members' parameter and buffer objects, in the template's order."""
        self._started = True
        self._buffer_names = [f"method.{n}" for n, _ in self.methods[0].named_buffers()]
        self._params = [[p for _, p in m.named_parameters()] for m in self.methods]
        self._buffers = [[b for _, b in m.named_buffers()] for m in self.methods]

    # -- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed pack needs, taken between epochs (``on_state`` of :meth:`fit`):
        every member's :meth:`Trainer.state_dict` (its own copies of the tensors), global-RNG
        stream, history and failure, and the pack's epoch and mode (the probe is not re-run)."""
        return {
            "members": [(cfg.lr, cfg.seed) for cfg in self.cfgs],
            "trainers": [_owned(trainer.state_dict()) for trainer in self.trainers],
            "rng": [_owned(state) for state in self._rng],
            "histories": [[dict(row) for row in history] for history in self.histories],
            "errors": list(self.errors),
            "epoch": self.epoch,
            "mode": self.mode,
            "note": self.note,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (before :meth:`fit`; a state loaded on the CPU is
        moved to the members' device by their trainers). The members must be the pack's: the
        same (lr, seed) in the same order."""
        if self._started:
            raise RuntimeError("load_state_dict belongs before fit()")
        members = [(float(lr), int(seed)) for lr, seed in state["members"]]
        ours = [(cfg.lr, cfg.seed) for cfg in self.cfgs]
        if members != ours:
            raise CheckpointError(
                f"the checkpoint holds a pack of (lr, seed) {members}; this pack is {ours}"
            )
        outer = _rng_state(self.device)
        try:  # a trainer's state carries the global RNG of its save: the member's is ``rng``
            for trainer, trainer_state in zip(self.trainers, state["trainers"], strict=True):
                trainer.load_state_dict(trainer_state)
        finally:
            _set_rng_state(outer, self.device)
        self._rng = [(cpu, cuda) for cpu, cuda in state["rng"]]
        self.histories = [[dict(row) for row in history] for history in state["histories"]]
        self.errors = list(state["errors"])
        self.epoch, self.mode, self.note = int(state["epoch"]), state["mode"], state["note"]
        if self.trainable:
            self._collect()

    def _pack_leaves(self) -> None:
        """Stack each parameter of the K members into one [K, ...] leaf and make every
        member's parameter a view of its row: the batched forward reads the stacked leaves
        without copying, one backward pass fills their [K, ...] gradients, and each member's
        own optimiser updates its row in place (its parameter objects stay the same)."""
        self._leaves = []
        for j in range(len(self._param_names)):
            own = [self._params[k][j] for k in range(len(self))]
            leaf = torch.stack([p.detach() for p in own]).requires_grad_(own[0].requires_grad)
            for k, p in enumerate(own):
                p.data = leaf.detach()[k]
            self._leaves.append(leaf)

    def _unpack_leaves(self) -> None:
        """Give every member's parameters their own storage again (a saved state dict then
        holds one member, not the whole pack)."""
        for params in self._params:
            for p in params:
                p.grad = None
                p.data = p.data.clone()
        self._leaves = []

    def _fail(self, k: int, exc: NonFiniteError) -> None:
        self.errors[k] = str(exc)
        logger.warning("packed member %d: %s", k, exc)

    def _fit_sequential(self, hook: PackedEpochHook, whole: PackedStateHook) -> None:
        """The fallback: each member's own ``Trainer`` epochs, member after member."""
        for k, trainer in enumerate(self.trainers):
            with self.member_rng(k):
                while self.errors[k] is None and trainer.epoch < self.cfgs[k].epochs:
                    t0 = time.perf_counter()
                    try:
                        row = trainer.train_epoch()
                    except NonFiniteError as exc:
                        self._fail(k, exc)
                        break
                    row["epoch_seconds"] = time.perf_counter() - t0
                    self.histories[k].append(row)
                    hook(k, row)
                    whole(self)
        self.epoch = max(t.epoch for t in self.trainers)

    def _autocast(self) -> torch.autocast:
        dtype = self.trainers[0].autocast
        return torch.autocast(
            self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None
        )

    def _stacked_buffers(self, members: Sequence[int]) -> dict[str, torch.Tensor]:
        return {
            name: torch.stack([self._buffers[k][j] for k in members])
            for j, name in enumerate(self._buffer_names)
        }

    def _losses(
        self,
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        images: torch.Tensor,
        texts: torch.Tensor,
        epoch: int,
    ) -> torch.Tensor:
        """[K] losses: the method's loss (:func:`~asymvlm.distributed.global_batch_loss`)
        vmapped over stacked parameters and buffers [K, ...] and batches [K, B, d]."""

        def one(p: dict, b: dict, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
            return functional_call(self._template, (p, b), (image_emb, text_emb, epoch))

        with self._autocast():
            return vmap(one, randomness="error")(params, buffers, images, texts)

    def _probe(self) -> str | None:
        """None when one batched forward and backward pass over all members works, leaves the
        buffers untouched and gives each member its own loss; else the reason it does not."""
        everyone = range(len(self))
        lead = self.trainers[0]
        rows = torch.arange(lead.batch_size, device=self.device)
        image = lead.data.image_emb[lead.data.text_to_image[rows]]
        text = lead.data.text_emb[rows]
        shape = (len(self), *image.shape)
        params = {
            name: torch.stack([self._params[k][j] for k in everyone])
            for j, name in enumerate(self._param_names)
        }
        buffers = self._stacked_buffers(everyone)
        before = {name: b.clone() for name, b in buffers.items()}
        for m in self.methods:
            m.train()
        try:
            losses = self._losses(params, buffers, image.expand(shape), text.expand(shape), 0)
            losses.sum().backward()
        except Exception as exc:  # any failure means: not vmappable; train one by one
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            for trainer in self.trainers:
                assert trainer.optimizer is not None
                trainer.optimizer.zero_grad(set_to_none=True)
        changed = [n for n in before if not torch.equal(before[n], buffers[n])]
        if changed:
            return f"its loss changes buffers ({', '.join(changed)})"
        rtol = 1e-4 if lead.autocast is None else 2e-2
        with torch.no_grad(), self._autocast():
            for k in everyone:
                tensors = dict(zip(self._param_names, self._params[k], strict=True))
                buffers_k = zip(self._buffer_names, self._buffers[k], strict=True)
                tensors.update((n, b.clone()) for n, b in buffers_k)
                own = functional_call(self._template, tensors, (image, text, 0)).float()
                packed = losses[k].detach().float()
                if not bool(torch.isclose(packed, own, rtol=rtol, atol=1e-6, equal_nan=True)):
                    return (
                        f"member {k}'s batched loss {float(packed):.6g} differs from its own "
                        f"{float(own):.6g}"
                    )
        return None

    def _step(
        self,
        alive: Sequence[int],
        rows: torch.Tensor | None,
        buffers: dict[str, torch.Tensor],
        images: torch.Tensor,
        texts: torch.Tensor,
        epoch: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward pass of one step for the ``alive`` members (``rows`` of the
        stacked leaves, None: all): their [K] losses and [K] step codes (``Trainer._step_code``
        per member: 0 fine, else loss/gradient bits). The optimisers have not stepped yet."""
        params = {
            name: leaf if rows is None else leaf[rows]
            for name, leaf in zip(self._param_names, self._leaves, strict=True)
        }
        losses = self._losses(params, buffers, images, texts, epoch)
        for leaf in self._leaves:
            leaf.grad = None
        losses.sum().backward()
        losses = losses.detach()
        code = (~torch.isfinite(losses)).long() * LOSS_BAD
        # Each member's gradients are rows of the stacked ones (what zero_grad + backward
        # would leave on its parameters: None where the loss does not reach a parameter).
        for j, leaf in enumerate(self._leaves):
            grad = leaf.grad
            for k in alive:
                self._params[k][j].grad = None if grad is None else grad[k]
        grads = [leaf.grad for leaf in self._leaves if leaf.grad is not None]
        if grads:
            code = code + self._grad_bad(grads, rows).long() * GRAD_BAD
        return losses, code

    def _grad_bad(self, grads: list[torch.Tensor], rows: torch.Tensor | None) -> torch.Tensor:
        """[K] bool: whether a live member's gradient (``rows`` of the stacked ones, None: all)
        holds a non-finite value (``Trainer``'s check: a non-finite max-norm). On the CPU,
        where the max-norm is slow, the 2-norm screens (finite when every entry is, barring
        overflow) and the max-norm decides."""

        def norms(order: float) -> torch.Tensor:  # [K alive, n grads]
            flat = [g.reshape(g.shape[0], -1) for g in grads]
            if rows is not None:
                flat = [f[rows] for f in flat]
            return torch.stack([torch.linalg.vector_norm(f, order, dim=1) for f in flat], 1)

        if not self.trainers[0].sync_free:
            return ~torch.isfinite(norms(math.inf)).all(dim=1)
        screen = ~torch.isfinite(norms(2.0)).all(dim=1)
        if bool(screen.any()):
            return ~torch.isfinite(norms(math.inf)).all(dim=1)
        return screen

    def _packed_epoch(self, alive: list[int]) -> dict[int, EpochRow]:
        """One epoch of the live members (all at the pack's epoch); returns the rows of those
        that finished it (``Trainer.train_epoch``'s rows, ``epoch_seconds`` the pack's)."""
        t0 = time.perf_counter()
        epoch, device = self.epoch, self.device
        lead = self.trainers[alive[0]]
        data, batch, steps = lead.data, lead.batch_size, lead.steps
        n_text = data.text_emb.shape[0]
        for k in alive:
            self.trainers[k].begin_epoch()
        perms = torch.stack(
            [
                torch.randperm(
                    n_text,
                    device=device,
                    generator=epoch_generator(self.cfgs[k].seed, 0, epoch, device),
                )
                for k in alive
            ]
        )
        totals = torch.zeros(len(alive), device=device)
        first_bad = torch.full((len(alive),), NO_BAD_STEP, dtype=torch.long, device=device)
        buffers = self._stacked_buffers(alive)
        sync_free = lead.sync_free

        def rows_of(members: list[int]) -> torch.Tensor | None:
            if len(members) == len(self):
                return None
            return torch.tensor(members, device=device)

        rows = rows_of(alive)
        for step in range(steps):
            idx = perms[:, step * batch : (step + 1) * batch]
            images, texts = data.image_emb[data.text_to_image[idx]], data.text_emb[idx]
            losses, code = self._step(alive, rows, buffers, images, texts, epoch)
            if sync_free:  # the CPU: a member stops at its bad step, before its update
                bits = code.tolist()
                if any(bits):
                    for k, b in zip(alive, bits, strict=True):
                        if b:
                            self._fail(k, self.trainers[k].divergence(step * 4 + b, deferred=False))
                    keep = [i for i, b in enumerate(bits) if not b]
                    if not keep:
                        return {}
                    alive = [alive[i] for i in keep]
                    rows = rows_of(alive)
                    keep_t = torch.tensor(keep, device=device)
                    perms, totals, losses = perms[keep_t], totals[keep_t], losses[keep_t]
                    first_bad = first_bad[keep_t]
                    buffers = {name: b[keep_t] for name, b in buffers.items()}
            else:  # accelerators: no host sync; the first bad step is read with the epoch's loss
                candidate = torch.where(code > 0, code + step * 4, NO_BAD_STEP)
                torch.minimum(first_bad, candidate, out=first_bad)
            for k in alive:
                trainer = self.trainers[k]
                assert trainer.optimizer is not None and trainer.scheduler is not None
                trainer.optimizer.step()
                trainer.scheduler.step()
            totals += losses
        rows_out: dict[int, EpochRow] = {}
        for i, k in enumerate(alive):
            trainer = self.trainers[k]
            try:
                with self.member_rng(k):
                    rows_out[k] = trainer.end_epoch(totals[i], first_bad[i])
            except NonFiniteError as exc:
                self._fail(k, exc)
        seconds = time.perf_counter() - t0
        for row in rows_out.values():
            row["epoch_seconds"] = seconds
        return rows_out
