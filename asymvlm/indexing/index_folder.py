"""An index folder opened for search (:class:`Index`): a query is encoded by the adapter, FAISS
finds candidates by the inner-product form of the method's score, the method's own score
re-ranks them (ties: the lower row, as ``asymvlm evaluate`` ranks), and the query's kappa
decides whether to answer, widen or abstain (docs/search.md)."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import faiss
import numpy as np
import pyarrow.parquet as pq
import torch

from asymvlm.checkpoints import load_checkpoint
from asymvlm.errors import ConfigError
from asymvlm.indexing import kinds
from asymvlm.indexing.decision import TOO_VAGUE
from asymvlm.indexing.forms import cap_cosine, inner_product_form
from asymvlm.indexing.records import FORMAT, Direction, Hit, IndexManifest, SearchResult
from asymvlm.indexing.validation import widened_k
from asymvlm.methods import Encoding
from asymvlm.storage import fsspec_filesystem, is_remote, read_text

logger = logging.getLogger(__name__)

#: Candidates FAISS returns per query beyond k, re-ranked by the exact score.
MARGIN = 16


class IndexError_(ConfigError):
    """An index folder that cannot be opened (missing, another format, damaged)."""


class Index:
    """An index folder (:func:`asymvlm.indexing.build.build_index`) opened for search."""

    def __init__(self, folder: str, manifest: IndexManifest, encoder: Any = None) -> None:
        self.folder, self.manifest = folder, manifest
        self.method, self.meta = load_checkpoint(os.path.join(folder, "adapter"), "cpu")
        self.method.adapter_input = self.meta.get("adapter_input", "raw")
        self.form = inner_product_form(self.method)
        self.indexes = {}
        for name, record in (("images", manifest.images), ("captions", manifest.captions)):
            index = faiss.read_index(os.path.join(folder, f"{name}.faiss"), faiss.IO_FLAG_MMAP)
            if record.spec.depth is not None:
                kinds.set_depth(index, record.spec, record.spec.depth)
            self.indexes[name] = index
        self.images = pq.read_table(os.path.join(folder, "images.parquet"))
        self.captions = pq.read_table(os.path.join(folder, "captions.parquet"))
        self.image_mu = np.load(os.path.join(folder, "image_mu.npy"), mmap_mode="r")
        self.caption_mu = np.load(os.path.join(folder, "caption_mu.npy"), mmap_mode="r")
        self.caption_kappa = self.captions.column("kappa").to_numpy(zero_copy_only=False)
        self._encoder = encoder
        self._scorer = None

    @classmethod
    def open(cls, location: str, *, encoder: Any = None) -> Index:
        """Open an index folder, local or an object-store URI (copied to a temporary folder)."""
        try:
            manifest = IndexManifest.model_validate_json(
                read_text(_join(location, "manifest.json"))
            )
        except FileNotFoundError:
            raise IndexError_(f"{location}: not an index folder (no manifest.json)") from None
        except ValueError as exc:
            raise IndexError_(f"{location}/manifest.json: {exc}") from None
        if manifest.format != FORMAT:
            raise IndexError_(
                f"{location}: index format {manifest.format}; this asymvlm reads {FORMAT}"
            )
        folder = location
        if is_remote(location):
            fs, path = fsspec_filesystem(location)
            folder = tempfile.mkdtemp(prefix="asymvlm-index-")
            fs.get(path.rstrip("/") + "/", folder, recursive=True)
        return cls(folder, manifest, encoder)

    # -- queries -------------------------------------------------------------------------

    def scorer(self) -> Any:
        """The adapter with its text encoder, loaded on the first text query."""
        if self._scorer is None:
            from asymvlm.scoring import Scorer
            from asymvlm.scoring.scorer import TableEncoder

            encoder = self._encoder
            if encoder is None and self.manifest.encoder is None:  # synthetic tables
                encoder = TableEncoder(self.manifest.tables, (self.manifest.split,))
            self._scorer = Scorer.from_checkpoint(
                os.path.join(self.folder, "adapter"),
                encoder=encoder or self.manifest.encoder,
                device="cpu",
            )
        return self._scorer

    def search_text(self, texts: str | Sequence[str], k: int = 10) -> list[SearchResult]:
        """Text -> image: the images each caption describes, with its kappa and decision."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        scorer = self.scorer()
        _, rows = self.method.split_inputs(scorer._split(scorer._check_captions(texts)))
        with torch.no_grad():
            encoding = self.method.encode_texts(rows)
        return self.search_encoded_texts(encoding, texts, k)

    def search_encoded_texts(
        self, encoding: Encoding, queries: Sequence[str], k: int = 10
    ) -> list[SearchResult]:
        """Text -> image for captions already encoded by the adapter."""
        policy = self.manifest.policies.get("t2i")
        kappa = encoding.get("kappa")
        wide = np.full(len(queries), k)
        if kappa is not None and policy is not None and policy.widen:
            threshold = cap_cosine(self.form.family, kappa, self.method.dim).float().numpy()
            wide = widened_k(
                self._cap_counts(self.form.text_queries(encoding), threshold),
                k,
                self.manifest.widen_max,
            )
        decisions = [
            "answer" if kappa is None or policy is None else policy.decide(float(kp))
            for kp in (kappa if kappa is not None else [None] * len(queries))
        ]
        depth = [
            w if d == "widen" else (0 if d == "abstain" else k)
            for d, w in zip(decisions, wide, strict=True)
        ]
        hits = self.ranked("t2i", encoding, int(max(depth, default=0)))
        return [
            self._result("t2i", q, i, encoding, decisions[i], k, hits[i][: depth[i]], policy)
            for i, q in enumerate(queries)
        ]

    def search_images(self, images: Sequence[Any], k: int = 10) -> list[SearchResult]:
        """Image -> text: the captions that describe each image (a PIL image, path or bytes)."""
        scorer = self.scorer()
        unit = scorer._embed_images(list(images))
        rows = self.method.image_rows(unit["unit"], unit["norm"])
        with torch.no_grad():
            encoding = self.method.encode_images(rows)
        return self.search_encoded_images(encoding, [f"image {i}" for i in range(len(images))], k)

    def search_encoded_images(
        self, encoding: Encoding, queries: Sequence[str], k: int = 10
    ) -> list[SearchResult]:
        """Image -> text for images already encoded by the adapter."""
        policy = self.manifest.policies.get("i2t")
        hits = self.ranked("i2t", encoding, k)
        out = []
        for i, query in enumerate(queries):
            first = hits[i][0].kappa if hits[i] else None
            decision = "answer" if policy is None or first is None else policy.decide(first)
            shown = hits[i] if decision != "abstain" else []
            out.append(
                self._result(
                    "i2t",
                    query,
                    i,
                    {"kappa": torch.tensor([first])} if first else {},
                    decision,
                    k,
                    shown,
                    policy,
                    index=0,
                )
            )
        return out

    # -- ranking ------------------------------------------------------------------------

    def _cap_counts(self, queries: torch.Tensor, threshold: np.ndarray) -> np.ndarray:
        """Images with mu^T z >= each query's cap cosine (FAISS range search)."""
        index = self.indexes["images"]
        counts = np.empty(len(queries), np.int64)
        for i, (q, t) in enumerate(zip(queries.float().numpy(), threshold, strict=True)):
            lims, _, _ = index.range_search(np.ascontiguousarray(q[None]), float(t))
            counts[i] = lims[1]
        return counts

    def ranked(self, direction: Direction, encoding: Encoding, k: int) -> list[list[Hit]]:
        """Each query's best ``k`` by the method's score, from FAISS's candidates."""
        if k <= 0:
            return [[] for _ in range(len(next(iter(encoding.values()))))]
        if direction == "t2i":
            index, queries = self.indexes["images"], self.form.text_queries(encoding)
        else:
            index, queries = self.indexes["captions"], self.form.image_queries(encoding)
        queries = np.ascontiguousarray(queries.float().numpy())
        out = []
        for i in range(len(queries)):
            depth = int(min(index.ntotal, k + MARGIN))
            while True:
                bounds, rows = index.search(queries[i : i + 1], depth)
                rows = rows[0][rows[0] >= 0]
                scores = self._exact(direction, encoding, i, rows)
                order = np.lexsort((rows, -scores))[:k]
                # a score bound (PS) may leave a better row unseen: search deeper until the
                # k-th exact score beats every bound not searched
                if not self.form.bound_i2t or direction == "t2i" or depth >= index.ntotal:
                    break
                if len(order) == k and scores[order[-1]] > bounds[0][-1]:
                    break
                depth = int(min(index.ntotal, 4 * depth))
            out.append(
                [
                    self._hit(direction, r + 1, int(rows[j]), float(scores[j]))
                    for r, j in enumerate(order)
                ]
            )
        return out

    def _exact(
        self, direction: Direction, encoding: Encoding, i: int, rows: np.ndarray
    ) -> np.ndarray:
        """The method's scores of query ``i`` against item ``rows``."""
        with torch.no_grad():
            if direction == "t2i":
                query = {name: value[i : i + 1] for name, value in encoding.items()}
                items = {"mu": torch.from_numpy(np.asarray(self.image_mu[rows]))}
                return self.method.score(query, items)[0].double().numpy()
            query = {name: value[i : i + 1] for name, value in encoding.items()}
            items = {"mu": torch.from_numpy(np.asarray(self.caption_mu[rows]))}
            if not np.isnan(self.caption_kappa[rows]).all():
                items["kappa"] = torch.from_numpy(np.asarray(self.caption_kappa[rows], np.float32))
            return self.method.score(items, query)[:, 0].double().numpy()

    def _hit(self, direction: Direction, rank: int, row: int, score: float) -> Hit:
        if direction == "t2i":
            image = self.images.slice(row, 1).to_pylist()[0]
            return Hit(
                rank=rank, row=row, score=score, image_id=image["image_id"], path=image["path"]
            )
        caption = self.captions.slice(row, 1).to_pylist()[0]
        return Hit(
            rank=rank,
            row=row,
            score=score,
            image_id=caption["image_id"],
            caption_id=caption["caption_id"],
            text=caption["text"],
            kappa=caption["kappa"],
        )

    def _result(
        self, direction, query, i, encoding, decision, k, hits, policy, index=None
    ) -> SearchResult:
        kappa = encoding.get("kappa")
        value = None if kappa is None else float(kappa[i if index is None else index])
        confidence = None if policy is None or value is None else float(policy.confidence(value))
        return SearchResult(
            direction=direction,
            query=query,
            kappa=value,
            uncertainty=None if value is None else 1.0 / value,
            confidence=confidence,
            decision=decision,
            k=k,
            results=hits,
            message=TOO_VAGUE if decision == "abstain" else None,
        )


def _join(location: str, name: str) -> str:
    return location.rstrip("/") + "/" + name
