"""Data-parallel training: two gloo workers equal one process with the global batch."""

from __future__ import annotations

import faulthandler
import os
import time
from queue import Empty

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from asymvlm.distributed import GlobalBatchLoss, epoch_generator, shard_rows
from asymvlm.methods import build_method
from asymvlm.splits import SplitTensors
from asymvlm.training import TrainConfig, Trainer
from tests.helpers import rotated_pairs

#: Every trainable objective family: InfoNCE / SigLIP kernels, Gaussian ablation, the image-side
#: ablation, the post-hoc baselines, ProbVLM (per-item loss) and ELIP (evidential, both ways).
METHODS = "asymvlm-vmf asymvlm-ps-siglip symvlm asymvlm-image asymvlm-gauss determ-ft pfe".split()
METHODS += ["pcmepp", "prolip", "probvlm", "elip"]
DIM, BATCH, WORLD = 8, 12, 2


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    img, txt = rotated_pairs(BATCH, DIM, noise=0.3, seed=3)
    return img.double(), (2.0 * txt).double()


def _method(name: str):
    torch.manual_seed(0)
    method = build_method(name, DIM, hidden_dim=16).double()
    img, txt = _batch()
    method.fit_start(img, txt)
    return method


def _losses_and_grads(rank: int) -> dict:
    """Each method's loss and gradients from this worker's half of the batch, under DDP."""
    img, txt = _batch()
    rows = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    out = {}
    for name in METHODS:
        method = _method(name)
        ddp = DistributedDataParallel(GlobalBatchLoss(method))
        loss = ddp(img[rows], txt[rows], 3)
        loss.backward()
        params = method.named_parameters()
        grads = {k: p.grad.numpy().copy() for k, p in params if p.grad is not None}
        out[name] = (loss.item(), grads)  # plain arrays: no shared memory to outlive us
    return out


def _worker(rank: int, port: int, queue) -> None:
    # past 100 s (a run takes ~5) every thread's stack goes to stderr and the worker exits
    faulthandler.dump_traceback_later(100, exit=True)
    torch.set_num_threads(1)  # two workers on a 2-core machine, beside the other xdist worker
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    try:
        # DDP's reducers are gone when this returns. One outliving the group would be its last
        # owner and join gloo's threads holding the GIL, which a thread freeing a finished
        # collective needs: a deadlock under load (pytorch/pytorch#56297).
        queue.put((rank, _losses_and_grads(rank)))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_worker_results() -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    # The store lives here, on a port the kernel picked: the workers only connect to it.
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = [ctx.Process(target=_worker, args=(r, server.port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + 300
    while len(results) < WORLD:
        assert time.monotonic() < deadline, "the gloo workers are still running after 300 s"
        try:
            results.update([queue.get(timeout=5)])  # one (rank, results) pair
        except Empty:
            codes = [p.exitcode for p in procs]
            assert all(c in (None, 0) for c in codes), f"a gloo worker died: exit codes {codes}"
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("name", METHODS)
def test_two_gloo_workers_match_one_process(two_worker_results, name) -> None:
    method = _method(name)
    img, txt = _batch()
    loss = method.loss(img, txt, epoch=3)
    loss.backward()
    want = {k: p.grad for k, p in method.named_parameters() if p.grad is not None}
    assert want, "the method has trainable parameters"
    for rank in range(WORLD):
        got_loss, got = two_worker_results[rank][name]
        assert got_loss == pytest.approx(loss.item(), rel=1e-10, abs=1e-12)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(
                got[key], want[key].numpy(), rtol=1e-9, atol=1e-12, err_msg=key
            )


def test_shards_are_disjoint_and_cover_every_row() -> None:
    shards = [shard_rows(103, r, 4, seed=7) for r in range(4)]
    allrows = torch.cat(shards)
    assert sorted(allrows.tolist()) == list(range(103))
    assert {len(s) for s in shards} == {25, 26}
    assert torch.equal(shard_rows(103, 2, 4, seed=7), shards[2])  # deterministic
    assert not torch.equal(shard_rows(103, 2, 4, seed=8), shards[2])
    assert torch.equal(shard_rows(10, 0, 1, seed=7), torch.arange(10))
    with pytest.raises(ValueError, match="rank 4"):
        shard_rows(10, 4, 4, seed=0)


def test_epoch_generators_differ_by_seed_rank_and_epoch() -> None:
    def perm(*key: int) -> list[int]:
        return torch.randperm(50, generator=epoch_generator(*key, torch.device("cpu"))).tolist()

    assert perm(0, 0, 3) == perm(0, 0, 3), "a fresh generator of one key draws the same order"
    assert len({tuple(perm(*k)) for k in [(0, 0, 3), (1, 0, 3), (0, 1, 3), (0, 0, 4)]}) == 4


def test_batch_must_split_evenly_across_workers() -> None:
    img, txt = rotated_pairs(40, DIM, seed=0)
    data = SplitTensors(img, txt, torch.arange(40), split=None)  # type: ignore[arg-type]
    method = build_method("asymvlm-vmf", DIM, hidden_dim=16)
    with pytest.raises(ValueError, match="not divisible by 3 workers"):
        Trainer(method, TrainConfig(batch_size=16), data, rank=0, world_size=3)
    trainer = Trainer(method, TrainConfig(batch_size=16), data, rank=1, world_size=2)
    assert trainer.batch_size == 8 and trainer.data.text_emb.shape[0] == 20
    assert trainer.steps == 20 // 8
