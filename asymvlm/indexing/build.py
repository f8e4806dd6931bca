"""Building an index folder from a split's tables and an adapter (docs/search.md): the tables'
parquet parts are streamed batch by batch through the adapter into FAISS, so a split larger than
memory can be indexed; what a person needs to see (ids, captions, image paths) goes beside it.

Folder layout::

    manifest.json      IndexManifest: tables, fingerprint, encoder, adapter, kinds, policies
    images.faiss       text -> image: the images' z (App. A.2: the ranking of one caption)
    captions.faiss     image -> text: the captions' inner-product vectors (forms.py)
    images.parquet     row -> image_id, path
    captions.parquet   row -> caption_id, image_id, text, kappa, uncertainty
    image_mu.npy       [images, d] z and caption_mu.npy [captions, d] mu: the exact re-ranking
    adapter/           a copy of the adapter's files
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from asymvlm.checkpoints import copy_adapter, load_checkpoint, resolve_checkpoint
from asymvlm.data.tiny import is_random_test_model
from asymvlm.embedding.encoders import local_source
from asymvlm.errors import CheckpointError, NonFiniteError
from asymvlm.indexing import kinds
from asymvlm.indexing.forms import InnerProductForm, inner_product_form
from asymvlm.indexing.records import CollectionRecord, IndexManifest
from asymvlm.indexing.settings import IndexSettings
from asymvlm.indexing.validation import fit_policies
from asymvlm.methods import Encoding, Method
from asymvlm.storage import absolute, filesystem, is_remote, join, upload_dir
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
IMAGE_COLUMNS = ["image_id", "embedding", "norm"]
CAPTION_COLUMNS = ["caption_id", "image_id", "text", "embedding", "norm"]


def _batches(root: str, split: str, kind: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The batches of ``ROOT/split/kind`` in file-name order (the rows' order when read)."""
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
    for name, value in encoding.items():
        bad = ~torch.isfinite(value.reshape(len(value), -1)).all(dim=1)
        if bad.any():
            row = first_row + int(bad.nonzero()[0, 0])
            raise NonFiniteError(f"{method.name}: non-finite {name} for {kind} row {row}")
    return encoding


@torch.no_grad()
def encode_image_batch(method: Method, batch: pa.RecordBatch, first_row: int) -> Encoding:
    """The adapter's encoding of a batch of image rows (as :meth:`Method.split_inputs` feeds it)."""
    emb = torch.tensor(column_matrix(batch.column("embedding")))
    names = batch.schema.names
    norm = torch.tensor(batch.column("norm").to_numpy()) if "norm" in names else None
    return _finite(method, "image", method.encode_images(method.image_rows(emb, norm)), first_row)


@torch.no_grad()
def encode_caption_batch(method: Method, batch: pa.RecordBatch, first_row: int) -> Encoding:
    """The adapter's encoding of a batch of caption rows (raw inputs ``embedding * norm`` for an
    adapter on raw features, as :func:`asymvlm.splits.load_split` makes them)."""
    emb = column_matrix(batch.column("embedding"))
    if method.adapter_input == "raw" and "norm" in batch.schema.names:
        emb = np.multiply(emb, batch.column("norm").to_numpy(zero_copy_only=False)[:, None])
    return _finite(method, "caption", method.encode_texts(torch.from_numpy(emb)), first_row)


