"""κ for every caption of one shard: :class:`ShardScorer` reads a shard in bounded batches,
applies the adapter (embedding the captions that come without an embedding) and writes the
shard's scores as one Parquet file, whole or not at all."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from asymvlm import storage
from asymvlm.checkpoints import load_checkpoint, resolve_checkpoint
from asymvlm.curation.pools import PoolShard, Rows, read_shard
from asymvlm.errors import AsymVLMError
from asymvlm.scoring.scorer import GivenEmbeddings, Scorer

logger = logging.getLogger(__name__)
SCORES_DIR = "scores"


class ShardOutcome(BaseModel):
    """What scoring one shard gave: its rows, those without a caption, or why it failed."""

    shard: str
    rows: int = 0
    null_captions: int = 0
    seconds: float = 0.0
    error: str | None = None


def scores_uri(output: str, shard: str) -> str:
    """Where the scores of ``shard`` are written."""
    return storage.uri_join(output, SCORES_DIR, f"{shard}.parquet")


def score_schema(dim: int, uid: bool, mu: bool) -> pa.Schema:
    """The columns of a shard's scores: its row, key[, uid], whether it has a caption, κ,
    uncertainty, CLIP score[, μ]."""
    fields = [pa.field("row", pa.int64()), pa.field("key", pa.string())]
    fields += [pa.field("uid", pa.string())] if uid else []
    fields += [pa.field("has_caption", pa.bool_())]
    fields += [pa.field(n, pa.float32()) for n in ("kappa", "uncertainty", "clip_score")]
    # a list, not a fixed-size list: Parquet reads a null fixed-size list back as an empty one
    fields += [pa.field("mu", pa.list_(pa.float32()))] if mu else []
    return pa.schema(fields)


def captioned(rows: Rows) -> np.ndarray:
    """Which rows have a caption (none null or blank); all, where the pool gives no text."""
    if rows.text is None:
        return np.ones(len(rows), bool)
    blank = pc.equal(pc.utf8_trim_whitespace(rows.text), "")
    return ~pc.fill_null(blank, True).to_numpy(zero_copy_only=False)


def uncaptioned(has_caption: pa.Array | pa.ChunkedArray) -> int:
    """The rows of a ``has_caption`` column without a caption."""
    return len(has_caption) - (pc.sum(has_caption).as_py() or 0)


def clip_scores(text: np.ndarray, image: np.ndarray) -> np.ndarray:
    """The CLIP score of each pair: the cosine of its text and image embeddings."""
    dots = np.einsum("nd,nd->n", text, image)
    return dots / np.maximum(np.linalg.norm(text, axis=1) * np.linalg.norm(image, axis=1), 1e-12)


def _masked(values: np.ndarray | None, keep: np.ndarray, n: int) -> pa.Array:
    """``values`` of the kept rows at their places among ``n``, null elsewhere."""
    if values is None:
        return pa.nulls(n, pa.float32())
    full = np.zeros(n, np.float32)
    full[keep] = values
    return pa.array(full, pa.float32(), mask=~keep)


class ShardScorer:
    """An adapter (with its encoder, loaded at the first caption to embed) that scores shards
    into ``output``."""

    def __init__(
        self,
        checkpoint: str,
        output: str,
        *,
        encoder: str | None = None,
        device: str = "cpu",
        write_mu: bool = False,
        rows_per_batch: int = 8192,
        features: str = "b32",
        tracking_uri: str | None = None,
    ) -> None:
        self.folder = resolve_checkpoint(checkpoint, tracking_uri)
        method, self.meta = load_checkpoint(self.folder, "cpu")
        self.dim = int(self.meta["dim"])
        self.given = Scorer(method, self.meta, GivenEmbeddings(self.dim, device))
        self.options = {"encoder": encoder, "device": device}
        self.output = output
        self.write_mu = write_mu
        self.rows_per_batch = rows_per_batch
        self.features = features
        self._captions: Scorer | None = None

    def caption_scorer(self) -> Scorer:
        """The adapter with its frozen encoder, for captions that come without an embedding."""
        if self._captions is None:
            self._captions = Scorer.from_checkpoint(self.folder, **self.options)
        return self._captions

    def score_rows(self, rows: Rows, uid: bool) -> pa.Table:
        """A batch's scores (κ, uncertainty, CLIP score null where there is no caption)."""
        keep = captioned(rows)
        n = len(rows)
        if rows.text_emb is not None:
            norm = rows.text_norm[keep] if rows.text_norm is not None else None
            scores = self.given.embedding_uncertainty(rows.text_emb[keep], norm)
        else:
            texts = [t for t, k in zip(rows.text.to_pylist(), keep, strict=True) if k]
            scores = self.caption_scorer().caption_uncertainty(texts)
        clip = None
        if rows.image_emb is not None and rows.text_emb is not None:
            clip = clip_scores(rows.text_emb[keep], rows.image_emb[keep])
        columns: dict[str, Any] = {"row": pa.array(rows.row, pa.int64()), "key": rows.key}
        if uid:
            columns["uid"] = rows.uid
        columns["has_caption"] = pa.array(keep)
        columns["kappa"] = _masked(scores.kappa, keep, n)
        columns["uncertainty"] = _masked(scores.uncertainty, keep, n)
        columns["clip_score"] = _masked(clip, keep, n)
        if self.write_mu:
            mu = np.zeros((n, self.dim), np.float32)
            mu[keep] = scores.mu
            offsets = pa.array(np.arange(0, (n + 1) * self.dim, self.dim, dtype=np.int32))
            flat = pa.array(mu.reshape(-1), pa.float32())
            columns["mu"] = pa.ListArray.from_arrays(offsets, flat, mask=pa.array(~keep))
        return pa.table(columns, schema=score_schema(self.dim, uid, self.write_mu))

    def __call__(self, shard: PoolShard) -> ShardOutcome:
        """Score ``shard`` into its file (written whole, or not at all and the reason given)."""
        started = time.perf_counter()
        outcome = ShardOutcome(shard=shard.name)
        uid = shard.format == "datacomp"
        try:
            with storage.atomic_path(scores_uri(self.output, shard.name)) as (fs, tmp):
                schema = score_schema(self.dim, uid, self.write_mu)
                with fs.open_output_stream(tmp) as out, pq.ParquetWriter(out, schema) as writer:
                    for rows in read_shard(shard, self.rows_per_batch, self.features):
                        table = self.score_rows(rows, uid)
                        writer.write_table(table)
                        outcome.rows += table.num_rows
                        outcome.null_captions += uncaptioned(table["has_caption"])
        except (AsymVLMError, pa.ArrowException, OSError, ValueError, KeyError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            return ShardOutcome(shard=shard.name, error=reason)
        outcome.seconds = round(time.perf_counter() - started, 3)
        return outcome
