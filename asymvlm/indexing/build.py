"""Building an index folder from a split's tables and an adapter (docs/search.md): the tables'
parquet parts are streamed batch by batch through the adapter into FAISS, so a split larger than
memory can be indexed, and cut into shards of contiguous rows (one Serve replica each).

Folder layout::

    manifest.json      IndexManifest: tables, fingerprint, encoder, adapter, shards, decisions
    adapter/           a copy of the adapter's files
    shard-00000/ ...   the shards (shard_builder.py)
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from asymvlm.checkpoints import copy_adapter, load_checkpoint, resolve_checkpoint
from asymvlm.data.tiny import is_random_test_model
from asymvlm.embedding.encoders import local_source
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.indexing import kinds
from asymvlm.indexing.forms import InnerProductForm, inner_product_form
from asymvlm.indexing.records import IndexManifest
from asymvlm.indexing.settings import IndexSettings
from asymvlm.indexing.shard_builder import (
    CAPTION_SCHEMA,
    IMAGE_SCHEMA,
    CollectionBuilder,
    ShardBuilder,
)
from asymvlm.indexing.validation import fit_policies
from asymvlm.methods import Encoding, Method
from asymvlm.storage import (
    absolute,
    exists,
    filesystem,
    is_empty_folder,
    is_remote,
    join,
    upload_dir,
    uri_join,
)
from asymvlm.tables import (
    IMAGES_DIR,
    TEXTS_DIR,
    check_split,
    column_matrix,
    fingerprint,
    list_parquet,
    list_splits,
)

logger = logging.getLogger(__name__)

#: Rows read, encoded and added at a time.
BATCH_ROWS = 16384
#: Queries of the build's recall@10 measurement (the other collection's first rows).
SAMPLE_QUERIES = 1000
#: The columns an index reads of each kind of table (``norm`` where there is one).
COLUMNS = {
    IMAGES_DIR: ["image_id", "embedding", "norm"],
    TEXTS_DIR: ["caption_id", "image_id", "text", "embedding", "norm"],
}


def _batches(root: str, split: str, kind: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The batches of ``ROOT/split/kind`` in file-name order (the order ``read_split`` reads)."""
    fs, base = filesystem(root)
    for path in list_parquet(fs, join(base, split, kind)):
        pf = pq.ParquetFile(path, filesystem=fs)
        have = [c for c in columns if c in pf.schema_arrow.names]
        yield from pf.iter_batches(BATCH_ROWS, columns=have, use_threads=False)


def _count(root: str, split: str, kind: str) -> int:
    fs, base = filesystem(root)
    files = list_parquet(fs, join(base, split, kind))
    return sum(pq.ParquetFile(f, filesystem=fs).metadata.num_rows for f in files)


def _finite(method: Method, kind: str, encoding: Encoding, first_row: int) -> Encoding:
    """``encoding``, or a :class:`NonFiniteError` naming the first row with a NaN or inf."""
    for name, value in encoding.items():
        bad = ~torch.isfinite(value.reshape(len(value), -1)).all(dim=1)
        if bad.any():
            row = first_row + int(bad.nonzero()[0, 0])
            raise NonFiniteError(f"{method.name}: non-finite {name} for {kind} row {row}")
    return encoding


@torch.no_grad()
def encode_image_batch(method: Method, batch: pa.RecordBatch, first_row: int) -> Encoding:
    """The adapter's encoding of image rows, fed as :meth:`Method.split_inputs` feeds them."""
    emb = torch.tensor(column_matrix(batch.column("embedding")))
    names = batch.schema.names
    norm = torch.tensor(batch.column("norm").to_numpy()) if "norm" in names else None
    return _finite(method, "image", method.encode_images(method.image_rows(emb, norm)), first_row)


