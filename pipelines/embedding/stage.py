"""``run_embed``: one split of one data set -> embedding tables, under the output's lock, shard
group by shard group (see :mod:`pipelines.embedding`)."""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from asymvlm import storage, tables
from asymvlm.data.embed import EmbedConfig
from asymvlm.data.encode import perturb_captions
from asymvlm.data.sources import read_source
from pipelines.embedding.ray_data import embed_images_and_captions, embed_texts
from pipelines.embedding.shards import (
    ERRORS_DIR,
    PARTS_DIR,
    PROMPTS_DIR,
    SUCCESS,
    claim,
    errors_table,
    manifest_lock,
    part_name,
    record_projection,
    split_totals,
    write_manifest_once,
)
from pipelines.session import RaySession, require_ray

log = logging.getLogger(__name__)
_SOURCE_IMAGE_COLUMNS = frozenset({"image_id", "path", "offset", "length", "data", "shard"})


def run_embed(cfg: EmbedConfig, session: RaySession | None = None) -> dict[str, Any]:
    """Embed one split of one data set into ``cfg.output``; returns a summary dict. Ray is
    asked of ``session`` only when there is something to embed."""
    t0 = time.perf_counter()
    cfg.check_inputs()
    need_ray = session.require if session is not None else lambda: require_ray("embedding")
    with storage.OutputLock(cfg.output, cfg.split, log=log.warning) as lock:
        return _run_locked(cfg, lock, t0, need_ray)


def _run_locked(
    cfg: EmbedConfig, lock: storage.OutputLock, t0: float, need_ray: Callable[[], None]
) -> dict[str, Any]:
    source = read_source(
        cfg.dataset,
        annotations=cfg.annotations,
        images=cfg.images,
        split=cfg.split,
        sample=cfg.sample,
        seed=cfg.seed,
        id_list=cfg.id_list,
    )
    fingerprint = cfg.fingerprint(source)
    done = claim(cfg, fingerprint, lock)
    if done is not None:
        log.info(f"{cfg.output}/{cfg.split} is complete and matches this job: nothing to do")
        return {**done["summary"], "skipped": True}

    images = source.images.sort_by("image_id")
    n_img = images.num_rows
    shard_of = np.arange(n_img) // cfg.shard_size
    images = images.append_column("shard", pa.array(shard_of, pa.int64()))
    image_shard = dict(zip(images.column("image_id").to_pylist(), shard_of.tolist(), strict=True))
    captions = source.captions.sort_by([("image_id", "ascending"), ("caption_id", "ascending")])
    if cfg.text_perturbation:
        captions = perturb_captions(captions, cfg.text_perturbation, cfg.perturbation_seed)
    n_shards = int(shard_of.max()) + 1 if n_img else 0
    pending = [
        k
        for k in range(n_shards)
        if storage.read_json(cfg.output, f"{cfg.split}/{PARTS_DIR}/{part_name(k)}.json") is None
    ]
    log.info(
        f"{cfg.dataset}/{cfg.split}: {n_img} images, {captions.num_rows} captions, "
        f"{n_shards} shards ({n_shards - len(pending)} already written)"
    )
    with ThreadPoolExecutor(1) as pool:
        # The manifest's provenance (processor settings, file hashes) is read while Ray works.
        info = pool.submit(_encoder_info, cfg.model)
        if pending:
            need_ray()
        for start in range(0, len(pending), cfg.shards_per_round):
            group = pending[start : start + cfg.shards_per_round]
            _embed_group(cfg, images, captions, image_shard, group, info, lock)
        if source.prompts is not None and source.prompts.num_rows:
            _embed_prompts(cfg, source.prompts, lock, need_ray)
    totals = split_totals(cfg)
    summary = {
        "dataset": cfg.dataset,
        "split": cfg.split,
        "output": cfg.output,
        **totals,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    lock.check()
    with manifest_lock(cfg):
        manifest = tables.read_manifest(cfg.output).to_dict()
        manifest.setdefault("splits", {})[cfg.split] = {**source.description, **totals}
        tables.write_manifest(cfg.output, manifest)
    lock.check()
    storage.write_json(
        cfg.output, f"{cfg.split}/{SUCCESS}", {"fingerprint": fingerprint, "summary": summary}
    )
    log.info(
        f"done: {totals['n_images']} images, {totals['n_captions']} captions, "
        f"{totals['n_image_errors']} image errors, {totals['n_caption_errors']} caption errors "
        f"-> {cfg.output}/{cfg.split}"
    )
    return summary


def _embed_prompts(
    cfg: EmbedConfig, prompts: pa.Table, lock: storage.OutputLock, need_ray: Callable[[], None]
) -> None:
    """Classification sets: class-name prompts (class x template) -> ``ROOT/split/prompts``."""
    if tables.read_parts(cfg.output, cfg.split, PROMPTS_DIR) is not None:
        return
    need_ray()
    if cfg.dummy_prompts:
        extra = (
            pa.table(
                {
                    "class_index": pa.array(
                        [-1] * len(cfg.dummy_prompts), prompts.schema.field("class_index").type
                    ),
                    "class_name": pa.array([""] * len(cfg.dummy_prompts), pa.string()),
                    "template": pa.array([""] * len(cfg.dummy_prompts), pa.string()),
                    "text": pa.array(list(cfg.dummy_prompts), pa.string()),
                }
            )
            .select(prompts.column_names)
            .cast(prompts.schema)
        )
        prompts = pa.concat_tables([prompts, extra])
    ids = [
        f"class{c}-t{t}"
        for c, t in zip(
            prompts.column("class_index").to_pylist(), range(prompts.num_rows), strict=True
        )
    ]
    keyed = prompts.append_column("caption_id", pa.array(ids, pa.string()))
    out = embed_texts(cfg, keyed)
    pos = {cid: i for i, cid in enumerate(out.column("caption_id").to_pylist())}
    order = pa.array([pos[c] for c in ids], pa.int64())
    emb = tables.column_matrix(out.column("embedding"))[np.asarray(order)]
    table = (
        keyed.drop_columns(["caption_id"])
        .append_column(
            "embedding", pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), emb.shape[1])
        )
        .append_column("norm", out.column("norm").take(order))
    )
    lock.check()
    tables.write_part(cfg.output, cfg.split, PROMPTS_DIR, "part-00000", table)


