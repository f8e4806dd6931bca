"""One shard of an index folder (:class:`Shard`): a contiguous range of the images and of the
captions, their FAISS indexes, what a person needs to see, and the exact re-ranking of FAISS's
candidates by the method's own score (ties: the lower row, as ``asymvlm evaluate`` ranks)."""

from __future__ import annotations

import os

import faiss
import numpy as np
import pyarrow.parquet as pq
import torch

from asymvlm.indexing import kinds
from asymvlm.indexing.forms import InnerProductForm
from asymvlm.indexing.records import Direction, Hit, ShardRecord
from asymvlm.methods import Encoding, Method

#: Candidates FAISS returns per query beyond k, re-ranked by the exact score.
MARGIN = 16


class Shard:
    """The rows of one shard folder, searched by ``method``'s score in its inner-product form."""

    def __init__(self, folder: str, record: ShardRecord, method: Method, form: InnerProductForm):
        self.record = record
        self.method = method
        self.form = form
        path = os.path.join(folder, record.folder)
        self.indexes = {}
        for name, collection in (("images", record.images), ("captions", record.captions)):
            index = faiss.read_index(os.path.join(path, f"{name}.faiss"), faiss.IO_FLAG_MMAP)
            if collection.spec.depth is not None:
                kinds.set_depth(index, collection.spec, collection.spec.depth)
            self.indexes[name] = index
        self.images = pq.read_table(os.path.join(path, "images.parquet"))
        self.captions = pq.read_table(os.path.join(path, "captions.parquet"))
        self.image_mu = np.load(os.path.join(path, "image_mu.npy"), mmap_mode="r")
        self.caption_mu = np.load(os.path.join(path, "caption_mu.npy"), mmap_mode="r")
        self.caption_kappa = self.captions.column("kappa").to_numpy(zero_copy_only=False)

    def cap_counts(self, queries: np.ndarray, cosines: np.ndarray) -> np.ndarray:
        """Per query, the images with mu^T z >= its cosine (FAISS range search)."""
        index = self.indexes["images"]
        counts = np.empty(len(queries), np.int64)
        for i, (query, cosine) in enumerate(zip(queries, cosines, strict=True)):
            limits, _, _ = index.range_search(np.ascontiguousarray(query[None]), float(cosine))
            counts[i] = limits[1]
        return counts

    def ranked(self, direction: Direction, encoding: Encoding, k: int) -> list[list[Hit]]:
        """Each query's best ``k`` rows of this shard by the method's score. FAISS gives
        candidates by the inner-product form; where that form only bounds the score (PS,
        image -> text) the search deepens until the k-th exact score beats every bound left."""
        n = len(next(iter(encoding.values())))
        if k <= 0:
            return [[] for _ in range(n)]
        if direction == "t2i":
            index, queries = self.indexes["images"], self.form.text_queries(encoding)
        else:
            index, queries = self.indexes["captions"], self.form.image_queries(encoding)
        queries = np.ascontiguousarray(queries.float().numpy())
        bounded = self.form.bound_i2t and direction == "i2t"
        first_depth = min(index.ntotal, k + MARGIN)
        all_bounds, all_rows = index.search(queries, first_depth)  # every query in one call
        out = []
        for i in range(n):
            depth, bounds, rows = first_depth, all_bounds[i], all_rows[i]
            query = {name: value[i : i + 1] for name, value in encoding.items()}
            while True:
                rows = rows[rows >= 0]
                scores = self._scores(direction, query, rows)
                order = np.lexsort((rows, -scores))[:k]
                done = len(order) == k and scores[order[-1]] > bounds[-1]
                if not bounded or done or depth >= index.ntotal:
                    break
                depth = min(index.ntotal, 4 * depth)
                found_bounds, found_rows = index.search(queries[i : i + 1], depth)
                bounds, rows = found_bounds[0], found_rows[0]
            out.append([self._hit(direction, int(rows[j]), float(scores[j])) for j in order])
        return out

    @torch.no_grad()
    def _scores(self, direction: Direction, query: Encoding, rows: np.ndarray) -> np.ndarray:
        """The method's scores of one query against item ``rows``."""
        if direction == "t2i":
            images = {"mu": torch.from_numpy(np.asarray(self.image_mu[rows]))}
            return self.method.score(query, images)[0].double().numpy()
        captions = {"mu": torch.from_numpy(np.asarray(self.caption_mu[rows]))}
        if self.form.family != "cosine":
            captions["kappa"] = torch.from_numpy(np.asarray(self.caption_kappa[rows]))
        return self.method.score(captions, query)[:, 0].double().numpy()

    def _hit(self, direction: Direction, row: int, score: float) -> Hit:
        """A result of this shard's ``row``; its row in the whole index is offset by the rows
        of the shards before."""
        if direction == "t2i":
            image = self.images.slice(row, 1).to_pylist()[0]
            return Hit(row=self.record.image_start + row, score=score, **image)
        caption = self.captions.slice(row, 1).to_pylist()[0]
        caption.pop("uncertainty")
        return Hit(row=self.record.caption_start + row, score=score, **caption)
