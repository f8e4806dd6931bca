"""Evaluation at scale: time and peak memory of ``evaluate_retrieval`` on a large random split.

``asymvlm evaluate`` loads a checkpoint and the tables, then runs
:func:`asymvlm.evaluation.evaluate_retrieval`; this script runs that function on an in-memory
split of random unit embeddings (default 200,000 captions x 40,000 images, d = 512) with an
untrained adapter (``asymvlm-vmf``: the scores have the log-likelihood's scale and ties), in a
fresh child process so that its peak RSS (``VmHWM``, reset just before the evaluation) is the
evaluation's own. It reports:

* ``seconds`` / ``cpu_seconds`` of the evaluation, split into the adapter's encodings, the
  score matrix (``method.score``, timed in place) and the ranking pass (the rest);
* ``peak_rss_bytes``, ``table_bytes`` (the split's tensors, the images' encodings and one block
  of the captions', and the per-query results: what any evaluation must hold) and
  ``peak_minus_table_bytes`` (peak RSS minus the interpreter's RSS before the split was made and
  minus the tables: the chunk's working memory plus allocator slack), against
  ``chunk_size * n_images * SCORE_WORK_BYTES``;
* ``score_matmul_flops_per_s``: ``2 n_captions n_images d`` over the time spent in ``score``;
* ``estimate_1m``: the time of a 1M x 1M evaluation at this machine's measured rates and on one
  GPU at assumed peak rates (named in the JSON): the score matmul at the GPU's fp32 / TF32
  throughput, the ranking pass at its memory bandwidth (it is a few linear passes over every
  score, ``RANK_BYTES_PER_SCORE`` bytes of memory traffic in all).

One JSON object goes to stdout, progress to stderr::

    .venv/bin/python benchmarks/eval_scale.py [--captions 200000 --images 40000 --dim 512]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from _common import cpu_model, loadavg, logger  # noqa: E402

log = logger("eval_scale")

#: Memory traffic of the ranking pass per score entry (bytes read + written), counted from
#: ``asymvlm.metrics.rank_pass`` and the finiteness check of ``evaluate_retrieval``:
#: finiteness sums 2 x 4; t2i rank: ``>`` and ``==`` passes 2 x (4 + 1 + 1); argmax 4;
#: float64 copy and scale 4 + 8 + 8 + 8; ``logsumexp`` over rows and over columns, each amax 8,
#: subtract 8 + 8, exp 8 + 8, sum 8 (2 x 48); i2t: ``>`` the running k-th best 4 + 1 + 1 and
#: the top-k of the beaten columns <= 4. The score matrix itself (written once, 4) is
#: counted with the matmul.
RANK_BYTES_PER_SCORE = 8 + 12 + 4 + 28 + 96 + 6 + 4

#: Elementwise operations of the ranking pass per score, from the same count: 2 finiteness
#: adds, 2 comparisons and 2 counts (t2i rank), argmax, float64 cast and scale, 2 x (amax,
#: subtract, exp, add) for the row and column log-sum-exp, comparison and any (i2t). Against
#: the 2 d = 1024 FLOPs of a score's dot product they are nothing: the pass is bound by memory
#: bandwidth, not arithmetic.
RANK_OPS_PER_SCORE = 2 + 4 + 1 + 2 + 8 + 2

#: One GPU, peak rates from NVIDIA's H100 SXM5 datasheet (dense, no sparsity). PyTorch runs
#: float32 matmuls in full fp32 unless TF32 is allowed
#: (``torch.backends.cuda.matmul.allow_tf32``), so both are given.
GPU = {
    "name": "NVIDIA H100 SXM5 80GB (datasheet peaks, dense)",
    "fp32_flops_per_s": 67e12,
    "tf32_flops_per_s": 494.7e12,
    "memory_bytes_per_s": 3.35e12,
    "memory_bytes": 80e9,
}


def _status_bytes(key: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process in bytes (Linux ``/proc/self/status``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


# -- the measured child -------------------------------------------------------------------------
def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """Build the split, run ``evaluate_retrieval`` once, return what was measured."""
    import torch

    from asymvlm.evaluation import evaluate_retrieval
    from asymvlm.evaluation.retrieval import ENCODE_ROWS
    from asymvlm.methods import build_method
    from asymvlm.metrics import SCORE_WORK_BYTES, chunk_rows
    from asymvlm.splits import SplitTensors

    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    n_text, n_image, dim = cfg["captions"], cfg["images"], cfg["dim"]
    device = torch.device(cfg["device"])
    rss_start = _status_bytes("VmRSS")

    g = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(n_image, dim, generator=g), dim=-1)
    text_to_image = torch.arange(n_text) % n_image
    texts = torch.empty(n_text, dim)
    for s in range(0, n_text, 65536):  # raw text projections near the paired image, norm ~8
        rows = text_to_image[s : s + 65536]
        noise = torch.randn(rows.shape[0], dim, generator=g) / dim**0.5
        texts[s : s + 65536] = 8.0 * torch.nn.functional.normalize(images[rows] + noise, dim=-1)
    data = SplitTensors(
        image_emb=images.to(device),
        text_emb=texts.to(device),
        text_to_image=text_to_image.to(device),
        split=None,
    )
    del images, texts
    torch.manual_seed(0)
    method = build_method(cfg["method"], dim).to(device).eval()

    # Time spent in the adapter (encodings) and in the score matrix, measured in place.
    spent = {"encode": 0.0, "score": 0.0}
    shapes: list[tuple[int, int]] = []

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            sync()
            spent[name] += time.perf_counter() - t0
            if name == "score":
                shapes.append(tuple(out.shape))
            return out

        return wrapper

    method.encode_texts = timed("encode", method.encode_texts)  # type: ignore[method-assign]
    method.encode_images = timed("encode", method.encode_images)  # type: ignore[method-assign]
    method.score = timed("score", method.score)  # type: ignore[method-assign]

    with torch.no_grad():
        probe = method.encode_texts(data.text_emb[:1]), method.encode_images(data.image_emb[:1])
    spent["encode"] = 0.0
    row_bytes = [sum(v.element_size() * v[0].numel() for v in e.values()) for e in probe]
    tensors = (data.text_emb, data.image_emb, data.text_to_image)
    input_bytes = sum(t.element_size() * t.numel() for t in tensors)
    # the images' encodings whole, the captions' one block at a time (as the rank pass reaches it)
    encoding_bytes = min(n_text, ENCODE_ROWS) * row_bytes[0] + n_image * row_bytes[1]
    # Ranking / metrics per query: t2i rank, top-1, confidence, uncertainty (8 B each) per
    # caption; i2t top-10 captions (80 B), rank, confidence, has_caption per image.
    result_bytes = n_text * 4 * 8 + n_image * (10 * 8 + 8 + 8 + 1)
    table_bytes = input_bytes + encoding_bytes + result_bytes

    chunk = cfg["chunk_size"] or chunk_rows(n_image, cfg["memory_budget"])
    log(
        f"{cfg['method']}: {n_text} captions x {n_image} images, d={dim}, chunk {chunk}, "
        f"threads {torch.get_num_threads()}, device {device}"
    )
    rss_before = _status_bytes("VmRSS")
    reset = _reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    c0, t0 = time.process_time(), time.perf_counter()
    result = evaluate_retrieval(method, data, chunk_size=chunk)
    sync()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    peak = _status_bytes("VmHWM")

    score_flops = 2 * n_text * n_image * dim
    rank_seconds = seconds - spent["score"] - spent["encode"]
    peak_minus_table = peak - rss_start - table_bytes
    return {
        "n_captions": n_text,
        "n_images": n_image,
        "d": dim,
        "method": cfg["method"],
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),
        "encode_seconds": round(spent["encode"], 2),
        "score_seconds": round(spent["score"], 2),
        "rank_seconds": round(rank_seconds, 2),
        "rank_ns_per_score": round(rank_seconds / (n_text * n_image) * 1e9, 3),
        "score_matmul_flops": score_flops,
        "score_matmul_flops_per_s": score_flops / spent["score"],
        "chunk_size": chunk,
        "n_chunks": len(shapes),
        "largest_score_block": list(max(shapes)),
        "rss_start_bytes": rss_start,
        "rss_before_eval_bytes": rss_before,
        "peak_rss_bytes": peak,
        "peak_rss_is_eval_only": reset,
        "table_bytes": table_bytes,
        "table_bytes_parts": {
            "inputs": input_bytes,
            "encodings": encoding_bytes,
            "results": result_bytes,
        },
        "peak_minus_table_bytes": peak_minus_table,
        "chunk_work_bytes_predicted": chunk * n_image * SCORE_WORK_BYTES,
        "chunk_bytes_per_score_measured": round(peak_minus_table / (chunk * n_image), 2),
        "recall_at_1": [result["t2i"]["recall@1"], result["i2t"]["recall@1"]],
        # On a GPU the tables and chunks live in device memory: torch's allocator peak.
        "cuda_peak_allocated_bytes": (
            torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        ),
    }


# -- the 1M x 1M estimate -----------------------------------------------------------------------
def estimate(measured: dict[str, Any], n: int = 1_000_000) -> dict[str, Any]:
    """Seconds of an ``n`` captions x ``n`` images evaluation (same d): at this machine's
    measured score FLOP/s and ranking ns per score, and on :data:`GPU` at peak rates."""
    from asymvlm.metrics import SCORE_WORK_BYTES

    d = measured["d"]
    scores = n * n
    flops = 2 * scores * d
    rank_bytes = scores * RANK_BYTES_PER_SCORE
    here_matmul = flops / measured["score_matmul_flops_per_s"]
    here_rank = scores * measured["rank_ns_per_score"] * 1e-9
    gpu_tables = 4 * n * d * 4  # text inputs and mu, image inputs and mu (float32)
    gpu_budget = 8 * 2**30
    matmul_bytes = 4 * scores  # the score matrix, written once
    gpu_rank = rank_bytes / GPU["memory_bytes_per_s"]
    fp32 = max(flops / GPU["fp32_flops_per_s"], matmul_bytes / GPU["memory_bytes_per_s"])
    tf32 = max(flops / GPU["tf32_flops_per_s"], matmul_bytes / GPU["memory_bytes_per_s"])
    return {
        "n_captions": n,
        "n_images": n,
        "d": d,
        "score_matmul_flops": flops,
        "rank_ops_per_score": RANK_OPS_PER_SCORE,
        "rank_ops": scores * RANK_OPS_PER_SCORE,
        "rank_bytes_per_score": RANK_BYTES_PER_SCORE,
        "rank_memory_traffic_bytes": rank_bytes,
        "this_machine": {
            "assumes": "measured score_matmul_flops_per_s and rank_ns_per_score of this run, "
            "both linear in the number of scores",
            "matmul_seconds": round(here_matmul),
            "rank_seconds": round(here_rank),
            "total_hours": round((here_matmul + here_rank) / 3600, 1),
        },
        "gpu": {
            "assumes": GPU,
            "memory_budget_bytes": gpu_budget,
            "chunk_size": gpu_budget // (SCORE_WORK_BYTES * n),
            "table_bytes": gpu_tables,
            "matmul_seconds_fp32": round(fp32, 1),
            "matmul_seconds_tf32": round(tf32, 1),
            "rank_seconds_at_peak_bandwidth": round(gpu_rank, 1),
            "total_seconds_fp32": round(fp32 + gpu_rank, 1),
            "total_seconds_tf32": round(tf32 + gpu_rank, 1),
            "note": "lower bounds at datasheet peaks; elementwise passes typically reach "
            "70-90 % of peak bandwidth",
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--captions", type=int, default=200_000)
    p.add_argument("--images", type=int, default=40_000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--method", default="asymvlm-vmf")
    p.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help="captions per chunk (default: from --memory-budget)",
    )
    p.add_argument(
        "--memory-budget",
        type=int,
        default=None,
        metavar="BYTES",
        help="working memory of one chunk (default: the library's 512 MiB)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return {}

    cfg = {
        k: getattr(args, k)
        for k in (
            "captions",
            "images",
            "dim",
            "method",
            "chunk_size",
            "memory_budget",
            "threads",
            "device",
        )
    }
    load_before = loadavg()
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {
        **measured,
        "cpu": cpu_model(),
        "loadavg_1min_before_after": [load_before, loadavg()],
        "estimate_1m": estimate(measured),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
