"""The Ray Data passes of the embedding stage: ``map_batches(decode_batch)`` on CPU tasks, then
``map_batches(EncoderActor)`` on an actor pool (one GPU each when the cluster has GPUs)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import ray

from asymvlm.data.embed import EmbedConfig
from asymvlm.data.encode import EncoderActor, decode_batch


def _encode(cfg: EmbedConfig, ds: ray.data.Dataset) -> pa.Table:
    """``ds`` through the encoder actor pool, materialised on the driver (credentials come from
    each node's environment: no ``runtime_env``)."""
    gpu = cfg.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
    ds = ds.map_batches(
        EncoderActor,
        fn_constructor_kwargs=_actor_kwargs(cfg, gpu),
        compute=ray.data.ActorPoolStrategy(size=cfg.num_actors),
        num_gpus=1 if gpu else 0,
        num_cpus=cfg.actor_cpus,
        batch_size=cfg.batch_size,
        batch_format="numpy",
    )
    return pa.concat_tables(ray.get(ds.to_arrow_refs()))


def _actor_kwargs(cfg: EmbedConfig, gpu: bool) -> dict[str, Any]:
    threads = None if gpu else max(1, int(ray.cluster_resources().get("CPU", 1)))
    return {
        "model": cfg.model,
        "device": "cuda" if gpu else "cpu",
        "dtype": cfg.dtype,
        "threads": threads,
        "text_batch_size": cfg.batch_size,  # captions per forward pass
        "pre_projection": cfg.pre_projection,
    }


def embed_images_and_captions(cfg: EmbedConfig, images: pa.Table) -> pa.Table:
    """Image rows (their captions as JSON) -> image and caption rows."""
    ds = _dataset(images, cfg.batch_size).map_batches(
        decode_batch,
        fn_kwargs={
            "model": cfg.model,
            "perturbation": cfg.image_perturbation,
            "seed": cfg.perturbation_seed,
        },
        batch_format="pyarrow",
        batch_size=cfg.batch_size,
        num_cpus=cfg.decode_cpus,
    )
    return _encode(cfg, ds)


def embed_texts(cfg: EmbedConfig, captions: pa.Table) -> pa.Table:
    """Text rows (``caption_id``, ``text``) -> ``caption_id``, ``embedding``, ``norm``."""
    return _encode(cfg, _dataset(captions.select(["caption_id", "text"]), cfg.batch_size))


def _dataset(table: pa.Table, rows: int) -> ray.data.Dataset:
    """``table`` as a dataset of ``rows``-row blocks (one task each)."""
    return ray.data.from_arrow([table.slice(i, rows) for i in range(0, table.num_rows, rows)])
