"""The Python API of ``asymvlm evaluate`` and ``asymvlm score`` (``asymvlm.train`` is
:func:`asymvlm.protocol.run.train`): the functions the command line calls, exported at the
package's top level (``docs/api.md``)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import torch

from asymvlm.checkpoints import is_model_uri, resolve_checkpoint
from asymvlm.checkpoints import load_checkpoint as load_folder
from asymvlm.errors import CheckpointError
from asymvlm.evaluation import caption_scores, registry
from asymvlm.methods import Method
from asymvlm.splits import SplitTensors, load_split
from asymvlm.tables import Location
from asymvlm.training import resolve_device


def load_checkpoint(
    checkpoint: str, device: str | torch.device = "auto", *, allow_incomplete: bool = False
) -> tuple[Method, dict[str, Any]]:
    """(method in eval mode, its checkpoint's metadata) of ``checkpoint``: a folder, an MLflow
    model URI (``runs:/..``, ``models:/..``) or ``hf-hub:ORG/REPO[@REVISION]``, on ``device``
    ("auto": a GPU when there is one). ``allow_incomplete``: accept a run in progress."""
    folder = resolve_checkpoint(checkpoint) if is_model_uri(checkpoint) else checkpoint
    method, meta = load_folder(folder, resolve_device(device), allow_incomplete=allow_incomplete)
    method.eval()
    return method, meta


def load_for_split(
    checkpoint: str,
    embeddings: str,
    split: str,
    *,
    device: str | torch.device = "auto",
    adapter_input: str | None = None,
    allow_incomplete: bool = False,
) -> tuple[Method, SplitTensors]:
    """The checkpoint's method and the split it reads (``adapter_input``: "raw" or "unit"
    instead of what the checkpoint says), both on ``device``."""
    method, meta = load_checkpoint(checkpoint, device, allow_incomplete=allow_incomplete)
    method.adapter_input = adapter_input or meta.get("adapter_input", "raw")
    data = load_split(embeddings, split, method.adapter_input, resolve_device(device))
    if data.dim != meta["dim"]:
        raise CheckpointError(
            f"checkpoint {checkpoint} expects dim {meta['dim']}, "
            f"but {embeddings}/{split} has dim {data.dim}"
        )
    return method, data


def evaluate(
    checkpoint: str,
    embeddings: str,
    split: str = "test",
    *,
    device: str | torch.device = "auto",
    adapter_input: str | None = None,
    allow_incomplete: bool = False,
    progress: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Retrieval and uncertainty metrics of ``checkpoint`` (see :func:`load_checkpoint`) on
    split ``split`` of the tables ``embeddings``: ``result["t2i"]`` and ``["i2t"]`` hold
    Recall@{1,5,10}, Spearman S, R², AUROC... ``options``: the retrieval evaluation's keys
    (``levels``: uncertainty bins, ``fold_size``, ``chunk_size``, ``memory_budget``)."""
    values = {"data": Location(embeddings, split), **options}
    parsed = registry.spec("retrieval", values, "asymvlm.evaluate")
    method, data = load_for_split(
        checkpoint,
        embeddings,
        split,
        device=device,
        adapter_input=adapter_input,
        allow_incomplete=allow_incomplete,
    )
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
) -> pa.Table:
    """A row per caption of split ``split`` of ``embeddings``: ``caption_id``, ``kappa`` and
    ``uncertainty`` (null where the method defines none) under ``checkpoint``. For raw
    captions and images use :class:`asymvlm.Scorer`."""
    method, data = load_for_split(
        checkpoint,
        embeddings,
        split,
        device=device,
        adapter_input=adapter_input,
        allow_incomplete=allow_incomplete,
    )
    return caption_scores(method, data)