@torch.no_grad()
def encode_caption_batch(method: Method, batch: pa.RecordBatch, first_row: int) -> Encoding:
    """The adapter's encoding of caption rows: raw inputs ``embedding * norm`` for an adapter
    on raw features, as :func:`asymvlm.splits.load_split` makes them."""
    emb = column_matrix(batch.column("embedding"))
    if method.adapter_input == "raw" and "norm" in batch.schema.names:
        emb = np.multiply(emb, batch.column("norm").to_numpy(zero_copy_only=False)[:, None])
    return _finite(method, "caption", method.encode_texts(torch.from_numpy(emb)), first_row)


#: A split's rows of one kind in table order, batch by batch, each with the adapter's encoding.
EncodedBatches = Iterator[tuple[pa.RecordBatch, Encoding]]
#: What encodes them: (tables, split, kind, the adapter loaded, the adapter as given) -> the
#: batches (:func:`encoded_here`, or on Ray Data ``asymvlm_ray.index_build.encoded_on_ray``).
EncodedRows = Callable[[str, str, str, Method, str], EncodedBatches]


def encoded_here(
    tables: str, split: str, kind: str, method: Method, adapter: str = ""
) -> EncodedBatches:
    """The batches of ``ROOT/split/kind`` (``images`` or ``texts``) encoded in this process."""
    encode = encode_image_batch if kind == IMAGES_DIR else encode_caption_batch
    start = 0
    for batch in _batches(tables, split, kind, COLUMNS[kind]):
        yield batch, encode(method, batch, start)
        start += batch.num_rows


def image_paths(tables: str, split: str, described: dict | None) -> dict[str, str]:
    """image_id -> file or URL from the source the tables' manifest describes (its annotations
    only; no image is opened); empty where there is none or it is not here."""
    if not described or not described.get("dataset"):
        return {}
    from asymvlm.data.sources import read_source

    keys = ("annotations", "images", "sample", "seed", "id_list")
    try:
        source = read_source(
            described["dataset"],
            split=described.get("split", split),
            **{key: described.get(key) for key in keys},
        )
    except (OSError, ValueError) as exc:
        logger.warning("%s/%s: the images' files are not known (%s)", tables, split, exc)
        return {}
    ids, paths = source.images["image_id"].to_pylist(), source.images["path"].to_pylist()
    return {i: p for i, p in zip(ids, paths, strict=True) if p}


