"""``run_embed``: one split of one data set -> embedding tables, under the output's lock, shard
group by shard group (see :mod:`asymvlm_ray.embedding`)."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from asymvlm import storage, tables
from asymvlm.data.sources import read_source
from asymvlm.embedding.embed_config import EmbedConfig
from asymvlm.embedding.encoding import perturb_captions
from asymvlm.output_lock import OutputLock
from asymvlm_ray.embedding.ray_data import embed_images_and_captions, embed_texts
from asymvlm_ray.embedding.shards import (
    ERROR_SCHEMA,
    ERRORS_DIR,
    PARTS_DIR,
    PROMPTS_DIR,
    SUCCESS,
    claim,
    manifest_lock,
    part_name,
    split_totals,
    write_manifest_once,
)
from asymvlm_ray.session import RaySession, require_ray

log = logging.getLogger(__name__)
_SOURCE_IMAGE_COLUMNS = frozenset({"image_id", "path", "offset", "length", "data", "shard"})
CAPTION_KEYS = ("caption_id", "image_id", "text")


def run_embed(cfg: EmbedConfig, session: RaySession | None = None) -> dict[str, Any]:
    """One split into ``cfg.output`` under its lock, asking Ray only when there is work."""
    t0 = time.perf_counter()
    cfg.check_inputs()
    need_ray = session.require if session is not None else lambda: require_ray("embedding")
    with OutputLock(cfg.output, cfg.split, log=log.warning) as lock:
        keys = ("annotations", "images", "split", "sample", "seed", "id_list")
        source = read_source(cfg.dataset, **{k: getattr(cfg, k) for k in keys})
        fingerprint = cfg.fingerprint(source)
        done = claim(cfg, fingerprint, lock)
        if done is not None:
            log.info(f"{cfg.output}/{cfg.split} is complete and matches this job: nothing to do")
            return {**done["summary"], "skipped": True}
        images = source.images
        shard_of = np.arange(images.num_rows) // cfg.shard_size
        images = images.append_column("shard", pa.array(shard_of, pa.int64()))
        captions = source.captions
        if cfg.text_perturbation:
            captions = perturb_captions(captions, cfg.text_perturbation, cfg.perturbation_seed)
        n_shards = int(shard_of.max()) + 1 if len(shard_of) else 0
        done = storage.list_names(storage.uri_join(cfg.output, cfg.split, PARTS_DIR))
        pending = [k for k in range(n_shards) if f"{part_name(k)}.json" not in done]
        log.info(
            f"{cfg.dataset}/{cfg.split}: {images.num_rows} images, {captions.num_rows} captions, "
            f"{n_shards} shards ({n_shards - len(pending)} already written)"
        )
        info = functools.cache(functools.partial(_encoder_info, cfg.model))
        for start in range(0, len(pending), cfg.shards_per_round):
            need_ray()
            group = pending[start : start + cfg.shards_per_round]
            _embed_group(cfg, images, captions, group, info, lock)
        if source.prompts is not None and source.prompts.num_rows:
            _embed_prompts(cfg, source.prompts, lock, need_ray)
        totals = split_totals(cfg)
        summary = {"dataset": cfg.dataset, "split": cfg.split, "output": cfg.output, **totals}
        summary["seconds"] = round(time.perf_counter() - t0, 2)
        lock.check()
        with manifest_lock(cfg):
            manifest = tables.read_manifest(cfg.output).to_dict()
            manifest.setdefault("splits", {})[cfg.split] = {**source.description, **totals}
            tables.write_manifest(cfg.output, manifest)
        lock.check()
        storage.write_json(
            cfg.output, f"{cfg.split}/{SUCCESS}", dict(fingerprint=fingerprint, summary=summary)
        )
        log.info(
            f"done: {totals['n_images']} images, {totals['n_captions']} captions "
            f"({totals['n_image_errors']} image and {totals['n_caption_errors']} caption errors) "
            f"-> {cfg.output}/{cfg.split}"
        )
        return summary


def _embed_prompts(
    cfg: EmbedConfig, prompts: pa.Table, lock: OutputLock, need_ray: Callable[[], None]
) -> None:
    """Class-name prompts and the none-of-the-above ones (Table 2, class -1) -> ``prompts/``."""
    if tables.read_parts(cfg.output, cfg.split, PROMPTS_DIR) is not None:
        return
    need_ray()
    n = len(cfg.dummy_prompts)
    dummies = {"class_index": [-1] * n, "class_name": [""] * n, "template": [""] * n}
    extra = pa.table({**dummies, "text": list(cfg.dummy_prompts)}, schema=prompts.schema)
    prompts = pa.concat_tables([prompts, extra])
    ids = pa.array([f"class{c}-t{t}" for t, c in enumerate(prompts["class_index"].to_pylist())])
    out = embed_texts(cfg, prompts.append_column("caption_id", ids))
    out = out.take(pc.index_in(ids, out["caption_id"]))
    emb = tables.column_matrix(out["embedding"])
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), emb.shape[1])
    table = prompts.append_column("embedding", embedding).append_column("norm", out["norm"])
    lock.check()
    tables.write_part(cfg.output, cfg.split, PROMPTS_DIR, "part-00000", table)


def _embed_group(
    cfg: EmbedConfig,
    images: pa.Table,
    captions: pa.Table,
    group: list[int],
    info: Callable[[], dict[str, Any]],
    lock: OutputLock,
) -> None:
    """Embed some shards' images and captions on Ray Data; write them by shard, marker last."""
    todo = images.filter(pc.is_in(images["shard"], pa.array(group, pa.int64())))
    captions, empty = _group_captions(captions, todo)
    log.info(
        f"shards {group[0]}..{group[-1]}: embedding {todo.num_rows} images and "
        f"{captions.num_rows} captions"
    )
    out = embed_images_and_captions(cfg, todo.append_column("captions", _attached(captions, todo)))
    embedded_images = out.filter(pc.equal(out["kind"], "image"))
    embedded_texts = out.filter(pc.equal(out["kind"], "caption"))
    failed = embedded_images.filter(pc.not_equal(embedded_images["error"], ""))
    embedded_images = embedded_images.filter(pc.equal(embedded_images["error"], ""))
    lost = pc.is_in(captions["image_id"], failed["image_id"])  # captions of failed images
    lost_ids = captions.filter(lost)["image_id"]
    reasons = pc.binary_join_element_wise("image ", lost_ids, " failed", "")
    errors = pa.concat_tables(
        [
            _errors(empty, "caption", "caption_id", "empty caption"),
            _errors(failed, "image", "image_id", failed["error"], failed["path"]),
            _errors(captions.filter(lost), "caption", "caption_id", reasons),
        ]
    ).sort_by([("kind", "descending"), ("id", "ascending")])
    captions = captions.filter(pc.invert(lost))
    if failed.num_rows and not embedded_images.num_rows:
        log.warning(
            f"every image of shards {group[0]}..{group[-1]} failed to load, e.g. "
            f"{failed['path'][0].as_py()}: {failed['error'][0].as_py()} "
            "(check --images and the storage credentials of the Ray nodes)"
        )
    dim = int(info()["dim"])
    lock.check()
    write_manifest_once(cfg, dim, info)
    widths = {"embedding": dim}
    if cfg.pre_projection:
        pre_dim = tables.read_manifest(cfg.output).pre_dim
        widths |= {"image_pre": pre_dim["image"], "text_pre": pre_dim["text"]}
    embedded_images = embedded_images.sort_by("image_id")
    for shard in group:
        lock.check()
        _write_shard(
            cfg,
            shard,
            todo,
            embedded_images.filter(pc.equal(embedded_images["shard"], shard)),
            captions.filter(pc.equal(captions["shard"], shard)),
            embedded_texts,
            errors.filter(pc.equal(errors["shard"], shard)),
            widths,
        )


