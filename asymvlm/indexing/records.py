"""What an index records and what a search answers: typed records, validated where they are
read (the manifest) and JSON-ready where they leave (a query's :class:`SearchResult`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from asymvlm.indexing.decision import DecisionPolicy
from asymvlm.indexing.kinds import IndexSpec

#: The index folder's format; an index of another format is refused, naming both.
FORMAT = 1
Direction = Literal["t2i", "i2t"]
Decision = Literal["answer", "widen", "abstain"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CollectionRecord(_Record):
    """One searched collection (the images for text -> image, the captions for image -> text)."""

    spec: IndexSpec
    rows: int
    seconds: float  # to build
    recall_at_10: float  # of the approximate index against exact search, on a sample of queries
    sample_queries: int


class ShardRecord(_Record):
    """One shard: a folder holding a contiguous range of the images and of the captions."""

    folder: str  # relative to the index folder
    image_start: int
    caption_start: int
    images: CollectionRecord
    captions: CollectionRecord


class IndexManifest(_Record):
    """``manifest.json`` of an index folder: the tables, encoder and adapter it serves."""

    format: int = FORMAT
    tables: str  # the tables' root as given to the build
    split: str
    fingerprint: str  # asymvlm.tables.fingerprint of the split
    encoder: str | None  # the model the tables were embedded with (None: synthetic tables)
    method: str
    adapter: str  # the checkpoint as given to the build (a copy is in adapter/)
    dim: int
    images: int  # rows, over all shards
    captions: int
    shards: list[ShardRecord]
    #: Text -> image and image -> text decisions, fitted on a validation split (None: none).
    policies: dict[Direction, DecisionPolicy] = {}
    widen_max: int = 100  # results of a widened answer at most
    random_encoder: bool = False  # the encoder is a random test model: results mean nothing


class Hit(_Record):
    """One result: its row in the collection, the model's score and what a person needs."""

    row: int
    score: float  # the method's retrieval score (the log-likelihood for AsymVLM)
    image_id: str
    caption_id: str | None = None
    text: str | None = None  # image -> text: the caption
    kappa: float | None = None  # image -> text: the caption's kappa
    path: str | None = None  # the image's file or URL where the tables' source names one


class SearchResult(_Record):
    """One query's answer: its kappa and uncertainty (text queries), the calibrated probability
    that the first result is right, the decision and the results (none when abstaining)."""

    direction: Direction
    query: str
    kappa: float | None
    uncertainty: float | None
    confidence: float | None
    decision: Decision
    k: int  # results asked for; widened queries get more
    results: list[Hit]  # best first
    message: str | None = None