def _embed_group(
    cfg: EmbedConfig,
    images: pa.Table,
    captions: pa.Table,
    image_shard: dict[str, int],
    group: list[int],
    info: Future,
    lock: storage.OutputLock,
) -> None:
    """Embed the images and captions of some shards and write them (marker last)."""
    import pyarrow.compute as pc

    wanted = pa.array(group, pa.int64())
    todo = images.filter(pc.is_in(images.column("shard"), wanted))
    errors: dict[int, list[dict[str, str]]] = defaultdict(list)

    # This group's captions ride with their image (JSON [[caption_id, text], ...]); empty
    # captions become errors before any work is done.
    cap_ids = captions.column("image_id").to_pylist()
    cap_shard = np.array([image_shard.get(i, -1) for i in cap_ids], dtype=np.int64)
    group_caps = captions.filter(pa.array(np.isin(cap_shard, np.array(group))))
    attached: dict[str, list[list[str]]] = defaultdict(list)
    keep = []
    for i, row in enumerate(group_caps.select(["caption_id", "image_id", "text"]).to_pylist()):
        if (row["text"] or "").strip():
            attached[row["image_id"]].append([row["caption_id"], row["text"]])
            keep.append(i)
        else:
            errors[image_shard[row["image_id"]]].append(
                {"kind": "caption", "id": row["caption_id"], "path": "", "reason": "empty caption"}
            )
    group_caps = group_caps.take(pa.array(keep, pa.int64()))
    todo_ids = todo.column("image_id").to_pylist()
    payload = [json.dumps(attached.get(i, []), ensure_ascii=False) for i in todo_ids]
    log.info(
        f"shards {group[0]}..{group[-1]}: embedding {todo.num_rows} images and "
        f"{group_caps.num_rows} captions"
    )
    out = embed_images_and_captions(
        cfg, todo.append_column("captions", pa.array(payload, pa.string()))
    )
    is_image = pc.equal(out.column("kind"), "image")
    img_out = out.filter(is_image)
    txt_out = out.filter(pc.invert(is_image))
    ok_mask = pc.equal(img_out.column("error"), "")
    ok_images = img_out.filter(ok_mask)
    failed = img_out.filter(pc.invert(ok_mask))

    failed_ids = set()
    for row in failed.select(["image_id", "path", "shard", "error"]).to_pylist():
        failed_ids.add(row["image_id"])
        errors[row["shard"]].append(
            {"kind": "image", "id": row["image_id"], "path": row["path"], "reason": row["error"]}
        )
        for caption_id, _ in attached.get(row["image_id"], []):
            errors[row["shard"]].append(
                {
                    "kind": "caption",
                    "id": caption_id,
                    "path": "",
                    "reason": f"image {row['image_id']} failed",
                }
            )
    for rows in errors.values():
        rows.sort(key=lambda r: (r["kind"] != "image", r["id"]))
    if failed_ids:
        group_caps = group_caps.filter(
            pc.invert(pc.is_in(group_caps.column("image_id"), pa.array(sorted(failed_ids))))
        )
    if not txt_out.num_rows:
        txt_out = None

    # Join results back by id and write shard by shard.
    text_by_id: dict[str, int] = {}
    if txt_out is not None:
        text_by_id = {cid: i for i, cid in enumerate(txt_out.column("id").to_pylist())}
    img_ids = ok_images.column("image_id").to_pylist()
    img_pos = {iid: i for i, iid in enumerate(img_ids)}
    img_emb = tables.column_matrix(ok_images.column("embedding"))
    img_norm = ok_images.column("norm").to_numpy()
    txt_emb = tables.column_matrix(txt_out.column("embedding")) if txt_out is not None else None
    txt_norm = txt_out.column("norm").to_numpy() if txt_out is not None else None
    img_pre = txt_pre = None  # the pre-projection features of each row's kind
    if cfg.pre_projection and ok_images.num_rows:
        img_pre = tables.column_matrix(ok_images.column("image_pre"))
    if cfg.pre_projection and txt_out is not None:
        txt_pre = tables.column_matrix(txt_out.column("text_pre"))
    dim = img_emb.shape[1] if img_emb.size else (txt_emb.shape[1] if txt_emb is not None else 0)
    if not dim:  # every image of these shards failed: the model still says what dim is
        dim = int(info.result()["dim"])
        if failed.num_rows:
            log.warning(
                f"every image of shards {group[0]}..{group[-1]} failed to load, e.g. "
                f"{failed.column('path')[0].as_py()}: {failed.column('error')[0].as_py()} "
                "(check --images and the storage credentials of the Ray nodes)"
            )

    lock.check()
    write_manifest_once(cfg, dim, info)
    if cfg.pre_projection:
        record_projection(cfg)
    # Source image columns worth keeping (e.g. `label` of classification sets), by image id.
    carried = [c for c in todo.column_names if c not in _SOURCE_IMAGE_COLUMNS]
    todo_pos = {iid: i for i, iid in enumerate(todo.column("image_id").to_pylist())}
    extra_names = [
        c for c in group_caps.column_names if c not in ("caption_id", "image_id", "text")
    ]
    for shard in group:
        shard_ids = sorted(i for i in img_ids if image_shard[i] == shard)
        rows_i = np.array([img_pos[i] for i in shard_ids], dtype=np.int64)
        caps = group_caps.filter(
            pc.is_in(group_caps.column("image_id"), pa.array(shard_ids, pa.string()))
        )
        rows_t = np.array(
            [text_by_id[c] for c in caps.column("caption_id").to_pylist()], dtype=np.int64
        )
        part = part_name(shard)
        lock.check()
        tables.write_part(
            cfg.output, cfg.split, ERRORS_DIR, part, errors_table(errors.get(shard, []))
        )
        tables.write_split(
            cfg.output,
            cfg.split,
            image_ids=shard_ids,
            image_embeddings=img_emb[rows_i].reshape(len(rows_i), dim),
            image_norms=img_norm[rows_i],
            extra_image_columns={
                c: todo.column(c)
                .take(pa.array([todo_pos[i] for i in shard_ids], pa.int64()))
                .to_numpy(zero_copy_only=False)
                for c in carried
            },
            caption_ids=caps.column("caption_id").to_pylist(),
            caption_image_ids=caps.column("image_id").to_pylist(),
            texts=caps.column("text").to_pylist(),
            text_embeddings=(
                txt_emb[rows_t] if txt_emb is not None else np.zeros((0, dim), np.float32)
            ).reshape(len(rows_t), dim),
            text_norms=txt_norm[rows_t] if txt_norm is not None else np.zeros(0, np.float32),
            image_features_pre=_pre_rows(img_pre, rows_i, cfg, "image"),
            text_features_pre=_pre_rows(txt_pre, rows_t, cfg, "text"),
            extra_text_columns={
                c: caps.column(c).to_numpy(zero_copy_only=False) for c in extra_names
            },
            part=part,
        )
        storage.write_json(
            cfg.output,
            f"{cfg.split}/{PARTS_DIR}/{part}.json",
            {
                "images": len(shard_ids),
                "captions": caps.num_rows,
                "errors": len(errors.get(shard, [])),
            },
        )


def _pre_rows(
    pre: np.ndarray | None, rows: np.ndarray, cfg: EmbedConfig, kind: str
) -> np.ndarray | None:
    """Rows of the pre-projection features (an empty matrix of the manifest's width for a
    shard without rows); None without ``pre_projection``."""
    if not cfg.pre_projection:
        return None
    if pre is None:
        width = tables.read_manifest(cfg.output).pre_dim[kind]
        return np.zeros((0, width), np.float32)
    return pre[rows]


def _encoder_info(model: str) -> dict[str, Any]:
    from asymvlm.data.encoder import load_encoder

    return load_encoder(model, device="cpu", load_model=False).info.to_dict()