def _group_captions(captions: pa.Table, todo: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The captions of the images ``todo`` with their shard; apart, the empty (not embedded)."""
    captions = captions.filter(pc.is_in(captions["image_id"], todo["image_id"]))
    shards = todo["shard"].take(pc.index_in(captions["image_id"], todo["image_id"]))
    captions = captions.append_column("shard", shards)
    empty = pc.equal(pc.utf8_trim_whitespace(pc.fill_null(captions["text"], "")), "")
    return captions.filter(pc.invert(empty)), captions.filter(empty)


def _attached(captions: pa.Table, todo: pa.Table) -> pa.Array:
    """Per image of ``todo``, its captions ``[[caption_id, text], ...]`` as JSON, riding with it."""
    attached: dict[str, list[list[str]]] = defaultdict(list)
    for cid, iid, text in zip(*(captions[c].to_pylist() for c in CAPTION_KEYS), strict=True):
        attached[iid].append([cid, text])
    return pa.array(
        [json.dumps(attached[i], ensure_ascii=False) for i in todo["image_id"].to_pylist()]
    )


def _write_shard(
    cfg: EmbedConfig,
    shard: int,
    todo: pa.Table,
    images: pa.Table,
    captions: pa.Table,
    texts: pa.Table,
    errors: pa.Table,
    widths: dict[str, int],
) -> None:
    """One shard's part: its error rows, images and captions with embeddings, then its marker."""

    def matrix(rows: pa.Table, column: str) -> np.ndarray:
        if not rows.num_rows:
            return np.zeros((0, widths[column]), np.float32)
        return tables.column_matrix(rows[column])

    texts = texts.take(pc.index_in(captions["caption_id"], texts["id"]))
    source = todo.take(pc.index_in(images["image_id"], todo["image_id"]))
    carried = [c for c in todo.column_names if c not in _SOURCE_IMAGE_COLUMNS]
    extra_text = [c for c in captions.column_names if c not in (*CAPTION_KEYS, "shard")]
    part = part_name(shard)
    tables.write_part(cfg.output, cfg.split, ERRORS_DIR, part, errors.drop_columns(["shard"]))
    tables.write_split(
        cfg.output,
        cfg.split,
        image_ids=images["image_id"].to_pylist(),
        image_embeddings=matrix(images, "embedding"),
        image_norms=images["norm"].to_numpy(),
        extra_image_columns={c: source[c].to_numpy(zero_copy_only=False) for c in carried},
        caption_ids=captions["caption_id"].to_pylist(),
        caption_image_ids=captions["image_id"].to_pylist(),
        texts=captions["text"].to_pylist(),
        text_embeddings=matrix(texts, "embedding"),
        text_norms=texts["norm"].to_numpy(),
        image_features_pre=matrix(images, "image_pre") if cfg.pre_projection else None,
        text_features_pre=matrix(texts, "text_pre") if cfg.pre_projection else None,
        extra_text_columns={c: captions[c].to_numpy(zero_copy_only=False) for c in extra_text},
        part=part,
    )
    counts = {"images": images.num_rows, "captions": captions.num_rows, "errors": errors.num_rows}
    storage.write_json(cfg.output, f"{cfg.split}/{PARTS_DIR}/{part}.json", counts)


def _errors(rows: pa.Table, kind: str, id_column: str, reason, path=None) -> pa.Table:
    """Error rows (ERROR_SCHEMA + the shard they belong to) for ``rows``."""
    n = rows.num_rows
    columns = {
        "kind": pa.array([kind] * n),
        "id": rows[id_column],
        "path": pa.array([""] * n) if path is None else path,
        "reason": pa.array([reason] * n) if isinstance(reason, str) else reason,
        "shard": rows["shard"],
    }
    return pa.table(columns).cast(ERROR_SCHEMA.append(pa.field("shard", pa.int64())))


def _encoder_info(model: str) -> dict[str, Any]:
    from asymvlm.embedding.encoders import load_encoder

    return vars(load_encoder(model, device="cpu", load_model=False).info)