@dataclass
class _Collection:
    """One collection being built: its FAISS index (trained on its first rows) and the exact
    top 10 of the sample queries, kept as the rows stream by."""

    spec: kinds.IndexSpec
    queries: np.ndarray
    rows: int = 0

    def __post_init__(self) -> None:
        self.index = self.spec.create()
        self.heap = faiss.ResultHeap(len(self.queries), 10, keep_max=True)
        self.pending: list[np.ndarray] = []
        self.started = time.perf_counter()

    def add(self, vectors: torch.Tensor) -> None:
        block = np.ascontiguousarray(vectors.float().numpy())
        ids = np.arange(self.rows, self.rows + len(block), dtype=np.int64)
        self.heap.add_result(
            self.queries @ block.T, np.broadcast_to(ids, (len(self.queries), len(ids)))
        )
        self.rows += len(block)
        self.pending.append(block)
        if self.index.is_trained or sum(map(len, self.pending)) >= self.spec.training_rows():
            self.flush()

    def flush(self) -> None:
        """Train on the rows so far if the kind trains, and add them."""
        if self.pending:
            block = np.concatenate(self.pending)
            self.pending = []
            if not self.index.is_trained:
                self.index.train(block)
            self.index.add(block)

    def finish(self, path: str) -> CollectionRecord:
        """Tune the search depth on the sample queries, write the index, return its record."""
        self.flush()
        self.heap.finalize()
        exact = self.heap.I[:, : min(10, self.rows)]
        depth, recall = kinds.tune_depth(self.index, self.spec, self.queries, exact)
        spec = self.spec.model_copy(update={"depth": depth})
        faiss.write_index(self.index, path)
        return CollectionRecord(
            spec=spec,
            rows=self.rows,
            seconds=round(time.perf_counter() - self.started, 3),
            recall_at_10=round(recall, 4),
            sample_queries=len(self.queries),
        )


def _image_paths(tables: str, split: str, described: dict | None) -> dict[str, str]:
    """image_id -> file or URL, read from the source the tables' manifest describes (its
    annotations only; no image is opened). Empty when there is none or it is not here."""
    if not described or not described.get("dataset"):
        return {}
    from asymvlm.data.sources import read_source

    keys = ("annotations", "images", "sample", "seed", "id_list")
    try:
        source = read_source(
            described["dataset"],
            split=described.get("split", split),
            **{k: described.get(k) for k in keys},
        )
    except (OSError, ValueError) as exc:
        logger.warning("%s/%s: no image paths (%s)", tables, split, exc)
        return {}
    images = source.images
    return {
        i: p
        for i, p in zip(images["image_id"].to_pylist(), images["path"].to_pylist(), strict=True)
        if p
    }


def build_index(
    tables: str,
    split: str,
    checkpoint: str,
    output: str,
    settings: IndexSettings | None = None,
    *,
    tracking_uri: str | None = None,
) -> IndexManifest:
    """Index ``tables``/``split`` under the adapter ``checkpoint`` into the folder ``output``
    (local or an object-store URI); the decisions are fitted on ``settings.validation`` where
    the tables hold that split."""
    settings = settings or IndexSettings()
    memory = None if settings.memory_gib is None else settings.memory_gib * 2**30
    table_manifest = check_split(tables, split)
    folder = resolve_checkpoint(checkpoint, tracking_uri)
    method, meta = load_checkpoint(folder, "cpu")
    method.adapter_input = meta.get("adapter_input", "raw")
    form = inner_product_form(method)
    if int(meta["dim"]) != table_manifest.dim:
        raise CheckpointError(
            f"{checkpoint}: the adapter takes {meta['dim']} dimensions, "
            f"{tables}/{split} has {table_manifest.dim}"
        )
    n_images, n_captions = _count(tables, split, IMAGES_DIR), _count(tables, split, TEXTS_DIR)
    work = tempfile.mkdtemp(prefix="asymvlm-index-") if is_remote(output) else absolute(output)
    os.makedirs(work, exist_ok=True)
    try:
        record = _write(
            tables, split, method, form, work, n_images, n_captions, settings.kind, memory
        )
        model = table_manifest.model if table_manifest.model != "synthetic-world" else None
        files = local_source(model) if model else None
        policies, validation = {}, settings.validation
        if validation and validation != split and validation in list_splits(tables):
            policies = fit_policies(
                method, form, tables, validation, settings.target_risk, settings.widen_max
            )
        elif form.family != "cosine":
            logger.warning(
                "%s: no split %r to fit the decisions on: every query is answered",
                tables,
                validation,
            )
        manifest = IndexManifest(
            tables=tables,
            split=split,
            fingerprint=fingerprint(tables, split, table_manifest, n_images, n_captions),
            encoder=model,
            method=method.name,
            adapter=checkpoint,
            dim=table_manifest.dim,
            policies=policies,
            random_encoder=is_random_test_model(files),
            widen_max=settings.widen_max,
            **record,
        )
        copy_adapter(folder, os.path.join(work, "adapter"))
        with open(os.path.join(work, "manifest.json"), "w") as out:
            out.write(manifest.model_dump_json(indent=2))
        if is_remote(output):
            upload_dir(work, output)
    finally:
        if is_remote(output):
            shutil.rmtree(work, ignore_errors=True)
    return manifest


