"""Data-parallel training on cached embeddings: contrastive objectives over the global batch.

Every contrastive objective here (InfoNCE Eq. 2, SigLIP App. A.3, PCME++, ProLIP, ELIP) pairs
each item with every other item of its batch. With N workers holding b rows each, the batch a
worker sees must be the *global* one of N * b rows, or training changes with the number of
workers. As open_clip's distributed loss does, each worker encodes its own rows, all-gathers the
encodings and evaluates the objective on the global batch; the gather is autograd-aware, so
gradients flow back to every worker's own rows. Every worker computes the same global loss L,
so the gradient reaching a worker's rows is N * dL/d(rows) and DDP's averaging brings the
parameters' gradient back to exactly dL/dtheta: N workers x b = one process with batch N * b
(tested on gloo).

This is plain ``torch.distributed``; the Ray Train wiring (process groups, devices) lives in
``pipelines/``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from asymvlm.methods import Encoding, Method

__all__ = [
    "GlobalBatchLoss",
    "epoch_generator",
    "gather_encoding",
    "global_batch_loss",
    "is_distributed",
    "shard_rows",
]


def is_distributed() -> bool:
    """True inside an initialised process group of more than one worker."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class _AllGather(torch.autograd.Function):
    """Concatenate equal-sized row blocks of every worker; the backward pass hands each worker
    the sum over workers of the gradient of its own block (all-reduce, then this rank's slice:
    works on gloo, which has no reduce-scatter, and on NCCL)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.rank, ctx.rows = dist.get_rank(), x.shape[0]
        blocks = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(blocks, x.contiguous())
        return torch.cat(blocks, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone(memory_format=torch.contiguous_format)  # may alias another grad
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def gather_encoding(encoding: Encoding) -> Encoding:
    """Concatenate every worker's rows (in rank order), keeping gradients to the local rows.

    Every worker must hold the same number of rows (the same local batch size).
    """
    if not is_distributed():
        return encoding
    return {key: _AllGather.apply(value) for key, value in encoding.items()}


def global_batch_loss(
    method: Method, image_emb: torch.Tensor, text_emb: torch.Tensor, *, epoch: int = 0
) -> torch.Tensor:
    """``method``'s loss over the global batch: local encodings, all-gathered, then the objective.

    Outside a process group (or with one worker) this is ``method.loss`` exactly.
    """
    images, texts = method.loss_features(image_emb, text_emb)
    return method.pair_loss(gather_encoding(images), gather_encoding(texts), epoch=epoch)


class GlobalBatchLoss(nn.Module):
    """``forward(image_emb, text_emb, epoch)`` = :func:`global_batch_loss`, for wrapping in
    ``DistributedDataParallel`` (whose gradient hooks need the loss computed in a forward)."""

    def __init__(self, method: Method) -> None:
        super().__init__()
        self.method = method

    def forward(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor, epoch: int = 0
    ) -> torch.Tensor:
        return global_batch_loss(self.method, image_emb, text_emb, epoch=epoch)


def shard_rows(n: int, rank: int, world_size: int, seed: int) -> torch.Tensor:
    """The rows worker ``rank`` trains on: every ``world_size``-th row of a seeded permutation.

    Shards are disjoint, cover all n rows and differ in size by at most one; with one worker the
    shard is ``arange(n)`` in order.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a world of {world_size}")
    if world_size == 1:
        return torch.arange(n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[rank::world_size].sort().values


def epoch_generator(seed: int, rank: int, epoch: int, device: torch.device) -> torch.Generator:
    """The generator of worker ``rank``'s permutation in ``epoch``: a pure function of the three,
    so a run resumed from a checkpoint at epoch e draws exactly the permutations it would have."""
    state = np.random.SeedSequence([seed, rank, epoch]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state) & ((1 << 63) - 1))
