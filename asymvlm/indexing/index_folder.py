"""An index folder opened for search (:class:`Index`): a query is encoded by the adapter, its
kappa decides whether to answer, widen or abstain, every shard ranks its rows by the method's
own score (:class:`~asymvlm.indexing.shard.Shard`) and the shards' best are merged
(docs/search.md). Ray Serve runs the same steps with a shard per replica."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from asymvlm.checkpoints import load_checkpoint
from asymvlm.errors import ConfigError
from asymvlm.indexing.decision import TOO_VAGUE, DecisionPolicy
from asymvlm.indexing.forms import cap_cosine, inner_product_form
from asymvlm.indexing.records import FORMAT, Direction, Hit, IndexManifest, SearchResult
from asymvlm.indexing.shard import Shard
from asymvlm.indexing.validation import widened_k
from asymvlm.methods import Encoding
from asymvlm.storage import download_dir, is_remote, read_text, uri_join


class IndexFolderError(ConfigError):
    """An index folder that cannot be opened: not one, or of another format."""


class Ranker(Protocol):
    """What the merge needs of a shard: a local :class:`Shard` or a Serve replica's handle."""

    def ranked(self, direction: Direction, encoding: Encoding, k: int) -> list[list[Hit]]: ...

    def cap_counts(self, queries: np.ndarray, cosines: np.ndarray) -> np.ndarray: ...


def read_manifest(location: str) -> IndexManifest:
    """The :class:`IndexManifest` of an index folder, local or an object-store URI."""
    try:
        text = read_text(uri_join(location, "manifest.json"))
    except FileNotFoundError:
        raise IndexFolderError(f"{location}: not an index folder (no manifest.json)") from None
    try:
        manifest = IndexManifest.model_validate_json(text)
    except ValueError as exc:
        first = str(exc).splitlines()[1:2] or [str(exc)]
        raise IndexFolderError(f"{location}/manifest.json: {first[0]}") from None
    if manifest.format != FORMAT:
        raise IndexFolderError(
            f"{location}: an index of format {manifest.format}; this asymvlm reads {FORMAT}"
        )
    return manifest


def local_folder(location: str) -> str:
    """``location`` itself when local; an object-store folder copied to a temporary folder."""
    if not is_remote(location):
        return location
    return download_dir(location, tempfile.mkdtemp(prefix="asymvlm-index-"))


def merge(per_shard: list[list[list[Hit]]], k: int) -> list[list[Hit]]:
    """Each query's best ``k`` over the shards: by score, ties by row (one index's order)."""
    merged = []
    for hits in zip(*per_shard, strict=True):
        every = [hit for shard in hits for hit in shard]
        merged.append(sorted(every, key=lambda hit: (-hit.score, hit.row))[:k])
    return merged