def _ranges(n: int, shards: int) -> list[range]:
    """``shards`` contiguous ranges of ``n`` rows, as even as can be."""
    bounds = np.linspace(0, n, shards + 1).round().astype(int).tolist()
    return [range(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def _route(ranges: list[range], start: int, rows: int) -> Iterator[tuple[int, slice]]:
    """(shard, the batch's rows in it) of a batch of ``rows`` rows from row ``start``."""
    for shard, within in enumerate(ranges):
        first, last = max(within.start, start), min(within.stop, start + rows)
        if first < last:
            yield shard, slice(first - start, last - start)


class _Build:
    """One build: the shards' builders, fed the images, then the captions, in table order."""

    def __init__(
        self, tables: str, split: str, method: Method, form: InnerProductForm, adapter: str
    ) -> None:
        self.tables = tables
        self.split = split
        self.method = method
        self.form = form
        self.adapter = adapter
        self.n_images = _count(tables, split, IMAGES_DIR)
        self.n_captions = _count(tables, split, TEXTS_DIR)

    def sample_queries(self) -> tuple[np.ndarray, np.ndarray]:
        """(text -> image, image -> text) queries of the recall@10 measurement: the first rows."""
        first = {
            kind: next(_batches(self.tables, self.split, kind, COLUMNS[kind])).slice(
                0, SAMPLE_QUERIES
            )
            for kind in (IMAGES_DIR, TEXTS_DIR)
        }
        texts = encode_caption_batch(self.method, first[TEXTS_DIR], 0)
        images = encode_image_batch(self.method, first[IMAGES_DIR], 0)
        text_queries = self.form.text_queries(texts).float().numpy()
        return text_queries, self.form.image_queries(images).float().numpy()

    def shards(self, folder: str, settings: IndexSettings) -> list[ShardBuilder]:
        """A builder per shard of contiguous rows, each collection's kind chosen for its size
        and its share of the memory budget."""
        self.image_ranges = _ranges(self.n_images, settings.shards)
        self.caption_ranges = _ranges(self.n_captions, settings.shards)
        if any(len(rows) == 0 for rows in [*self.image_ranges, *self.caption_ranges]):
            raise ConfigError(
                f"{settings.shards} shards of {self.n_images} images and {self.n_captions} "
                "captions: a shard would be empty"
            )
        budget = settings.memory_gib and settings.memory_gib * 2**30 / (2 * settings.shards)
        text_queries, image_queries = self.sample_queries()

        def collection(rows: range, width: int, queries: np.ndarray) -> CollectionBuilder:
            spec = kinds.choose_spec(len(rows), width, kind=settings.kind, memory_bytes=budget)
            return CollectionBuilder(spec, queries)

        dim, caption_width = self.method.dim, self.form.caption_width(self.method.dim)
        return [
            ShardBuilder(
                os.path.join(folder, f"shard-{shard:05d}"),
                images,
                captions,
                collection(images, dim, text_queries),
                collection(captions, caption_width, image_queries),
            )
            for shard, (images, captions) in enumerate(
                zip(self.image_ranges, self.caption_ranges, strict=True)
            )
        ]

    def stream(self, shards: list[ShardBuilder], encoded: EncodedRows) -> None:
        """The images, then the captions, ``encoded`` batch by batch, into their shards."""
        described = (check_split(self.tables, self.split).extra.get("splits") or {}).get(self.split)
        paths = image_paths(self.tables, self.split, described)
        start = 0
        for batch, encoding in encoded(
            self.tables, self.split, IMAGES_DIR, self.method, self.adapter
        ):
            ids = batch.column("image_id").to_pylist()
            rows = pa.table({"image_id": ids, "path": [paths.get(i) for i in ids]}, IMAGE_SCHEMA)
            vectors = self.form.image_items(encoding)
            for shard, part in _route(self.image_ranges, start, batch.num_rows):
                shards[shard].add_images(rows[part], encoding["mu"][part], vectors[part])
            start += batch.num_rows
        start = 0
        for batch, encoding in encoded(
            self.tables, self.split, TEXTS_DIR, self.method, self.adapter
        ):
            rows = self.caption_rows(batch, encoding)
            vectors = self.form.caption_items(encoding)
            for shard, part in _route(self.caption_ranges, start, batch.num_rows):
                shards[shard].add_captions(rows[part], encoding["mu"][part], vectors[part])
            start += batch.num_rows

    def caption_rows(self, batch: pa.RecordBatch, encoding: Encoding) -> pa.Table:
        """The rows a person sees: ids, text, kappa and uncertainty (null where undefined)."""
        numbers = {
            "kappa": encoding.get("kappa"),
            "uncertainty": self.method.text_uncertainty_from(encoding),
        }
        columns = {name: batch.column(name) for name in ("caption_id", "image_id", "text")}
        for name, value in numbers.items():
            columns[name] = (
                pa.nulls(batch.num_rows, pa.float32())
                if value is None
                else pa.array(value.float().numpy(), pa.float32())
            )
        return pa.table(columns, CAPTION_SCHEMA)


def _check_output(output: str, overwrite: bool) -> None:
    """An index already at ``output`` is replaced only with ``overwrite``; a folder holding
    anything else is never written into."""
    if exists(uri_join(output, "manifest.json")):
        if not overwrite:
            raise ConfigError(f"{output}: an index is there already (--overwrite replaces it)")
    elif not is_empty_folder(output):
        raise ConfigError(f"{output}: a folder with other files in it; give a new folder")


def build_index(
    tables: str,
    split: str,
    checkpoint: str,
    output: str,
    settings: IndexSettings | None = None,
    *,
    tracking_uri: str | None = None,
    overwrite: bool = False,
    encoded: EncodedRows = encoded_here,
) -> IndexManifest:
    """Index ``tables``/``split`` under the adapter ``checkpoint`` into the folder ``output``
    (local or an object-store URI); the decisions are fitted on ``settings.validation`` where
    the tables hold that split. An index already at ``output`` is kept unless ``overwrite``;
    ``encoded``: where the rows are encoded (here, or on Ray Data)."""
    settings = settings or IndexSettings()
    table_manifest = check_split(tables, split)
    _check_output(output, overwrite)
    folder = resolve_checkpoint(checkpoint, tracking_uri)
    method, meta = load_checkpoint(folder, "cpu")
    method.adapter_input = meta.get("adapter_input", "raw")
    form = inner_product_form(method)
    if int(meta["dim"]) != table_manifest.dim:
        raise CheckpointError(
            f"{checkpoint}: the adapter takes {meta['dim']} dimensions, "
            f"{tables}/{split} has {table_manifest.dim}"
        )
    build = _Build(tables, split, method, form, checkpoint)
    beside = None  # a local index is written beside its place, then moved there at once
    if not is_remote(output):
        beside = os.path.dirname(absolute(output))
        os.makedirs(beside, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".asymvlm-index-", dir=beside)
    try:
        shards = build.shards(work, settings)
        build.stream(shards, encoded)
        records = [shard.finish() for shard in shards]
        policies, validation = {}, settings.validation
        if validation and validation in list_splits(tables):
            if validation == split:
                logger.warning("%s: the decisions are fitted on the split indexed", tables)
            policies = fit_policies(
                method, form, tables, validation, settings.target_risk, settings.widen_max
            )
        elif form.family != "cosine":
            logger.warning(
                "%s: no split %r to fit the decisions on: every query is answered",
                tables,
                validation,
            )
        model = table_manifest.model if table_manifest.model != "synthetic-world" else None
        manifest = IndexManifest(
            tables=tables,
            split=split,
            fingerprint=fingerprint(
                tables, split, table_manifest, build.n_images, build.n_captions
            ),
            encoder=model,
            method=method.name,
            adapter=checkpoint,
            dim=table_manifest.dim,
            images=build.n_images,
            captions=build.n_captions,
            shards=records,
            policies=policies,
            widen_max=settings.widen_max,
            random_encoder=is_random_test_model(local_source(model) if model else None),
        )
        copy_adapter(folder, os.path.join(work, "adapter"))
        with open(os.path.join(work, "manifest.json"), "w") as out:
            out.write(manifest.model_dump_json(indent=2))
        if is_remote(output):
            upload_dir(work, output)
        else:
            if os.path.exists(absolute(output)):  # an index, with overwrite (_check_output)
                shutil.rmtree(absolute(output))
            os.replace(work, absolute(output))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


def log_build(run: Any, output: str, manifest: IndexManifest) -> None:
    """Log a build on an MLflow run (:class:`asymvlm.tracking.Run`): per shard and collection
    its kind, search depth, rows, seconds and recall@10 against exact search; the manifest."""
    params = {"index": output, "tables": manifest.tables, "split": manifest.split}
    params |= {"method": manifest.method, "adapter": manifest.adapter}
    run.log_params({**params, "shards": len(manifest.shards)})
    for shard in manifest.shards:
        for name, record in (("images", shard.images), ("captions", shard.captions)):
            key = f"{shard.folder}.{name}"
            run.log_params({f"{key}.kind": record.spec.kind, f"{key}.depth": record.spec.depth})
            numbers = {"rows": record.rows, "seconds": record.seconds}
            numbers["recall_at_10"] = record.recall_at_10
            run.log_metrics({f"{key}.{n}": v for n, v in numbers.items()})
    run.log_json("index-manifest.json", manifest.model_dump())
