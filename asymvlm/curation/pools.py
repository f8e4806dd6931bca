"""Image-text pools as they come, read shard by shard in bounded batches: img2dataset's parquet
and WebDataset tars, clip-retrieval's ``clip inference`` output, DataComp's metadata parquet
with its ``.npz`` features, and the project's own tables (docs/curate.md)."""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from asymvlm import storage, tables
from asymvlm.errors import AsymVLMError

#: DataComp's .npz features: the key prefix and the dimension of each CLIP.
DATACOMP_FEATURES = {"b32": 512, "l14": 768}


class PoolError(AsymVLMError, ValueError):
    """A pool, or one of its shards, that cannot be read: the file and the reason."""


@dataclass(frozen=True)
class PoolShard:
    """One input shard: its output name, format and files (``rows``: parquet/tar/metadata;
    ``text_emb``, ``img_emb``: .npy; ``npz``: DataComp features; ``images``: tables)."""

    name: str
    format: str
    files: dict[str, str]


@dataclass
class Rows:
    """A batch of a shard's rows: its row numbers in the shard and what the pool gives."""

    row: np.ndarray
    key: pa.Array
    text: pa.Array | None = None
    uid: pa.Array | None = None
    text_emb: np.ndarray | None = None
    text_norm: np.ndarray | None = None
    image_emb: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.row)


def _files(root: str, suffix: str) -> list[str]:
    """The files under ``root`` ending in ``suffix``, sorted (hidden and ``_`` names left out)."""
    fs, path = storage.fsspec_filesystem(root)
    with storage.named_failures(root):
        found = fs.find(path)
    keep = [
        p for p in found if p.endswith(suffix) and not posixpath.basename(p).startswith((".", "_"))
    ]
    return sorted(fs.unstrip_protocol(p) if storage.is_remote(root) else p for p in keep)


def _name(root: str, uri: str) -> str:
    """A shard's output name: its path under the pool, without the suffix, '/' as '__'."""
    _, base = storage.fsspec_filesystem(root)
    _, path = storage.fsspec_filesystem(uri)
    relative = posixpath.relpath(path, base.rstrip("/"))
    return relative.rsplit(".", 1)[0].replace("/", "__")


@contextmanager
def _open(uri: str) -> Iterator[BinaryIO]:
    """``uri`` opened for reading, its store's failures named."""
    fs, path = storage.fsspec_filesystem(uri)
    with storage.named_failures(uri), fs.open(path, "rb") as f:
        yield f


def _parquet_columns(uri: str) -> list[str]:
    with _open(uri) as f:
        return pq.ParquetFile(f).schema_arrow.names


def _number(uri: str) -> tuple[int, str]:
    """clip-retrieval's shards in the order of their numbers (``metadata_10`` after ``_9``)."""
    stem = posixpath.basename(uri).removesuffix(".parquet").rpartition("_")[2]
    return (int(stem), uri) if stem.isdigit() else (-1, uri)


def detect_format(pool: str) -> str:
    """The pool's format from its files (:class:`PoolError` when none fits)."""
    names = set(storage.list_names(pool))
    folders = {
        n
        for n in ("metadata", "text_emb", "img_emb")
        if not storage.is_empty_folder(storage.uri_join(pool, n))
    }
    if "metadata" in folders and folders & {"text_emb", "img_emb"}:
        return "clip-retrieval"
    if tables.MANIFEST_NAME in names:
        return "tables"
    parquet = _files(pool, ".parquet")
    if parquet:
        columns = set(_parquet_columns(parquet[0]))
        if {"uid", "text"} <= columns:
            return "datacomp"
        if {"key", "caption"} <= columns:
            return "img2dataset"
        raise PoolError(
            f"{parquet[0]}: neither DataComp's (uid, text) nor img2dataset's (key, caption) "
            f"columns, but {', '.join(sorted(columns))}; give --format"
        )
    if _files(pool, ".tar"):
        return "webdataset"
    raise PoolError(
        f"{pool}: no pool found (no parquet, no .tar, no clip-retrieval metadata/ and "
        "text_emb/, no tables' manifest.json)"
    )


