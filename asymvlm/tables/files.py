"""The files of a table root: ``manifest.json``, parquet parts and ``projection.npz``."""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from asymvlm.errors import AsymVLMError
from asymvlm.storage import (
    absolute,
    atomic_path,
    filesystem,
    join,
    named_failures,
    uri_join,
    write_bytes,
)
from asymvlm.storage import read_bytes as read_uri

MANIFEST_NAME = "manifest.json"
PROJECTION_NAME = "projection.npz"
IMAGES_DIR = "images"
TEXTS_DIR = "texts"
IMAGE_COLUMNS = ("image_id", "embedding")
TEXT_COLUMNS = ("caption_id", "image_id", "text", "embedding")
IMAGE_PRE = "image_features_pre"
TEXT_PRE = "text_features_pre"
PRE_COLUMNS = {"image": IMAGE_PRE, "text": TEXT_PRE}
NORM_SPREAD = 1e4
NORM_MAX = 1e6


class TableError(AsymVLMError, ValueError):
    """A table or manifest violates the contract; the message names the file and first bad row."""


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass
class Manifest:
    """``manifest.json``: embedding dimension, embedding model name and any extra keys (e.g.
    ``pre_dim``, ``{"image": int, "text": int}``: the width of the pre-projection columns)."""

    dim: int
    model: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pre_dim(self) -> dict[str, int]:
        """Width of the pre-projection features per modality (empty when there are none)."""
        return dict(self.extra.get("pre_dim") or {})

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON object: ``dim``, ``model`` and the extra keys."""
        return {**self.extra, "dim": int(self.dim), "model": str(self.model)}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "manifest") -> Manifest:
        """Parse a manifest object; raises :class:`TableError` (naming ``source``) if invalid."""
        if not isinstance(data, dict):
            raise TableError(f"{source}: manifest must be a JSON object, got {type(data).__name__}")
        pre_dim = data.get("pre_dim")
        pre_ok = pre_dim is None or (
            isinstance(pre_dim, dict)
            and set(pre_dim) <= set(PRE_COLUMNS)
            and all(map(_positive_int, pre_dim.values()))
        )
        for key, ok, want in (
            ("dim", _positive_int(data.get("dim")), "a positive int: the embeddings' width"),
            ("model", isinstance(data.get("model"), str), "a string: the embedding model"),
            ("pre_dim", pre_ok, "a map of 'image' and/or 'text' to positive ints"),
        ):
            if key not in data and key != "pre_dim":
                raise TableError(f"{source}: manifest has no {key!r} ({want})")
            if not ok:
                raise TableError(
                    f"{source}: manifest {key!r} must be {want}, got {data.get(key)!r}"
                )
        extra = {k: v for k, v in data.items() if k not in ("dim", "model")}
        return cls(dim=data["dim"], model=data["model"], extra=extra)


def write_manifest(root: str, manifest: Manifest | dict[str, Any]) -> None:
    """Write ``ROOT/manifest.json`` atomically (validated first)."""
    data = manifest.to_dict() if isinstance(manifest, Manifest) else manifest
    text = json.dumps(Manifest.from_dict(data).to_dict(), indent=2, sort_keys=True)
    write_bytes(uri_join(root, MANIFEST_NAME), text.encode() + b"\n")


def read_manifest(root: str) -> Manifest:
    """Read ``ROOT/manifest.json``; :class:`TableError` if missing, not JSON, or invalid."""
    shown = absolute(uri_join(root, MANIFEST_NAME))
    raw = read_uri(shown)
    if raw is None:
        raise TableError(f"{shown}: manifest not found")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TableError(f"{shown}: manifest is not valid JSON ({exc})") from exc
    return Manifest.from_dict(data, source=shown)


def write_projection(root: str, **matrices: Any) -> None:
    """Write ``ROOT/projection.npz`` atomically: the frozen model's projection per modality
    (``image=`` / ``text=``, each [dim, pre_dim])."""
    if not matrices or set(matrices) - set(PRE_COLUMNS):
        raise ValueError(f"write_projection takes image= and/or text=, got {sorted(matrices)}")
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in matrices.items()}
    if not all(np.isfinite(a).all() and a.ndim == 2 for a in arrays.values()):
        raise ValueError("projection matrices must be 2-D [dim, pre_dim] without NaN/inf")
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes(uri_join(root, PROJECTION_NAME), buffer.getvalue())


def read_projection(root: str, manifest: Manifest | None = None) -> dict[str, np.ndarray] | None:
    """``ROOT/projection.npz`` as ``{"image": [dim, pre_dim.image], "text": ...}`` or None;
    :class:`TableError` when unreadable or at odds with the manifest."""
    shown = absolute(uri_join(root, PROJECTION_NAME))
    raw = read_uri(shown)
    if raw is None:
        return None
    manifest = manifest if manifest is not None else read_manifest(root)
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            out = {k: np.asarray(npz[k], dtype=np.float32) for k in npz.files}
    except (OSError, ValueError, EOFError) as exc:
        raise TableError(f"{shown}: not a readable .npz file ({exc})") from exc
    for key, matrix in out.items():
        expected = (manifest.dim, manifest.pre_dim.get(key))
        if matrix.shape != expected or not np.isfinite(matrix).all():
            raise TableError(
                f"{shown}: {key} projection has shape {list(matrix.shape)} (finite: "
                f"{bool(np.isfinite(matrix).all())}), the manifest says [dim, pre_dim.{key}] = "
                f"{list(expected)}"
            )
    return out


def parquet_files(fs: pafs.FileSystem, folder: str) -> list[pafs.FileInfo]:
    """Parquet files directly in ``folder`` sorted by name (hidden/temporary names skipped)."""
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    files = [i for i in infos if i.type == pafs.FileType.File and i.extension == "parquet"]
    files = [i for i in files if not i.base_name.startswith((".", "_"))]
    return sorted(files, key=lambda info: info.base_name)


def list_parquet(fs: pafs.FileSystem, folder: str) -> list[str]:
    """The paths of :func:`parquet_files`."""
    return [info.path for info in parquet_files(fs, folder)]


def fingerprint(root: str, split: str, manifest: Manifest, images: int, texts: int) -> str:
    """``sha256:<hex>`` of a split's tables without reading them (docs/sharing.md, "Provenance"):
    the manifest, the row counts and the name and size of every parquet file of the split."""
    fs, base = filesystem(root)
    files = {
        kind: [[info.base_name, info.size] for info in parquet_files(fs, join(base, split, kind))]
        for kind in (IMAGES_DIR, TEXTS_DIR)
    }
    rows = {IMAGES_DIR: images, TEXTS_DIR: texts}
    payload = {"manifest": manifest.to_dict(), "rows": rows, "files": files}
    return "sha256:" + hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def write_part(root: str, split: str, kind: str, part: str, table: pa.Table) -> str:
    """Atomically write ``ROOT/split/kind/part.parquet`` (any table, e.g. ``errors``)."""
    uri = uri_join(root, split, kind, f"{part}.parquet")
    with atomic_path(uri) as (fs, tmp):
        pq.write_table(table, tmp, filesystem=fs)
    return absolute(uri)


def column_matrix(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``[n, width]`` float32 of a list or tensor column this package wrote (no checks)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    blocks = [
        np.asarray(c.to_numpy_ndarray())
        if isinstance(c, pa.ExtensionArray)
        else c.flatten().to_numpy(zero_copy_only=False).reshape(len(c), -1)
        for c in chunks
        if len(c)
    ]
    if not blocks:
        typ = column.type
        return np.zeros((0, typ.list_size if pa.types.is_fixed_size_list(typ) else 0), np.float32)
    matrix = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    return matrix.astype(np.float32, copy=False)


def read_parts(root: str, split: str, kind: str) -> pa.Table | None:
    """All ``ROOT/split/kind/*.parquet`` concatenated in name order, or None if there are none."""
    fs, base = filesystem(root)
    files = list_parquet(fs, join(base, split, kind))
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f, filesystem=fs) for f in files])


def list_splits(root: str) -> list[str]:
    """Names of the splits under ``root`` (sub-folders holding ``images/`` or ``texts/``)."""
    fs, base = filesystem(root)
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    dirs = [i.path for i in infos if i.type == pafs.FileType.Directory]
    subs = fs.get_file_info([join(d, sub) for d in dirs for sub in (IMAGES_DIR, TEXTS_DIR)])
    found = {posixpath.dirname(i.path) for i in subs if i.type == pafs.FileType.Directory}
    return sorted(posixpath.basename(folder) for folder in found)


def check_split(root: str, split: str) -> Manifest:
    """The manifest of table root ``root`` when it holds ``split``, else one
    :class:`TableError`, the same whichever command asks: no such folder, no manifest, or no
    such split (naming those there); a store that cannot be listed is a StorageError naming it."""
    with named_failures(root):
        splits = list_splits(root)
        if not splits:
            fs, base = filesystem(root)
            if fs.get_file_info(base).type == pafs.FileType.NotFound:
                raise TableError(f"{root}: no such folder")
    manifest = read_manifest(root)
    if split not in splits:
        there = ", ".join(splits) or "none"
        raise TableError(f"{root}: no split {split!r} (splits there: {there})")
    return manifest
