"""Data-parallel training over the global batch (Eq. 2, App. A.3), as open_clip's distributed loss:
each worker's encodings all-gathered (autograd-aware), so that with DDP's gradient averaging N
workers x b rows equal one process with batch N * b (Ray Train: ``asymvlm_ray.ray_train``)."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_gather

from asymvlm.methods import Method


class GlobalBatchLoss(nn.Module):
    """``method``'s loss over the global batch: local encodings, all-gathered (every worker's
    rows in rank order; each worker's gradient reaches its own rows), then the objective. A
    module, for ``DistributedDataParallel``; outside a process group it is ``method.loss``."""

    def __init__(self, method: Method) -> None:
        super().__init__()
        self.method = method

    def forward(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor, epoch: int = 0
    ) -> torch.Tensor:
        images, texts = self.method.loss_features(image_emb, text_emb)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            images, texts = (
                {key: torch.cat(all_gather(value), dim=0) for key, value in enc.items()}
                for enc in (images, texts)
            )
        return self.method.pair_loss(images, texts, epoch=epoch)


def shard_rows(n: int, rank: int, world_size: int, seed: int) -> torch.Tensor:
    """The rows worker ``rank`` trains on: every ``world_size``-th row of a seeded permutation
    (disjoint shards, covering the n rows, sizes within one; one worker's is ``arange(n)``)."""
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
