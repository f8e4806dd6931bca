"""Writing one shard of an index folder as rows stream by (:class:`ShardBuilder`): each
collection's FAISS index, trained on its first rows, with the exact top 10 of a sample of
queries kept on the way (the build's recall@10), and the rows' ids, texts and vectors beside it.

Shard folder layout::

    images.faiss       text -> image: the images' z
    captions.faiss     image -> text: the captions' inner-product vectors (forms.py)
    images.parquet     row -> image_id, path
    captions.parquet   row -> caption_id, image_id, text, kappa, uncertainty
    image_mu.npy       [images, d] z and caption_mu.npy [captions, d] mu: the exact re-ranking
"""

from __future__ import annotations

import os
import time
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from asymvlm.indexing import kinds
from asymvlm.indexing.records import CollectionRecord, ShardRecord

IMAGE_SCHEMA = pa.schema([("image_id", pa.string()), ("path", pa.string())])
CAPTION_SCHEMA = pa.schema(
    [
        ("caption_id", pa.string()),
        ("image_id", pa.string()),
        ("text", pa.string()),
        ("kappa", pa.float32()),
        ("uncertainty", pa.float32()),
    ]
)


class CollectionBuilder:
    """One collection's FAISS index and the exact top 10 of ``queries`` over its rows."""

    def __init__(self, spec: kinds.IndexSpec, queries: np.ndarray) -> None:
        self.spec = spec
        self.queries = queries
        self.rows = 0
        self.index = spec.create()
        self.exact = faiss.ResultHeap(len(queries), 10, keep_max=True)
        self.pending: list[np.ndarray] = []
        self.started = time.perf_counter()

    def add(self, vectors: torch.Tensor) -> None:
        """Add rows (held back until the kind has its training rows)."""
        block = np.ascontiguousarray(vectors.float().numpy())
        ids = np.arange(self.rows, self.rows + len(block), dtype=np.int64)
        self.exact.add_result(
            self.queries @ block.T, np.broadcast_to(ids, (len(self.queries), len(ids)))
        )
        self.rows += len(block)
        self.pending.append(block)
        if self.index.is_trained or sum(map(len, self.pending)) >= self.spec.training_rows():
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            block = np.concatenate(self.pending)
            self.pending = []
            if not self.index.is_trained:
                self.index.train(block)
            self.index.add(block)

    def finish(self, path: str) -> CollectionRecord:
        """Tune the search depth on the sample queries, write the index, return its record."""
        self._flush()
        self.exact.finalize()
        exact = self.exact.I[:, : min(10, self.rows)]
        depth, recall = kinds.tune_depth(self.index, self.spec, self.queries, exact)
        faiss.write_index(self.index, path)
        return CollectionRecord(
            spec=self.spec.model_copy(update={"depth": depth}),
            rows=self.rows,
            seconds=round(time.perf_counter() - self.started, 3),
            recall_at_10=round(recall, 4),
            sample_queries=len(self.queries),
        )


def _npy_writer(path: str, shape: tuple[int, int]) -> Any:
    """An open ``.npy`` file of float32 ``shape`` whose rows are then written in order (a write,
    not a memory map: the rows written do not stay in this process's memory)."""
    out = open(path, "wb")  # noqa: SIM115 - closed by ShardBuilder.finish
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(out, header)
    return out


class ShardBuilder:
    """The files of one shard, its ``images`` and ``captions`` rows (ranges of the whole
    index's rows) added in order."""

    def __init__(
        self,
        path: str,
        images: range,
        captions: range,
        image_index: CollectionBuilder,
        caption_index: CollectionBuilder,
    ) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.image_start = images.start
        self.caption_start = captions.start
        self.images = image_index
        self.captions = caption_index
        self.writers = {
            "images": pq.ParquetWriter(os.path.join(path, "images.parquet"), IMAGE_SCHEMA),
            "captions": pq.ParquetWriter(os.path.join(path, "captions.parquet"), CAPTION_SCHEMA),
        }
        dim = image_index.spec.dim  # the images' z: the width of every mu
        self.mu = {
            kind: _npy_writer(os.path.join(path, f"{kind}_mu.npy"), (len(rows), dim))
            for kind, rows in (("image", images), ("caption", captions))
        }

    def add_images(self, rows: pa.Table, mu: torch.Tensor, vectors: torch.Tensor) -> None:
        """Image rows (``image_id``, ``path``), their z and their index vectors."""
        self.mu["image"].write(np.ascontiguousarray(mu.float().numpy()).tobytes())
        self.images.add(vectors)
        self.writers["images"].write_table(rows)

    def add_captions(self, rows: pa.Table, mu: torch.Tensor, vectors: torch.Tensor) -> None:
        """Caption rows (ids, text, kappa, uncertainty), their mu and their index vectors."""
        self.mu["caption"].write(np.ascontiguousarray(mu.float().numpy()).tobytes())
        self.captions.add(vectors)
        self.writers["captions"].write_table(rows)

    def finish(self) -> ShardRecord:
        for writer in self.writers.values():
            writer.close()
        for out in self.mu.values():
            out.close()
        return ShardRecord(
            folder=os.path.basename(self.path),
            image_start=self.image_start,
            caption_start=self.caption_start,
            images=self.images.finish(os.path.join(self.path, "images.faiss")),
            captions=self.captions.finish(os.path.join(self.path, "captions.faiss")),
        )
