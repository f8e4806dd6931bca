"""The Ray Data passes of the embedding stage: ``map_batches(decode_batch)`` on CPU tasks, then
``map_batches(EncoderActor)`` on an actor pool (one GPU each when the cluster has GPUs)."""

from __future__ import annotations

import pyarrow as pa
import ray

from asymvlm.embedding.embed_config import EmbedConfig
from asymvlm.embedding.encoding import EncoderActor, decode_batch


def _encode(cfg: EmbedConfig, ds: ray.data.Dataset) -> pa.Table:
    """``ds`` through the encoder actor pool, materialised on the driver."""
    gpu = cfg.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
    ds = ds.map_batches(
        EncoderActor,
        fn_constructor_kwargs={
            "model": cfg.model,
            "device": "cuda" if gpu else "cpu",
            "dtype": cfg.dtype,
            # Ray pins an actor's threads to its num_cpus: on CPU-only nodes use the node
            "threads": None if gpu else max(1, int(ray.cluster_resources().get("CPU", 1))),
            "text_batch_size": cfg.batch_size,
            "pre_projection": cfg.pre_projection,
        },
        compute=ray.data.ActorPoolStrategy(size=cfg.num_actors),
        # Not restarted by Ray: Ray Data passes every pool actor object-store arguments, and
        # Ray core prints an ERROR for each restartable one (ray-project/ray#57733). A lost
        # actor ends the job; the same command resumes it from its written shards.
        max_restarts=0,
        num_gpus=1 if gpu else 0,
        num_cpus=cfg.actor_cpus,
        batch_size=cfg.batch_size,
        batch_format="numpy",
    )
    return pa.concat_tables(ray.get(ds.to_arrow_refs()))


def _dataset(table: pa.Table, rows: int) -> ray.data.Dataset:
    """``table`` as a dataset of ``rows``-row blocks (one task each)."""
    return ray.data.from_arrow([table.slice(i, rows) for i in range(0, table.num_rows, rows)])


def embed_images_and_captions(cfg: EmbedConfig, images: pa.Table) -> pa.Table:
    """Image rows (their captions as JSON) -> image and caption rows."""
    kwargs = {"model": cfg.model, "perturbation": cfg.image_perturbation}
    ds = _dataset(images, cfg.batch_size).map_batches(
        decode_batch,
        fn_kwargs={**kwargs, "seed": cfg.perturbation_seed},
        batch_format="pyarrow",
        batch_size=cfg.batch_size,
        num_cpus=cfg.decode_cpus,
    )
    return _encode(cfg, ds)


def embed_texts(cfg: EmbedConfig, captions: pa.Table) -> pa.Table:
    """Text rows (``caption_id``, ``text``) -> ``caption_id``, ``embedding``, ``norm``."""
    return _encode(cfg, _dataset(captions.select(["caption_id", "text"]), cfg.batch_size))