def find_shards(pool: str, format: str, split: str = "train") -> list[PoolShard]:
    """The shards of ``pool`` in ``format`` (``auto``: :func:`detect_format`), in order."""
    format = detect_format(pool) if format == "auto" else format
    if format == "clip-retrieval":
        shards = []
        for meta in sorted(_files(storage.uri_join(pool, "metadata"), ".parquet"), key=_number):
            index = posixpath.basename(meta).removesuffix(".parquet").rpartition("_")[2]
            files = {"rows": meta}
            for kind in ("text_emb", "img_emb"):
                npy = storage.uri_join(pool, kind, f"{kind}_{index}.npy")
                if storage.exists(npy):
                    files[kind] = npy
            shards.append(PoolShard(f"metadata_{index}", format, files))
        return shards
    if format == "tables":
        texts = _files(storage.uri_join(pool, split, tables.TEXTS_DIR), ".parquet")
        where = {"root": pool, "split": split}
        return [PoolShard(_name(pool, t), format, {"rows": t, **where}) for t in texts]
    suffix = ".tar" if format == "webdataset" else ".parquet"
    shards = []
    for uri in _files(pool, suffix):
        files = {"rows": uri}
        npz = uri.removesuffix(".parquet") + ".npz"
        if format == "datacomp" and storage.exists(npz):
            files["npz"] = npz
        shards.append(PoolShard(_name(pool, uri), format, files))
    return shards


