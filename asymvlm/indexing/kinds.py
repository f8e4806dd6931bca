"""Which FAISS index serves a collection (docs/search.md, "Index kinds"): exact search for small
collections, HNSW or IVF for large ones, chosen from the size and a memory budget, with the
search depth tuned at build time until the approximate top 10 meets a recall target."""

from __future__ import annotations

import math
from typing import Literal

import faiss
import numpy as np
from pydantic import BaseModel, ConfigDict

from asymvlm.errors import ConfigError

Kind = Literal["flat", "hnsw", "ivf", "ivfpq"]
#: Collections up to this many vectors are searched exactly by default.
EXACT_MAX = 100_000
#: HNSW up to this many vectors by default (its build time grows fastest); IVF beyond.
HNSW_MAX = 250_000
HNSW_NEIGHBOURS = 32
#: k-means iterations of IVF's lists (FAISS's default is 25; the search depth makes up for it).
KMEANS_ITERATIONS = 10
#: The approximate kinds' search depth grows until recall@10 against exact search reaches this.
RECALL_TARGET = 0.95


class IndexSpec(BaseModel):
    """One FAISS index's kind and parameters (recorded in the index's manifest)."""

    model_config = ConfigDict(extra="forbid")

    kind: Kind
    dim: int
    lists: int | None = None  # IVF: inverted lists
    depth: int | None = None  # search depth: IVF's nprobe, HNSW's efSearch
    pq_bytes: int | None = None  # IVF-PQ: bytes per vector

    def bytes_per_vector(self) -> float:
        """Memory of one stored vector (ids and links included)."""
        return bytes_per_vector(self.kind, self.dim, self.pq_bytes)

    def create(self) -> faiss.Index:
        """An empty index of this spec (inner-product metric)."""
        ip = faiss.METRIC_INNER_PRODUCT
        if self.kind == "flat":
            return faiss.IndexFlatIP(self.dim)
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, HNSW_NEIGHBOURS, ip)
            index.hnsw.efConstruction = 80
            return index
        quantizer = faiss.IndexFlatIP(self.dim)
        if self.kind == "ivf":
            index = faiss.IndexIVFFlat(quantizer, self.dim, self.lists, ip)
        else:
            index = faiss.IndexIVFPQ(quantizer, self.dim, self.lists, self.pq_bytes, 8, ip)
        index.cp.niter = KMEANS_ITERATIONS
        return index

    def training_rows(self) -> int:
        """Rows the kind trains on before any is added (0: no training): 40 per list, k-means'
        sample (FAISS warns below 39)."""
        return 0 if self.lists is None else 40 * self.lists


def bytes_per_vector(kind: Kind, dim: int, pq_bytes: int | None = None) -> float:
    """Stored bytes per vector: float32 rows, HNSW's links, IVF's int64 ids, PQ codes."""
    return {
        "flat": 4 * dim,
        "hnsw": 4 * dim + 2 * HNSW_NEIGHBOURS * 4 * 1.05,
        "ivf": 4 * dim + 8,
        "ivfpq": (pq_bytes or 0) + 8,
    }[kind]


def _pq_bytes(dim: int, budget_per_vector: float) -> int | None:
    """The largest PQ code (bytes, a divisor of ``dim``) that fits the budget per vector."""
    fits = [m for m in range(1, dim + 1) if dim % m == 0 and m + 8 <= budget_per_vector]
    return max(fits) if fits else None


def choose_spec(
    n: int, dim: int, *, kind: Kind | Literal["auto"] = "auto", memory_bytes: float | None = None
) -> IndexSpec:
    """The :class:`IndexSpec` for ``n`` vectors of ``dim``: ``kind``, or with ``"auto"`` exact
    up to :data:`EXACT_MAX`, HNSW up to :data:`HNSW_MAX`, then IVF, IVF-PQ where ``memory_bytes``
    holds no full vectors; a ConfigError when nothing fits."""
    lists = max(1, min(65536, 2 ** round(math.log2(4 * math.sqrt(max(n, 1))))))  # 4,096 for 1M
    budget = math.inf if memory_bytes is None else memory_bytes / max(n, 1)
    if kind == "auto":
        if n <= EXACT_MAX and bytes_per_vector("flat", dim) <= budget:
            kind = "flat"
        elif n <= HNSW_MAX and bytes_per_vector("hnsw", dim) <= budget:
            kind = "hnsw"
        elif bytes_per_vector("ivf", dim) <= budget:
            kind = "ivf"
        else:
            kind = "ivfpq"
    pq = _pq_bytes(dim, budget) if kind == "ivfpq" else None
    if kind == "ivfpq" and pq is None:
        raise ConfigError(
            f"a memory budget of {memory_bytes / 2**20:.1f} MiB holds no index of {n:,} vectors "
            f"(the smallest, IVF-PQ with 1-byte codes, takes {9 * n / 2**20:.1f} MiB)"
        )
    spec = IndexSpec(kind=kind, dim=dim, pq_bytes=pq, lists=lists if "ivf" in kind else None)
    if memory_bytes is not None and spec.bytes_per_vector() * n > memory_bytes:
        raise ConfigError(
            f"a {kind} index of {n:,} vectors takes {spec.bytes_per_vector() * n / 2**20:.1f} MiB,"
            f" over the memory budget of {memory_bytes / 2**20:.1f} MiB"
        )
    return spec


def set_depth(index: faiss.Index, spec: IndexSpec, depth: int) -> None:
    """Set the search depth of an approximate index (nprobe / efSearch)."""
    if spec.kind == "hnsw":
        index.hnsw.efSearch = depth
    elif spec.kind != "flat":
        faiss.extract_index_ivf(index).nprobe = depth


def recall_at(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean share of each query's exact top k found in its approximate top k."""
    hits = [len(np.intersect1d(f[f >= 0], e)) for f, e in zip(found, exact, strict=True)]
    return float(np.sum(hits) / exact.size)


def tune_depth(
    index: faiss.Index, spec: IndexSpec, queries: np.ndarray, exact: np.ndarray
) -> tuple[int | None, float]:
    """The smallest search depth (doubling) whose recall@k against ``exact`` ([q, k] ids)
    reaches :data:`RECALL_TARGET`, and that recall; (None, 1.0) for exact search."""
    if spec.kind == "flat":
        return None, 1.0
    most = spec.lists if spec.lists is not None else 4096
    depth = 16
    while True:
        set_depth(index, spec, depth)
        recall = recall_at(index.search(queries, exact.shape[1])[1], exact)
        if recall >= RECALL_TARGET or depth >= most:
            return depth, recall
        depth = min(2 * depth, most)
