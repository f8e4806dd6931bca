"""An embedding output's layout and identity: parts, markers, ``_JOB.json``, ``_SUCCESS.json``
and ``ROOT/manifest.json``."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from asymvlm import storage, tables
from asymvlm.data.embed import EmbedConfig, normalised_location

SUCCESS = "_SUCCESS.json"
JOB = "_JOB.json"
PARTS_DIR = "_parts"
ERRORS_DIR = "errors"
PROMPTS_DIR = "prompts"
ERROR_SCHEMA = pa.schema(
    [("kind", pa.string()), ("id", pa.string()), ("path", pa.string()), ("reason", pa.string())]
)

log = logging.getLogger(__name__)


def part_name(shard: int) -> str:
    return f"part-{shard:05d}"


def manifest_lock(cfg: EmbedConfig) -> storage.OutputLock:
    """``ROOT/manifest.json`` is shared by the splits: read-modify-write it under a short lock
    (waiting for a job on another split that is updating it)."""
    return storage.OutputLock(
        cfg.output, "", name="manifest", wait=60.0, ttl=30.0, renew_every=10.0, log=log.warning
    )


def claim(
    cfg: EmbedConfig, fingerprint: dict[str, Any], lock: storage.OutputLock
) -> dict[str, Any] | None:
    """Check the output's identity before any write (refusing another job's output) and record
    this job's in ``_JOB.json``; returns ``_SUCCESS.json`` when this very job is complete."""
    shown = f"{cfg.output.rstrip('/')}/{cfg.split}"
    done = storage.read_json(cfg.output, f"{cfg.split}/{SUCCESS}")
    if done is not None:
        stored = done.get("fingerprint") or {}
        _refuse_other_job(shown, "holds a finished embedding of another job", fingerprint, stored)
        return done
    job = storage.read_json(cfg.output, f"{cfg.split}/{JOB}")
    if job is not None:
        _refuse_other_job(
            shown, "was written by another job", fingerprint, job.get("fingerprint") or {}
        )
        log.info(f"resuming the job recorded in {shown}/{JOB}")
        return None
    stray = _written_parts(cfg)
    if stray:
        raise tables.TableError(
            f"{shown} holds {stray} but no {JOB} saying which job wrote it; cannot tell "
            "whether it belongs to this job -- "
            "choose another --output, or delete that folder to start over"
        )
    lock.check()
    storage.write_json(
        cfg.output,
        f"{cfg.split}/{JOB}",
        {
            "fingerprint": fingerprint,
            "created": time.time(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        },
    )
    return None


def _refuse_other_job(shown: str, what: str, ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """:class:`TableError` listing the fields that differ, this job's value first."""
    diffs = []
    for key in sorted(k for k in theirs if ours.get(k) != theirs[k]):
        a, b = ours.get(key), theirs[key]
        if key == "source_sha256":
            a, b = f"{a}"[:12] + "...", f"{b}"[:12] + "..."
        diffs.append(f"{key} {a!r} here vs {b!r} there")
    if diffs:
        raise tables.TableError(
            f"{shown} {what}: {'; '.join(diffs)}; choose another --output (or --split)"
        )


def _written_parts(cfg: EmbedConfig) -> str | None:
    """What an output already holds (parquet parts or shard markers), or None if nothing."""
    fs, base = storage.filesystem(cfg.output)
    for kind in (tables.IMAGES_DIR, tables.TEXTS_DIR, ERRORS_DIR, PROMPTS_DIR):
        if tables.list_parquet(fs, storage.join(base, cfg.split, kind)):
            return f"{kind}/ parts"
    markers = fs.get_file_info(
        pafs.FileSelector(storage.join(base, cfg.split, PARTS_DIR), allow_not_found=True)
    )
    if any(m.base_name.endswith(".json") for m in markers):
        return f"{PARTS_DIR}/ markers"
    return None


def split_totals(cfg: EmbedConfig) -> dict[str, int]:
    counts = {}
    for kind, key in ((tables.IMAGES_DIR, "n_images"), (tables.TEXTS_DIR, "n_captions")):
        table = tables.read_parts(cfg.output, cfg.split, kind)
        counts[key] = 0 if table is None else table.num_rows
    errors = tables.read_parts(cfg.output, cfg.split, ERRORS_DIR)
    kinds = [] if errors is None else errors["kind"].to_pylist()
    counts.update(n_image_errors=kinds.count("image"), n_caption_errors=kinds.count("caption"))
    return counts


def write_manifest_once(cfg: EmbedConfig, dim: int, info: Callable[[], dict[str, Any]]) -> None:
    """Write (or check) ``ROOT/manifest.json`` before the first parquet part of this job; the
    manifest lock is only taken when there is none yet (then checked again under it)."""
    if check_manifest(cfg, dim):
        return
    with manifest_lock(cfg):
        if check_manifest(cfg, dim):
            return
        manifest = dict(info())
        manifest.update(model=cfg.model, dim=dim, embedding_dtype="float32", normalised=True)
        tables.write_manifest(cfg.output, manifest)


def record_projection(cfg: EmbedConfig) -> None:
    """With ``pre_projection``: the pre-projection widths in the manifest (``pre_dim``) and the
    model's projections in ``ROOT/projection.npz``, once per root, before the first part with
    such columns (the model is loaded only when either is missing)."""
    manifest = tables.read_manifest(cfg.output)
    if manifest.pre_dim and tables.read_projection(cfg.output, manifest) is not None:
        return  # the manifest's model is this job's (check_manifest)
    from asymvlm.data.encoder import load_encoder

    encoder = load_encoder(cfg.model, device="cpu", dtype="fp32")
    with manifest_lock(cfg):
        manifest = tables.read_manifest(cfg.output)
        if manifest.pre_dim not in (None, {}, encoder.pre_dims()):
            raise tables.TableError(
                f"{cfg.output} records pre-projection widths {manifest.pre_dim} in its "
                f"manifest, but {cfg.model!r} has {encoder.pre_dims()}; choose another --output"
            )
        tables.write_manifest(cfg.output, {**manifest.to_dict(), "pre_dim": encoder.pre_dims()})
        if tables.read_projection(cfg.output) is None:
            tables.write_projection(cfg.output, **encoder.projections())


def check_manifest(cfg: EmbedConfig, dim: int) -> bool:
    """True if ``ROOT/manifest.json`` exists and matches this model and dim; raises if it
    belongs to another model (spellings of one local model directory are the same model)."""
    existing = storage.read_json(cfg.output, tables.MANIFEST_NAME)
    if existing is None:
        return False
    model = existing.get("model")
    same = model == cfg.model or (
        isinstance(model, str)
        and normalised_location(model, model=True) == normalised_location(cfg.model, True)
    )
    if not same or int(existing.get("dim", -1)) != dim:
        raise tables.TableError(
            f"{cfg.output} holds embeddings of model {model!r} (dim {existing.get('dim')}); "
            f"refusing to add {cfg.model!r} (dim {dim})"
        )
    return True