# -- reading one shard ----------------------------------------------------------------------
def npy_header(uri: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a C-ordered .npy file, from its header alone."""
    with _open(uri) as f:
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0
            if version != (1, 0):
                read = np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
        except ValueError as err:
            raise PoolError(f"{uri}: not a .npy file ({err})") from None
        if fortran:
            raise PoolError(f"{uri}: a Fortran-ordered array; save it C-ordered")
        return shape, dtype, f.tell()


def npy_rows(uri: str, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a 2-d .npy file, read alone (local or object store)."""
    shape, dtype, offset = npy_header(uri)
    width = int(np.prod(shape[1:]))
    with _open(uri) as f:
        f.seek(offset + start * width * dtype.itemsize)
        data = f.read((stop - start) * width * dtype.itemsize)
    return np.frombuffer(data, dtype).reshape(stop - start, width).astype(np.float32)


def _parquet_batches(uri: str, rows: int, columns: list[str]) -> Iterator[pa.RecordBatch]:
    with _open(uri) as f:
        pf = pq.ParquetFile(f)
        missing = sorted(set(columns) - set(pf.schema_arrow.names))
        if missing:
            raise PoolError(f"{uri}: no column {', '.join(missing)}")
        yield from pf.iter_batches(batch_size=rows, columns=columns)


def parquet_rows(uri: str) -> int:
    """The rows of a parquet file, from its footer."""
    with _open(uri) as f:
        return pq.ParquetFile(f).metadata.num_rows


def _strings(array: pa.Array) -> pa.Array:
    return array.cast(pa.string()) if not pa.types.is_string(array.type) else array


def _img2dataset(shard: PoolShard, rows: int) -> Iterator[Rows]:
    done = 0
    for batch in _parquet_batches(shard.files["rows"], rows, ["key", "caption"]):
        row = np.arange(done, done + batch.num_rows)
        done += batch.num_rows
        yield Rows(row, _strings(batch["key"]), text=_strings(batch["caption"]))


def _datacomp(shard: PoolShard, rows: int, features: str) -> Iterator[Rows]:
    arrays: dict[str, np.ndarray] = {}
    if "npz" in shard.files:
        data = storage.read_bytes(shard.files["npz"]) or b""
        with np.load(io.BytesIO(data)) as npz:
            for kind in ("txt", "img"):
                if f"{features}_{kind}" in npz:
                    arrays[kind] = npz[f"{features}_{kind}"]
    total = parquet_rows(shard.files["rows"])
    for kind, array in arrays.items():
        if len(array) != total:
            raise PoolError(
                f"{shard.files['npz']}: {features}_{kind} has {len(array)} rows, "
                f"{shard.files['rows']} {total}"
            )
    done = 0
    for batch in _parquet_batches(shard.files["rows"], rows, ["uid", "text"]):
        part = slice(done, done + batch.num_rows)
        row = np.arange(part.start, part.stop)
        done = part.stop
        text_emb, image_emb = (
            arrays[k][part].astype(np.float32) if k in arrays else None for k in ("txt", "img")
        )
        uid = _strings(batch["uid"])
        yield Rows(
            row, uid, text=_strings(batch["text"]), uid=uid, text_emb=text_emb, image_emb=image_emb
        )


def _clip_retrieval(shard: PoolShard, rows: int) -> Iterator[Rows]:
    meta = shard.files["rows"]
    columns = [c for c in ("key", "caption") if c in _parquet_columns(meta)]
    done = 0
    for batch in _parquet_batches(meta, rows, columns):
        part = (done, done + batch.num_rows)
        done = part[1]
        emb = {
            k: npy_rows(shard.files[k], *part) for k in ("text_emb", "img_emb") if k in shard.files
        }
        row = np.arange(*part)
        key = _strings(batch["key"]) if "key" in columns else pa.array(row.astype(str))
        text = _strings(batch["caption"]) if "caption" in columns else None
        yield Rows(row, key, text=text, text_emb=emb.get("text_emb"), image_emb=emb.get("img_emb"))


def _tables(shard: PoolShard, rows: int) -> Iterator[Rows]:
    images = tables.read_parts(shard.files["root"], shard.files["split"], tables.IMAGES_DIR)
    where = {i: n for n, i in enumerate(images["image_id"].to_pylist())}
    image_matrix = tables.column_matrix(images["embedding"])
    columns = ["caption_id", "image_id", "text", "embedding"]
    if "norm" in _parquet_columns(shard.files["rows"]):  # raw norms, where the tables keep them
        columns.append("norm")
    done = 0
    for batch in _parquet_batches(shard.files["rows"], rows, columns):
        row = np.arange(done, done + batch.num_rows)
        done += batch.num_rows
        owners = [where.get(i, -1) for i in batch["image_id"].to_pylist()]
        if -1 in owners:
            missing = batch["image_id"][owners.index(-1)].as_py()
            raise PoolError(f"{shard.files['rows']}: image_id {missing} is not in its images")
        yield Rows(
            row,
            _strings(batch["caption_id"]),
            text=batch["text"],
            text_emb=tables.column_matrix(batch["embedding"]),
            text_norm=batch["norm"].to_numpy().astype(np.float32) if "norm" in columns else None,
            image_emb=image_matrix[owners],
        )


def _webdataset(shard: PoolShard, rows: int) -> Iterator[Rows]:
    """A tar's samples (consecutive members of one key) with the caption of ``KEY.txt``, or
    else of ``KEY.json`` (img2dataset writes both); a sample with neither has none."""
    uri = shard.files["rows"]
    keys: list[str] = []
    texts: list[str | None] = []
    done = 0
    with _open(uri) as f:
        try:
            with tarfile.open(fileobj=f, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    key, _, ext = posixpath.basename(member.name).partition(".")
                    key = posixpath.join(posixpath.dirname(member.name), key)
                    if not keys or keys[-1] != key:
                        if len(keys) == rows:
                            yield Rows(
                                np.arange(done, done + rows),
                                pa.array(keys),
                                text=pa.array(texts, pa.string()),
                            )
                            done, keys, texts = done + rows, [], []
                        keys.append(key)
                        texts.append(None)
                    if ext == "txt":
                        texts[-1] = tar.extractfile(member).read().decode("utf-8")
                    elif ext == "json" and texts[-1] is None:
                        texts[-1] = json.load(tar.extractfile(member)).get("caption")
        except (tarfile.TarError, UnicodeDecodeError, json.JSONDecodeError, EOFError) as err:
            raise PoolError(f"{uri}: not a readable WebDataset tar ({err})") from None
    if keys:
        yield Rows(
            np.arange(done, done + len(keys)), pa.array(keys), text=pa.array(texts, pa.string())
        )


def read_shard(shard: PoolShard, rows: int, features: str = "b32") -> Iterator[Rows]:
    """The rows of ``shard`` in batches of at most ``rows``."""
    if shard.format == "img2dataset":
        return _img2dataset(shard, rows)
    if shard.format == "datacomp":
        return _datacomp(shard, rows, features)
    if shard.format == "clip-retrieval":
        return _clip_retrieval(shard, rows)
    if shard.format == "tables":
        return _tables(shard, rows)
    return _webdataset(shard, rows)
