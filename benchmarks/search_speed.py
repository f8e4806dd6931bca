"""How fast is the kappa-aware search at a million images, beside FAISS alone?

    python benchmarks/search_speed.py [--images 1000000] [--dim 512] [--seconds 60]
                                      [--clients 4] [--queries 1000] [--no-vit]

Writes tables of ``--images`` clustered unit vectors (d = ``--dim``) with a caption per ten
images, a train split of 20,000 images and a val split of 2,000 (a caption each), an
asymvlm-vmf adapter (width 1024, depth 3) trained for 5 epochs on the train split over a tiny
random CLIP whose projection is d wide, and measures, side by side in one run:

* **build**: ``asymvlm index`` in a child process (its seconds and peak RSS), the kind chosen,
  the search depth tuned and its recall@10 against exact search;
* **recall**: recall@10 of the index against exact search (numpy, every image) on ``--queries``
  of the tables' captions after the build's sample, encoded by the adapter;
* **faiss_alone**: per query, FAISS's ``search`` of the same index at the same depth (k = 10);
* **in_process**: per query (the same captions), :meth:`Index.search_encoded_texts` (kappa, the
  decision, FAISS and the exact re-ranking), and each text tower's encoding of a caption apart;
* **served**: ``--clients`` client threads for ``--seconds`` each sending ``POST /search`` of
  one caption (k = 10) to ``pipelines/search.py``'s app on 127.0.0.1, one request at a time
  each (a bounded load); p50/p95 latency, client side. With the tiny text tower and (unless
  ``--no-vit``) a ViT-B/32-shaped random one, whose encoding share is reported.

Prints one JSON object (progress to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa
from _common import loadavg, logger, machine

log = logger("search_speed")
PART_ROWS = 65536


def write_tables(
    root: str, split: str, n_images: int, every: int, centers: np.ndarray, model: str, seed: int
) -> None:
    """Unit image vectors around ``centers`` and a caption per ``every`` images, near its
    image, in parts of :data:`PART_ROWS` rows."""
    from asymvlm import tables
    from asymvlm.embedding.encoders import load_encoder

    rng, dim = np.random.default_rng(seed), centers.shape[1]

    def unit(x: np.ndarray) -> np.ndarray:
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def vectors(x: np.ndarray) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), dim)

    for part, start in enumerate(range(0, n_images, PART_ROWS)):
        n = min(PART_ROWS, n_images - start)
        concept = rng.integers(0, len(centers), n)
        noise = rng.standard_normal((n, dim)).astype(np.float32)
        images = unit(centers[concept] + 0.02 * noise)  # cosine 0.9 to its concept
        ids = [f"img{start + i:07d}" for i in range(n)]
        image_rows = pa.table({"image_id": ids, "embedding": vectors(images)})
        tables.write_part(root, split, tables.IMAGES_DIR, f"part-{part:05d}", image_rows)
        owner = np.arange(0, n, every)
        texts = unit(
            images[owner] + 0.05 * rng.standard_normal((len(owner), dim)).astype(np.float32)
        )
        caption_rows = pa.table(
            {
                "caption_id": [f"{ids[i]}-c0" for i in owner],
                "image_id": [ids[i] for i in owner],
                "text": [f"caption of image {start + i}" for i in owner],
                "embedding": vectors(texts),
                "norm": pa.array(np.full(len(owner), 8.0, np.float32)),
            }
        )
        tables.write_part(root, split, tables.TEXTS_DIR, f"part-{part:05d}", caption_rows)
    info = load_encoder(model, device="cpu", load_model=False).info
    tables.write_manifest(root, tables.Manifest(dim=dim, model=model, extra=vars(info)))


def trained_adapter(folder: str, root: str) -> str:
    """An asymvlm-vmf adapter (the paper's width 1024, depth 3) trained a little on the train
    split, so that its queries land where their images are, as a trained adapter's do."""
    import asymvlm

    cfg = {"method": "asymvlm-vmf", "epochs": 5, "optimizer": "adamw", "lr": 1e-3}
    asymvlm.train(root, "train", cfg, output=folder, progress=False)
    return folder


def build(root: str, adapter: str, output: str) -> dict:
    """``asymvlm index`` in a child process: its seconds, peak RSS and the manifest's figures."""
    command = [sys.executable, "-m", "asymvlm.cli", "index", "--embeddings", f"{root}:test"]
    command += ["--checkpoint", adapter, "--output", output]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"asymvlm index failed:\n{done.stderr[-3000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    manifest = json.load(open(os.path.join(output, "manifest.json")))
    images = manifest["shards"][0]["images"]
    return {
        "seconds": round(seconds, 1),
        "peak_rss_gib": round(peak / 2**30, 3),
        "kind": images["spec"]["kind"],
        "lists": images["spec"]["lists"],
        "depth": images["spec"]["depth"],
        "build_recall_at_10": images["recall_at_10"],
        "index_bytes": os.path.getsize(os.path.join(output, "shard-00000", "images.faiss")),
    }


def exact_top10(image_mu: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The exact top 10 images of each query, over every image in blocks."""
    best = np.full((len(queries), 10), -np.inf, np.float32)
    rows = np.zeros((len(queries), 10), np.int64)
    for start in range(0, len(image_mu), 262144):
        scores = queries @ np.asarray(image_mu[start : start + 262144]).T
        top = np.argpartition(-scores, 10, axis=1)[:, :10]
        merged = np.concatenate([best, np.take_along_axis(scores, top, 1)], axis=1)
        ids = np.concatenate([rows, top + start], axis=1)
        keep = np.argsort(-merged, axis=1)[:, :10]
        best, rows = np.take_along_axis(merged, keep, 1), np.take_along_axis(ids, keep, 1)
    return rows


def percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {f"p{q}_ms": round(float(np.percentile(ms, q)), 3) for q in (50, 95, 99)}


def table_queries(root: str, index: Any, n: int) -> dict:
    """The adapter's encoding of ``n`` test captions after the build's sample (their stored
    embeddings): queries that land where a trained adapter puts real captions."""
    import pyarrow.parquet as pq

    from asymvlm.indexing.build import SAMPLE_QUERIES, encode_caption_batch

    part = pq.read_table(f"{root}/test/texts/part-00000.parquet")
    first = SAMPLE_QUERIES if part.num_rows >= SAMPLE_QUERIES + n else 0  # a tiny run: any
    rows = part.slice(first, n).combine_chunks().to_batches()[0]
    return encode_caption_batch(index.method, rows, first)


def in_process(index_dir: str, root: str, queries: list[str], towers: dict[str, str]) -> dict:
    """FAISS alone, the whole search on encoded queries, and each text tower, per query."""
    import torch

    from asymvlm.indexing import Index
    from asymvlm.indexing.kinds import recall_at

    index = Index.open(index_dir)
    shard = index.shards[0]
    encoded = table_queries(root, index, len(queries))
    queries = queries[: len(encoded["mu"])]
    mu = index.form.text_queries(encoded).float().numpy()
    faiss_alone, ours = [], []
    for i in range(len(queries)):
        one = {name: value[i : i + 1] for name, value in encoded.items()}
        t = time.perf_counter()
        shard.indexes["images"].search(np.ascontiguousarray(mu[i : i + 1]), 10)
        faiss_alone.append(time.perf_counter() - t)
        t = time.perf_counter()
        index.search_encoded_texts(one, [f"caption {i}"], 10)
        ours.append(time.perf_counter() - t)
    encode = {}
    for name, tower in towers.items():
        encoder = Index.open(index_dir, encoder=tower)
        encoder.encode_texts(queries[:2])  # loaded
        times = []
        for text in queries[:100]:
            t = time.perf_counter()
            with torch.no_grad():
                encoder.encode_texts([text])
            times.append(time.perf_counter() - t)
        encode[name] = percentiles(times)
    exact = exact_top10(shard.image_mu, mu)
    found = shard.indexes["images"].search(np.ascontiguousarray(mu), 10)[1]
    names = [f"caption {i}" for i in range(len(queries))]
    decisions = [r.decision for r in index.search_encoded_texts(encoded, names, 10)]
    return {
        "recall_at_10": round(recall_at(found, exact), 4),
        "faiss_alone": percentiles(faiss_alone),
        "search": percentiles(ours),
        "kappa_and_decision_over_faiss_ms": round(
            1000 * float(np.median(ours) - np.median(faiss_alone)), 3
        ),
        "encode_one_caption": encode,
        "decisions": {d: decisions.count(d) for d in sorted(set(decisions))},
    }


def served(index_dir: str, encoder: str, queries: list[str], clients: int, seconds: float) -> dict:
    """``POST /search`` of one caption from ``clients`` threads for ``seconds``: latencies."""
    import urllib.request

    from ray import serve

    from asymvlm_ray.schema import SearchConfig
    from asymvlm_ray.search_serving import deploy

    with socket.socket() as probe:  # a free port on 127.0.0.1
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = SearchConfig(index=index_dir, encoder=encoder, port=port, name="bench-search")
    url = deploy(cfg)
    latencies: list[float] = []

    def post(text: str) -> None:
        body = json.dumps({"captions": [text], "k": 10}).encode()
        request = urllib.request.Request(
            f"{url}/search", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            json.loads(response.read())

    def client(offset: int) -> None:
        i = offset
        while time.perf_counter() < stop:
            t = time.perf_counter()
            post(queries[i % len(queries)])
            latencies.append(time.perf_counter() - t)
            i += clients

    for text in queries[:8]:  # the replicas warm
        post(text)
    stop = time.perf_counter() + seconds
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    serve.shutdown()  # the next app starts its own proxy on its own port
    return {
        "requests": len(latencies),
        "requests_per_second": round(len(latencies) / seconds, 1),
        **percentiles(latencies),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--no-vit", action="store_true", help="the tiny text tower only")
    args = parser.parse_args(argv)
    load = loadavg()
    import ray

    from asymvlm.data.tiny import VIT_B32_TEXT, save_tiny_clip

    rng = np.random.default_rng(1)
    words = "a dog cat red small man woman car bus tree street beach ball running with".split()
    queries = [" ".join(rng.choice(words, rng.integers(3, 9))) for _ in range(args.queries)]
    out: dict = {"config": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        towers = {"tiny": save_tiny_clip(f"{tmp}/tiny", projection_dim=args.dim)}
        if not args.no_vit:
            towers["vit-b32"] = save_tiny_clip(
                f"{tmp}/vit", projection_dim=args.dim, text_tower=VIT_B32_TEXT
            )
        log(f"writing {args.images:,} images x {args.dim}")
        t0 = time.perf_counter()
        rng = np.random.default_rng(0)  # a concept per 250 images
        centers = rng.standard_normal((max(16, args.images // 250), args.dim)).astype(np.float32)
        centers /= np.linalg.norm(centers, axis=1, keepdims=True)
        root = f"{tmp}/tables"
        write_tables(root, "test", args.images, 10, centers, towers["tiny"], seed=1)
        write_tables(root, "train", min(20_000, args.images), 1, centers, towers["tiny"], seed=2)
        write_tables(root, "val", min(2_000, args.images), 1, centers, towers["tiny"], seed=3)
        out["write_tables_seconds"] = round(time.perf_counter() - t0, 1)
        adapter = trained_adapter(f"{tmp}/adapter", root)
        log("building the index")
        out["build"] = build(f"{tmp}/tables", adapter, f"{tmp}/index")
        log(f"build: {out['build']}")
        out["in_process"] = in_process(f"{tmp}/index", root, queries, towers)
        log(f"in process: {out['in_process']}")
        # stdout carries the JSON alone: Ray prints some of its workers' messages (Serve's
        # shutdown) to the driver's stdout, so they go to stderr meanwhile
        with contextlib.redirect_stdout(sys.stderr):
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
            try:
                out["served"] = {}
                for name, tower in towers.items():
                    log(f"serving with the {name} text tower for {args.seconds:.0f} s")
                    figures = served(f"{tmp}/index", tower, queries, args.clients, args.seconds)
                    encode = out["in_process"]["encode_one_caption"][name]["p50_ms"]
                    figures["encoder_share_of_p50"] = round(encode / figures["p50_ms"], 3)
                    out["served"][name] = figures
                    log(f"{name}: {figures}")
            finally:
                ray.shutdown()
    out["machine"] = machine(load)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
