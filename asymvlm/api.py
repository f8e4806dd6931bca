"""``asymvlm.evaluate``, ``score``, ``search`` and ``load_checkpoint``: the functions behind the
command line, exported at the package's top level (docs/api.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import torch

from asymvlm.checkpoints import is_model_uri, resolve_checkpoint
from asymvlm.checkpoints import load_checkpoint as load_folder
from asymvlm.errors import CheckpointError
from asymvlm.evaluation import caption_scores, registry, specs
from asymvlm.methods import Method
from asymvlm.splits import SplitTensors, load_split
from asymvlm.tables import Location, check_split
from asymvlm.training import resolve_device


def load_checkpoint(
    checkpoint: str,
    device: str | torch.device = "auto",
    *,
    allow_incomplete: bool = False,
    tracking_uri: str | None = None,
) -> tuple[Method, dict[str, Any]]:
    """(method in eval mode, metadata) of a checkpoint folder, MLflow model URI (in the store
    ``tracking_uri``, default ``$MLFLOW_TRACKING_URI``) or ``hf-hub:ORG/REPO[@REVISION]`` on
    ``device``; ``allow_incomplete``: a run in progress."""
    uri = is_model_uri(checkpoint)
    folder = resolve_checkpoint(checkpoint, tracking_uri) if uri else checkpoint
    return load_folder(folder, resolve_device(device), allow_incomplete=allow_incomplete)


def load_for_split(
    checkpoint: str,
    embeddings: str,
    split: str,
    *,
    device: str | torch.device = "auto",
    adapter_input: str | None = None,
    allow_incomplete: bool = False,
    tracking_uri: str | None = None,
) -> tuple[Method, SplitTensors]:
    """The checkpoint's method and the split it reads, both on ``device``."""
    load = {"allow_incomplete": allow_incomplete, "tracking_uri": tracking_uri}
    method, meta = load_checkpoint(checkpoint, device, **load)
    method.adapter_input = adapter_input or meta.get("adapter_input", "raw")
    dim = check_split(embeddings, split).dim  # before the split is read (and warned about)
    if dim != meta["dim"]:
        raise CheckpointError(
            f"checkpoint {checkpoint} expects dim {meta['dim']}, "
            f"but {embeddings}/{split} has dim {dim}"
        )
    return method, load_split(embeddings, split, method.adapter_input, resolve_device(device))


def evaluate(
    checkpoint: str,
    embeddings: str,
    split: str = "test",
    *,
    device: str | torch.device = "auto",
    adapter_input: str | None = None,
    allow_incomplete: bool = False,
    tracking_uri: str | None = None,
    progress: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Retrieval and uncertainty metrics (``result["t2i"]``, ``["i2t"]``) of ``checkpoint`` on
    ``embeddings``/``split``; ``options``: the retrieval evaluation's keys (docs/api.md)."""
    values = {"data": Location(embeddings, split), **options}
    parsed = specs.spec("retrieval", values, "asymvlm.evaluate")
    load = {"device": device, "adapter_input": adapter_input, "allow_incomplete": allow_incomplete}
    method, data = load_for_split(checkpoint, embeddings, split, **load, tracking_uri=tracking_uri)
    result = registry.evaluate_split(parsed, method, data, progress=progress)
    return result | {"checkpoint": checkpoint, "embeddings": embeddings, "split": split}


def score(
    checkpoint: str,
    embeddings: str,
    split: str = "test",
    *,
    device: str | torch.device = "auto",
    adapter_input: str | None = None,
    allow_incomplete: bool = False,
    tracking_uri: str | None = None,
) -> pa.Table:
    """A row per caption of ``embeddings``/``split``: ``caption_id``, ``text``, ``kappa`` and
    ``uncertainty`` (null where the method has none) under ``checkpoint``."""
    load = {"device": device, "adapter_input": adapter_input, "allow_incomplete": allow_incomplete}
    method, data = load_for_split(checkpoint, embeddings, split, **load, tracking_uri=tracking_uri)
    return caption_scores(method, data)


def search(
    index: str,
    captions: Sequence[str] = (),
    images: Sequence[Any] = (),
    *,
    k: int = 10,
    encoder: Any = None,
) -> list[Any]:
    """``asymvlm search``: each caption's images, then each image's captions (a path, bytes or a
    PIL image), from the index folder ``index``: :class:`asymvlm.indexing.SearchResult` records
    with the query's kappa, confidence, decision and results."""
    from asymvlm.indexing import Index

    opened = Index.open(index, encoder=encoder)
    found = opened.search_text(captions, k) if captions else []
    return found + (opened.search_images(images, k) if images else [])