def _write(
    tables: str,
    split: str,
    method: Method,
    form: InnerProductForm,
    work: str,
    n_images: int,
    n_captions: int,
    kind: str,
    memory_bytes: float | None,
) -> dict[str, CollectionRecord]:
    """Stream the images, then the captions, into their indexes and files."""
    first_images = next(_batches(tables, split, IMAGES_DIR, IMAGE_COLUMNS)).slice(0, SAMPLE_QUERIES)
    first_captions = next(_batches(tables, split, TEXTS_DIR, CAPTION_COLUMNS)).slice(
        0, SAMPLE_QUERIES
    )
    text_queries = form.text_queries(encode_caption_batch(method, first_captions, 0))
    image_queries = form.image_queries(encode_image_batch(method, first_images, 0))
    budget = None if memory_bytes is None else memory_bytes / 2  # shared by the two indexes
    out = {}

    images = _Collection(
        kinds.choose_spec(
            n_images,
            form.image_items({"mu": torch.zeros(1, method.dim)}).shape[1],
            kind=kind,
            memory_bytes=budget,
        ),
        text_queries.float().numpy(),
    )
    paths = _image_paths(
        tables, split, (check_split(tables, split).extra.get("splits") or {}).get(split)
    )
    image_mu = np.lib.format.open_memmap(
        os.path.join(work, "image_mu.npy"), "w+", np.float32, (n_images, method.dim)
    )
    schema = pa.schema([("image_id", pa.string()), ("path", pa.string())])
    with pq.ParquetWriter(os.path.join(work, "images.parquet"), schema) as writer:
        for batch in _batches(tables, split, IMAGES_DIR, IMAGE_COLUMNS):
            start = images.rows
            encoding = encode_image_batch(method, batch, start)
            image_mu[start : start + batch.num_rows] = encoding["mu"].float().numpy()
            images.add(form.image_items(encoding))
            ids = batch.column("image_id").to_pylist()
            writer.write_table(
                pa.table({"image_id": ids, "path": [paths.get(i) for i in ids]}, schema=schema)
            )
    image_mu.flush()
    out["images"] = images.finish(os.path.join(work, "images.faiss"))

    captions = None
    caption_mu = np.lib.format.open_memmap(
        os.path.join(work, "caption_mu.npy"), "w+", np.float32, (n_captions, method.dim)
    )
    schema = pa.schema(
        [
            ("caption_id", pa.string()),
            ("image_id", pa.string()),
            ("text", pa.string()),
            ("kappa", pa.float32()),
            ("uncertainty", pa.float32()),
        ]
    )
    with pq.ParquetWriter(os.path.join(work, "captions.parquet"), schema) as writer:
        for batch in _batches(tables, split, TEXTS_DIR, CAPTION_COLUMNS):
            encoding = encode_caption_batch(method, batch, captions.rows if captions else 0)
            vectors = form.caption_items(encoding)
            if captions is None:
                spec = kinds.choose_spec(
                    n_captions, vectors.shape[1], kind=kind, memory_bytes=budget
                )
                captions = _Collection(spec, image_queries.float().numpy())
            start = captions.rows
            caption_mu[start : start + batch.num_rows] = encoding["mu"].float().numpy()
            captions.add(vectors)
            unc = method.text_uncertainty_from(encoding)
            numbers = {
                name: pa.array(None if value is None else value.float().numpy(), pa.float32())
                if value is not None
                else pa.nulls(batch.num_rows, pa.float32())
                for name, value in (("kappa", encoding.get("kappa")), ("uncertainty", unc))
            }
            writer.write_table(
                pa.table(
                    {
                        "caption_id": batch.column("caption_id"),
                        "image_id": batch.column("image_id"),
                        "text": batch.column("text"),
                        **numbers,
                    },
                    schema=schema,
                )
            )
    caption_mu.flush()
    out["captions"] = captions.finish(os.path.join(work, "captions.faiss"))
    return out
