"""Requests per second and latency of the Ray Serve scorer, with and without dynamic batching,
beside the in-process :class:`asymvlm.Scorer` on the same captions.

The same ``--requests`` requests of ``--captions`` captions each (short generated captions of
3-12 words) are sent three ways:

* **in_process** -- ``Scorer.caption_uncertainty`` per request, one after another (no HTTP);
* **serve_batched** -- ``POST /uncertainty`` from ``--concurrency`` client threads to
  ``pipelines/serve.py``'s deployment (one replica, ``max_batch_size`` = concurrency,
  ``batch_wait_timeout_s`` 0.01): requests that arrive together are embedded together;
* **serve_unbatched** -- the same deployment with ``batching: false``.

Prints one JSON object: per way ``requests_per_second``, ``captions_per_second``, latency
``p50_ms`` / ``p99_ms`` (per request, client side), and the ratios of the Serve ways to the
in-process scorer. The adapter is ``--checkpoint`` (e.g. one of the demo's adapters), or by
default an untrained ``asymvlm-vmf`` adapter over a tiny random CLIP written to a temporary
folder: the figures then measure the serving path, not a real encoder's compute::

    .venv/bin/python benchmarks/serve_throughput.py [--checkpoint DIR] [--requests 200]
        [--captions 4] [--concurrency 8] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np
from _common import loadavg, logger, machine  # noqa: E402

log = logger("serve_throughput")
WORDS = (
    "a dog cat red blue small large man woman child car bus tree street field beach "
    "running sitting holding playing with on in near the of frisbee ball"
).split()


def _captions(n_requests: int, per_request: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    return [
        [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(per_request)]
        for _ in range(n_requests)
    ]


def _untrained_checkpoint(folder: str) -> str:
    """An asymvlm-vmf adapter (default init) over a tiny random CLIP, recorded as a checkpoint
    of tables that CLIP embedded (the manifest the embedding stage would write)."""
    from asymvlm import tables
    from asymvlm.checkpoints import provenance, save_checkpoint
    from asymvlm.data.tiny import save_tiny_clip
    from asymvlm.embedding.encoders import load_encoder
    from asymvlm.methods import build_method
    from asymvlm.training import TrainConfig

    model = save_tiny_clip(os.path.join(folder, "tiny-clip"))
    info = load_encoder(model, device="cpu", load_model=False).info
    manifest = tables.Manifest(dim=info.dim, model=model, extra=vars(info))
    cfg = TrainConfig(method="asymvlm-vmf", epochs=1)
    method = build_method("asymvlm-vmf", info.dim, **cfg.method_args())
    out = os.path.join(folder, "adapter")
    split = SimpleNamespace(manifest=manifest, fingerprint=None)  # what provenance reads
    save_checkpoint(out, method, cfg, info.dim, complete=True, extra=provenance(split))
    return out


def _stats(latencies: list[float], seconds: float, n_captions: int) -> dict[str, float]:
    ms = np.asarray(latencies) * 1000
    return {
        "seconds": round(seconds, 3),
        "requests_per_second": round(len(latencies) / seconds, 2),
        "captions_per_second": round(n_captions / seconds, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
    }


def _in_process(scorer, requests: list[list[str]]) -> dict[str, float]:
    scorer.caption_uncertainty(requests[0])  # warm
    latencies = []
    t0 = time.perf_counter()
    for captions in requests:
        t = time.perf_counter()
        scorer.caption_uncertainty(captions)
        latencies.append(time.perf_counter() - t)
    return _stats(latencies, time.perf_counter() - t0, sum(map(len, requests)))


def _over_http(url: str, requests: list[list[str]], concurrency: int) -> dict[str, float]:
    import urllib.request

    def post(captions: list[str]) -> float:
        body = json.dumps({"captions": captions}).encode()
        request = urllib.request.Request(
            url + "/uncertainty", data=body, headers={"Content-Type": "application/json"}
        )
        t = time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            results = json.loads(response.read())["results"]
        assert len(results) == len(captions)
        return time.perf_counter() - t

    for captions in requests[:concurrency]:  # warm the replica
        post(captions)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(post, requests))
    return _stats(latencies, time.perf_counter() - t0, sum(map(len, requests)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--captions", type=int, default=4, help="captions per request")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    import socket

    from ray import serve

    from asymvlm import Scorer, logs
    from asymvlm_ray.schema import ServeConfig
    from asymvlm_ray.serving import deploy
    from asymvlm_ray.session import RaySession

    logs.configure(verbose=False)
    # stdout carries the JSON alone: Ray prints some of its workers' messages (Serve's
    # shutdown) to the driver's stdout, so everything else goes to stderr meanwhile.
    stdout, sys.stdout = sys.stdout, sys.stderr
    RaySession().require()  # left running: the script ends with the process
    scratch = tempfile.mkdtemp(prefix="serve-throughput-")
    try:
        checkpoint = args.checkpoint or _untrained_checkpoint(scratch)
        requests = _captions(args.requests, args.captions)
        load_before = loadavg()
        log("in-process scorer ...")
        scorer = Scorer.from_checkpoint(checkpoint, device=args.device)
        result: dict[str, Any] = {"in_process": _in_process(scorer, requests)}
        for label, batching in (("serve_batched", True), ("serve_unbatched", False)):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            cfg = ServeConfig(
                checkpoint=checkpoint,
                device=args.device,
                port=port,
                name=f"bench-{label}",
                batching=batching,
                max_batch_size=args.concurrency,
                batch_wait_timeout_s=0.01,
            )
            log(f"{label}: deploying ...")
            url = deploy(cfg)
            try:
                result[label] = _over_http(url, requests, args.concurrency)
            finally:
                serve.shutdown()
            log(f"{label}: {result[label]}")
        base = result["in_process"]["requests_per_second"]
        result.update(
            batched_over_in_process=round(result["serve_batched"]["requests_per_second"] / base, 3),
            unbatched_over_in_process=round(
                result["serve_unbatched"]["requests_per_second"] / base, 3
            ),
            batched_over_unbatched=round(
                result["serve_batched"]["requests_per_second"]
                / result["serve_unbatched"]["requests_per_second"],
                3,
            ),
            checkpoint=args.checkpoint or "untrained asymvlm-vmf over a tiny random CLIP",
            requests=args.requests,
            captions_per_request=args.captions,
            concurrency=args.concurrency,
            device=args.device,
            **machine(load_before),
        )
        print(json.dumps(result, indent=2), file=stdout, flush=True)
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
