"""Training throughput of ``asymvlm.training.Trainer`` against a naive DataLoader loop.

Builds a random in-memory split (unit image embeddings, raw text inputs, a caption -> image
index), then measures side by side, interleaved (A, B, then B, A, ...) so that machine noise hits
both:

* ``Trainer.train_epoch()`` -- the real step loop (data on the device, one permutation per
  epoch, batches sliced out of it);
* the same model, loss, optimiser and schedule driven by ``DataLoader(TensorDataset(...),
  shuffle=True, drop_last=True)`` with the default collate, the way such loops are usually
  written.

It also measures the machine's fp32 matmul throughput (square ``torch.mm``), counts the matmul
FLOPs of one training step analytically, and reports which fraction of the matmul peak a step
reaches. One JSON object goes to stdout, progress
to stderr::

    .venv/bin/python benchmarks/train_throughput.py [--batch-size 2048 --threads 2 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import cpu_model, logger  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset

from asymvlm.methods import Method, build_method
from asymvlm.splits import SplitTensors
from asymvlm.training import TrainConfig, Trainer
from asymvlm.training.trainer import make_optimizer

log = logger("train_throughput")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- data ---------------------------------------------------------------------------------------
def random_split(
    n_text: int, dim: int, captions_per_image: int, device: torch.device, seed: int = 0
) -> SplitTensors:
    """A random split held in memory: unit images, raw (unnormalised) texts, caption -> image."""
    g = torch.Generator().manual_seed(seed)
    n_image = max(1, n_text // captions_per_image)
    image = torch.nn.functional.normalize(torch.randn(n_image, dim, generator=g), dim=-1)
    text_to_image = torch.arange(n_text) % n_image
    # Raw CLIP text projections: a direction near the paired image, with a norm of ~6..10.
    direction = torch.nn.functional.normalize(
        image[text_to_image] + 0.5 * torch.randn(n_text, dim, generator=g) / dim**0.5, dim=-1
    )
    norms = 6.0 + 4.0 * torch.rand(n_text, 1, generator=g)
    return SplitTensors(
        image_emb=image.to(device),
        text_emb=(direction * norms).to(device),
        text_to_image=text_to_image.to(device),
        split=None,  # type: ignore[arg-type]  # only train() reads it (the manifest)
    )


# -- analytic cost ------------------------------------------------------------------------------
def mlp_shapes(d_in: int, d_out: int, hidden_dim: int, depth: int) -> list[tuple[int, int]]:
    """(in, out) of every Linear in ``asymvlm.methods.base.mlp``."""
    widths = [d_in] + [hidden_dim] * depth + [d_out]
    return list(zip(widths[:-1], widths[1:], strict=True))


def step_matmul_flops(
    batch: int, dim: int, hidden_dim: int, depth: int, *, image_grad: bool = False
) -> int:
    """Matmul FLOPs of one AsymVLM-vMF training step (forward + backward), batch size B.

    Only matrix products are counted (one multiply-add = 2 FLOPs)::

        text adapter, Linear(in, out) of mlp(d, d, hidden, depth):
            forward   2 B in out
            backward  2 B in out (dW)  +  2 B in out (dX)      -> 3x forward
            first Linear: its input (cached embeddings) needs no gradient, no dX -> 2x forward
        log-likelihood  tau L = addmm(tau ln C, eta, z^T), [B, d] x [d, B]:
            forward   2 B B d
            backward  2 B B d (d eta = G z)  [+ 2 B B d (d z = G^T eta) if image_grad]

    For AsymVLM-vMF the images are cached and frozen, so autograd skips d z: the default
    ``image_grad=False`` counts what actually runs. Everything else (ReLU, norms, softmax,
    cross-entropy, the SGD update) is elementwise / reduction work: the overhead that
    ``fraction_of_peak`` charges against the step.
    """
    flops = 0
    for i, (d_in, d_out) in enumerate(mlp_shapes(dim, dim, hidden_dim, depth)):
        flops += 2 * batch * d_in * d_out * (2 if i == 0 else 3)
    flops += (3 if image_grad else 2) * (2 * batch * batch * dim)
    return flops


# -- machine peak -------------------------------------------------------------------------------
class MatmulPeak:
    """Best fp32 ``torch.mm`` throughput over square sizes; FLOPs = 2 n^3.

    ``sample()`` is called between the timed epochs, so the peak is a best-of taken under the
    same (shared-machine) conditions as the steps it is compared with.
    """

    def __init__(self, device: torch.device, sizes: tuple[int, ...] = (2048, 4096)) -> None:
        self.device = device
        g = torch.Generator(device=device).manual_seed(0)
        self.operands = {
            n: (
                torch.randn(n, n, device=device, generator=g),
                torch.randn(n, n, device=device, generator=g),
                torch.empty(n, n, device=device),
            )
            for n in sizes
        }
        self.best: dict[int, float] = dict.fromkeys(sizes, 0.0)
        for a, b, out in self.operands.values():
            torch.mm(a, b, out=out)  # warm-up

    def sample(self, reps: int = 2) -> None:
        for n, (a, b, out) in self.operands.items():
            for _ in range(reps):
                sync(self.device)
                t0 = time.perf_counter()
                torch.mm(a, b, out=out)
                sync(self.device)
                self.best[n] = max(self.best[n], 2 * n**3 / (time.perf_counter() - t0))

    @property
    def flops_per_s(self) -> float:
        return max(self.best.values())


# -- the naive loop -----------------------------------------------------------------------------
class DataLoaderLoop:
    """Same model/loss/optimiser/schedule as ``Trainer``, fed by a shuffling DataLoader."""

    def __init__(self, method: Method, cfg: TrainConfig, data: SplitTensors) -> None:
        self.method = method.to(data.image_emb.device)
        dataset = TensorDataset(data.image_emb[data.text_to_image], data.text_emb)
        self.loader = DataLoader(
            dataset, batch_size=cfg.batch_size, shuffle=True, drop_last=True, num_workers=0
        )
        self.optimizer = make_optimizer(method, cfg)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.optimizer, T_max=max(1, cfg.epochs * len(self.loader)), eta_min=cfg.min_lr
        )
        self.epoch = 0

    def train_epoch(self) -> float:
        self.method.train()
        running = 0.0
        for images, texts in self.loader:
            loss = self.method.loss(images, texts, epoch=self.epoch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            running += loss.item()
        self.epoch += 1
        return running / len(self.loader)


def timed_epoch(run: Callable[[], Any], device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - t0


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="asymvlm-vmf")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--hidden-dim", type=int, default=1024)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--n-text", type=int, default=32768)
    p.add_argument("--captions-per-image", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2, help="schedule length (T_max); not timed")
    p.add_argument("--repeats", type=int, default=3, help="timed epochs per loop, interleaved")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--peak-sizes", default="2048,4096", help="square torch.mm sizes of the peak")
    args = p.parse_args(argv)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = TrainConfig(
        method=args.method,
        epochs=args.epochs,
        batch_size=args.batch_size,
        hidden_dim=args.hidden_dim,
        depth=args.depth,
        device=args.device,
        precision="fp32",
    )
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        log(
            f"load average {load_before[0]:.1f} on {os.cpu_count()} CPUs: other processes share "
            "the cores; timings (multi-threaded ones especially) will be noisy"
        )
    data = random_split(args.n_text, args.dim, args.captions_per_image, device)
    batch = min(args.batch_size, args.n_text)
    n_samples = (args.n_text // batch) * batch
    log(f"{args.method}: n_text={args.n_text} B={batch} threads={torch.get_num_threads()}")

    torch.manual_seed(0)
    trainer = Trainer(build_method(args.method, args.dim, **cfg.method_args()), cfg, data)
    trainer.start()
    torch.manual_seed(0)
    naive = DataLoaderLoop(build_method(args.method, args.dim, **cfg.method_args()), cfg, data)
    naive.method.load_state_dict(trainer.method.state_dict())  # the same (calibrated) model

    # Per-step times inside the real train_epoch (an instance attribute shadows the method).
    step_times: list[float] = []
    real_step = trainer.step

    def timed_step(images: torch.Tensor, texts: torch.Tensor, index: int = 0) -> torch.Tensor:
        sync(device)
        t0 = time.perf_counter()
        loss = real_step(images, texts, index)
        sync(device)
        step_times.append(time.perf_counter() - t0)
        return loss

    trainer.step = timed_step  # type: ignore[method-assign]

    peak = MatmulPeak(device, tuple(int(n) for n in args.peak_sizes.split(",")))
    log("warm-up epoch (both loops)")
    trainer.train_epoch()
    naive.train_epoch()
    peak.sample()
    step_times.clear()
    t_trainer, t_naive = [], []
    for r in range(args.repeats):  # A B, B A, A B ...: a load that drifts hits both alike
        for loop in (trainer, naive) if r % 2 == 0 else (naive, trainer):
            times = t_trainer if loop is trainer else t_naive
            times.append(timed_epoch(loop.train_epoch, device))
        peak.sample()
        log(
            f"repeat {r + 1}/{args.repeats}: trainer {t_trainer[-1]:.2f}s  "
            f"dataloader {t_naive[-1]:.2f}s"
        )
    trainer.step = real_step  # type: ignore[method-assign]

    # Best-of (like the matmul peak) is the least noise-sensitive figure on a shared machine;
    # the speedup is the median of the paired (interleaved) ratios.
    trainer_rate = n_samples / min(t_trainer)
    naive_rate = n_samples / min(t_naive)
    paired = [tn / tt for tt, tn in zip(t_trainer, t_naive, strict=True)]
    step_best, step_median = min(step_times), statistics.median(step_times)
    t0 = time.perf_counter()
    trainer.stats()  # part of every train_epoch(), not of the DataLoader loop
    stats_seconds = time.perf_counter() - t0

    peak.sample()
    log("torch.mm peak: " + ", ".join(f"{n}: {f / 1e9:.1f}" for n, f in peak.best.items()))
    flops = step_matmul_flops(batch, args.dim, args.hidden_dim, args.depth)

    result: dict[str, Any] = {
        "config": {**vars(args), "batch_size_effective": batch, "samples_per_epoch": n_samples},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "device": str(device),
        "loadavg_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "trainer_samples_per_s": round(trainer_rate, 1),
        "dataloader_samples_per_s": round(naive_rate, 1),
        "speedup": round(statistics.median(paired), 3),
        "speedup_best_vs_best": round(trainer_rate / naive_rate, 3),
        "trainer_samples_per_s_median": round(n_samples / statistics.median(t_trainer), 1),
        "dataloader_samples_per_s_median": round(n_samples / statistics.median(t_naive), 1),
        "trainer_epoch_seconds": [round(t, 3) for t in t_trainer],
        "dataloader_epoch_seconds": [round(t, 3) for t in t_naive],
        "trainer_stats_seconds": round(stats_seconds, 3),
        "matmul_flops_per_s": peak.flops_per_s,
        "matmul_flops_per_s_by_size": {str(n): f for n, f in peak.best.items()},
        "step_matmul_flops": flops,
        "step_seconds": round(step_best, 4),
        "step_seconds_median": round(step_median, 4),
        "step_flops_per_s": flops / step_best,
        "fraction_of_peak": round(flops / step_best / peak.flops_per_s, 3),
        "fraction_of_peak_median": round(flops / step_median / peak.flops_per_s, 3),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
