"""The Ray Data passes of the embedding stage (``map_batches`` with an ``ActorPoolStrategy``)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from asymvlm.data.embed import EmbedConfig
from asymvlm.data.encode import DecodeEncodeActor, EncoderActor, TextEncoderActor, decode_batch


def _blocks(table: pa.Table, rows_per_block: int) -> list[pa.Table]:
    return [table.slice(i, rows_per_block) for i in range(0, table.num_rows, rows_per_block)]


def _has_gpu(device: str) -> bool:
    if device == "cpu":
        return False
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def _map_kwargs(cfg: EmbedConfig) -> dict[str, Any]:
    """``map_batches`` arguments of the encoder actor pool (no ``runtime_env``: credentials
    come from each node's environment)."""
    import ray

    gpu = _has_gpu(cfg.device)
    threads = None if gpu else max(1, int(ray.cluster_resources().get("CPU", 1)))
    return {
        "fn_constructor_kwargs": {
            "model": cfg.model,
            "device": "cuda" if gpu else "cpu",
            "dtype": cfg.dtype,
            "threads": threads,
            "text_batch_size": cfg.batch_size,  # captions per forward pass
            "pre_projection": cfg.pre_projection,
        },
        "compute": ray.data.ActorPoolStrategy(size=cfg.num_actors),
        "num_gpus": 1 if gpu else 0,
        "num_cpus": cfg.actor_cpus,
        "batch_size": cfg.batch_size,
        "batch_format": "numpy",
    }


def embed_images_and_captions(cfg: EmbedConfig, images: pa.Table) -> pa.Table:
    """One Ray Data pass: image rows (with their captions as JSON) -> image and caption rows."""
    import ray

    ds = ray.data.from_arrow(_blocks(images, max(cfg.batch_size, 16)))
    decode_in = cfg.decode_in
    if decode_in == "auto":
        decode_in = "tasks" if _has_gpu(cfg.device) else "actor"
    if decode_in == "actor":
        kwargs = {**_map_kwargs(cfg), "batch_format": "pyarrow"}
        kwargs["fn_constructor_kwargs"] = {
            **kwargs["fn_constructor_kwargs"],
            "image_perturbation": cfg.image_perturbation,
            "perturbation_seed": cfg.perturbation_seed,
        }
        return _to_arrow(ds.map_batches(DecodeEncodeActor, **kwargs))
    ds = ds.map_batches(decode_batch, **_decode_kwargs(cfg))
    return _to_arrow(ds.map_batches(EncoderActor, **_map_kwargs(cfg)))


def _decode_kwargs(cfg: EmbedConfig) -> dict[str, Any]:
    """``map_batches`` arguments of the CPU decode tasks."""
    return {
        "fn_kwargs": {
            "model": cfg.model,
            "perturbation": cfg.image_perturbation,
            "seed": cfg.perturbation_seed,
        },
        "batch_format": "pyarrow",
        "batch_size": cfg.batch_size,
        "num_cpus": cfg.decode_cpus,
    }


def embed_texts(cfg: EmbedConfig, captions: pa.Table) -> pa.Table:
    import ray

    ds = ray.data.from_arrow(_blocks(captions.select(["caption_id", "text"]), cfg.batch_size))
    return _to_arrow(ds.map_batches(TextEncoderActor, **_map_kwargs(cfg)))


def _to_arrow(ds) -> pa.Table:
    """Materialise a dataset's blocks on the driver (one group of shards at a time)."""
    import ray

    return pa.concat_tables(ray.get(ds.to_arrow_refs()))