class Index:
    """An index folder (``asymvlm index``, :func:`asymvlm.build_index`) opened for search."""

    def __init__(self, folder: str, manifest: IndexManifest, *, encoder: Any = None) -> None:
        self.folder = folder
        self.manifest = manifest
        self.method, self.meta = load_checkpoint(os.path.join(folder, "adapter"), "cpu")
        self.method.adapter_input = self.meta.get("adapter_input", "raw")
        self.form = inner_product_form(self.method)
        self.encoder = encoder
        self._scorer = None
        self._paths: pa.ChunkedArray | None = None
        self.shards: list[Ranker] = []

    @classmethod
    def open(cls, location: str, *, encoder: Any = None) -> Index:
        """Open an index folder with every shard in this process."""
        manifest = read_manifest(location)
        index = cls(local_folder(location), manifest, encoder=encoder)
        index.shards = [Shard(index.folder, s, index.method, index.form) for s in manifest.shards]
        return index

    # -- encoding the queries ----------------------------------------------------------------

    def scorer(self) -> Any:
        """The adapter with its frozen encoder (the tables themselves for synthetic tables)."""
        if self._scorer is None:
            from asymvlm.scoring import Scorer
            from asymvlm.scoring.scorer import TableEncoder

            encoder = self.encoder or self.manifest.encoder
            if encoder is None:
                encoder = TableEncoder(self.manifest.tables, (self.manifest.split,))
            adapter = os.path.join(self.folder, "adapter")
            self._scorer = Scorer.from_checkpoint(adapter, encoder=encoder, device="cpu")
        return self._scorer

    @torch.no_grad()
    def encode_texts(self, texts: Sequence[str]) -> Encoding:
        """The adapter's encoding of captions embedded by the frozen encoder."""
        split = self.scorer().caption_split(list(texts))
        return self.method.encode_texts(self.method.split_inputs(split)[1])

    @torch.no_grad()
    def encode_images(self, images: Sequence[Any]) -> Encoding:
        """The adapter's encoding of images (PIL images, paths or bytes)."""
        embedded = self.scorer().embed_images(list(images))
        return self.method.encode_images(self.method.image_rows(embedded["unit"], embedded["norm"]))

    # -- searching -------------------------------------------------------------------------

    def search_text(self, texts: str | Sequence[str], k: int = 10) -> list[SearchResult]:
        """Text -> image: the images each caption describes, with its kappa and decision."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        return self.search_encoded_texts(self.encode_texts(texts), texts, k)

    def search_images(self, images: Sequence[Any], k: int = 10) -> list[SearchResult]:
        """Image -> text: the captions of each image (a PIL image, a path or bytes)."""
        names = [img if isinstance(img, str) else f"image {i}" for i, img in enumerate(images)]
        return self.search_encoded_images(self.encode_images(images), names, k)

    def ranked(self, direction: Direction, encoding: Encoding, k: int) -> list[list[Hit]]:
        """Each query's best ``k`` over every shard (side by side), by the method's score."""
        if len(self.shards) == 1:
            return self.shards[0].ranked(direction, encoding, k)
        with ThreadPoolExecutor(len(self.shards)) as pool:
            asked = [pool.submit(shard.ranked, direction, encoding, k) for shard in self.shards]
            return merge([answer.result() for answer in asked], k)

    def image_path(self, row: int) -> str | None:
        """The file or URL of the image in ``row`` (None: not known)."""
        if self._paths is None:
            tables = [
                pq.read_table(
                    os.path.join(self.folder, s.folder, "images.parquet"), columns=["path"]
                )
                for s in self.manifest.shards
            ]
            self._paths = pa.concat_tables(tables).column("path")
        return self._paths[row].as_py() if 0 <= row < len(self._paths) else None

    def widened(self, encoding: Encoding, k: int) -> np.ndarray:
        """Results of a widened answer per caption: the images in the caption's cap, counted
        over every shard (:func:`~asymvlm.indexing.forms.cap_cosine`), within [k, widen_max]."""
        queries = self.form.text_queries(encoding).float().numpy()
        cosines = cap_cosine(self.form.family, encoding["kappa"], self.method.dim).numpy()
        counts = sum(shard.cap_counts(queries, cosines) for shard in self.shards)
        return widened_k(counts, k, self.manifest.widen_max)

    def search_encoded_texts(
        self, encoding: Encoding, queries: Sequence[str], k: int = 10
    ) -> list[SearchResult]:
        """Text -> image for captions the adapter has encoded."""
        policy = self.manifest.policies.get("t2i")
        kappa = encoding.get("kappa")
        if kappa is None or policy is None:
            decisions, depth = ["answer"] * len(queries), np.full(len(queries), k)
        else:
            decisions = [policy.decide(float(value)) for value in kappa]
            wide = self.widened(encoding, k) if "widen" in decisions else np.full(len(queries), k)
            shown = {"answer": k, "abstain": 0}
            depth = np.array([shown.get(d, w) for d, w in zip(decisions, wide, strict=True)])
        found = self.ranked("t2i", encoding, int(depth.max(initial=0)))
        return [
            _result("t2i", query, kappa, i, policy, decisions[i], k, found[i][: depth[i]])
            for i, query in enumerate(queries)
        ]

    def search_encoded_images(
        self, encoding: Encoding, queries: Sequence[str], k: int = 10
    ) -> list[SearchResult]:
        """Image -> text for images the adapter has encoded; the decision reads the kappa of
        the first caption found."""
        policy = self.manifest.policies.get("i2t")
        out = []
        for i, hits in enumerate(self.ranked("i2t", encoding, k)):
            first = torch.tensor([hits[0].kappa]) if hits and hits[0].kappa is not None else None
            decision = "answer" if first is None or policy is None else policy.decide(hits[0].kappa)
            shown = [] if decision == "abstain" else hits
            out.append(_result("i2t", queries[i], first, 0, policy, decision, k, shown))
        return out


def _result(
    direction: Direction,
    query: str,
    kappa: torch.Tensor | None,
    row: int,
    policy: DecisionPolicy | None,
    decision: str,
    k: int,
    hits: list[Hit],
) -> SearchResult:
    """One query's :class:`SearchResult` (kappa: the query's, or its first caption's)."""
    value = None if kappa is None else float(kappa[row])
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
