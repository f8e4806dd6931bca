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

from asymvlm import storage, tables
from asymvlm.embedding.embed_config import EmbedConfig, normalised_model
from asymvlm.output_lock import OutputLock

SUCCESS, JOB = "_SUCCESS.json", "_JOB.json"
PARTS_DIR, ERRORS_DIR, PROMPTS_DIR = "_parts", "errors", "prompts"
ERROR_SCHEMA = pa.schema(
    {"kind": pa.string(), "id": pa.string(), "path": pa.string(), "reason": pa.string()}
)

log = logging.getLogger(__name__)


def part_name(shard: int) -> str:
    return f"part-{shard:05d}"


def manifest_lock(cfg: EmbedConfig) -> OutputLock:
    """A short lock on ``ROOT/manifest.json``, which the splits share (read-modify-write)."""
    return OutputLock(
        cfg.output, "", name="manifest", wait=60.0, ttl=30.0, renew_every=10.0, log=log.warning
    )


def claim(cfg: EmbedConfig, fingerprint: dict[str, Any], lock: OutputLock) -> dict[str, Any] | None:
    """Refuse another job's output, record this job in ``_JOB.json``; ``_SUCCESS.json`` if done."""
    shown = f"{cfg.output.rstrip('/')}/{cfg.split}"
    for name, what in (
        (SUCCESS, "holds a finished embedding of another job"),
        (JOB, "was written by another job"),
    ):
        record = storage.read_json(cfg.output, f"{cfg.split}/{name}")
        if record is None:
            continue
        theirs = record.get("fingerprint") or {}
        diffs = []
        for key in sorted(k for k in theirs if fingerprint.get(k) != theirs[k]):
            a, b = fingerprint.get(key), theirs[key]
            if key == "source_sha256":
                a, b = f"{a}"[:12] + "...", f"{b}"[:12] + "..."
            diffs.append(f"{key} {a!r} here vs {b!r} there")
        if diffs:
            raise tables.TableError(
                f"{shown} {what}: {'; '.join(diffs)}; choose another --output (or --split)"
            )
        if name == SUCCESS:
            return record
        log.info(f"resuming the job recorded in {shown}/{JOB}")
        return None
    names = storage.list_names(storage.uri_join(cfg.output, cfg.split, PARTS_DIR))
    stray = f"{PARTS_DIR}/ markers" if any(n.endswith(".json") for n in names) else None
    for kind in (tables.IMAGES_DIR, tables.TEXTS_DIR, ERRORS_DIR, PROMPTS_DIR):
        if storage.list_names(storage.uri_join(cfg.output, cfg.split, kind)):
            stray = f"{kind}/ parts"
    if stray:
        raise tables.TableError(
            f"{shown} holds {stray} but no {JOB} saying which job wrote it; cannot tell "
            "whether it belongs to this job -- choose another --output, or delete that folder "
            "to start over"
        )
    lock.check()
    job = {"fingerprint": fingerprint, "created": time.time(), "host": socket.gethostname()}
    storage.write_json(cfg.output, f"{cfg.split}/{JOB}", {**job, "pid": os.getpid()})
    return None


def split_totals(cfg: EmbedConfig) -> dict[str, int]:
    counts = {}
    for kind, key in (tables.IMAGES_DIR, "n_images"), (tables.TEXTS_DIR, "n_captions"):
        table = tables.read_parts(cfg.output, cfg.split, kind)
        counts[key] = 0 if table is None else table.num_rows
    errors = tables.read_parts(cfg.output, cfg.split, ERRORS_DIR)
    kinds = [] if errors is None else errors["kind"].to_pylist()
    return counts | {f"n_{kind}_errors": kinds.count(kind) for kind in ("image", "caption")}


def write_manifest_once(cfg: EmbedConfig, dim: int, info: Callable[[], dict[str, Any]]) -> None:
    """Write (or check) ``ROOT/manifest.json`` before the first part; with ``pre_projection``
    also ``pre_dim`` and ``ROOT/projection.npz`` (loading the model only when either is missing)."""
    if not check_manifest(cfg, dim):
        with manifest_lock(cfg):
            if not check_manifest(cfg, dim):
                manifest = {**info(), "model": cfg.model, "dim": dim}
                manifest.update(embedding_dtype="float32", normalised=True)
                tables.write_manifest(cfg.output, manifest)
    manifest = tables.read_manifest(cfg.output)
    if not cfg.pre_projection or (
        manifest.pre_dim and tables.read_projection(cfg.output, manifest) is not None
    ):
        return
    from asymvlm.embedding.encoders import load_encoder

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
    """Whether ``ROOT/manifest.json`` exists (and matches this model and dim, or raises)."""
    existing = storage.read_json(cfg.output, tables.MANIFEST_NAME)
    if existing is None:
        return False
    model = existing.get("model")
    same = isinstance(model, str) and normalised_model(model) == normalised_model(cfg.model)
    if not same or int(existing.get("dim", -1)) != dim:
        raise tables.TableError(
            f"{cfg.output} holds embeddings of model {model!r} (dim {existing.get('dim')}); "
            f"refusing to add {cfg.model!r} (dim {dim})"
        )
    return True
