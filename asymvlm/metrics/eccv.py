"""ECCV Caption and CxC metrics on the COCO Karpathy 5k test split (Chun et al., ECCV 2022;
Parekh et al., 2021); which tables qualify: docs/metrics.md."""

from __future__ import annotations

import contextlib
import functools
import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

FOLD_CAPTIONS = 5000  # COCO 1K: five folds of 1000 images with their 5000 ground-truth captions


@functools.cache
def _ground_truth() -> Any:
    """The ``eccv_caption.Metrics`` object (loads the package's ground-truth JSON files)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "failed to import `ujson`": the json module is used
        from eccv_caption import Metrics

        return Metrics()


@dataclass(frozen=True)
class KarpathyTest:
    """How the rows of a table map onto the ECCV Caption ground truth."""

    image_ids: np.ndarray  # [n_image] COCO image id of each image row
    caption_ids: np.ndarray  # [n_text] COCO caption id of each caption row; -1: not in the GT
    folds: tuple[tuple[np.ndarray, np.ndarray], ...]  # COCO 1K: (image rows, caption rows)
    t2i_depth: int  # images needed per caption query (its most ECCV positives)
    i2t_depth: int  # captions needed per image query, with the rows outside the GT


def karpathy_test(image_ids: Sequence[str], caption_ids: Sequence[str]) -> KarpathyTest | None:
    """The row maps (and COCO 1K folds) of a table that qualifies, else None."""
    try:
        images = np.asarray([int(i) for i in image_ids], dtype=np.int64)
        captions = np.asarray([int(c) for c in caption_ids], dtype=np.int64)
    except (TypeError, ValueError):
        return None
    gt = _ground_truth()
    gt_captions = np.asarray(gt.coco_ids, dtype=np.int64)
    caption_row = {int(c): row for row, c in enumerate(captions.tolist())}
    if (
        len(images) != len(gt.coco_gts["i2t"])
        or set(images.tolist()) != set(gt.coco_gts["i2t"])
        or len(caption_row) != len(captions)
        or any(int(c) not in caption_row for c in gt_captions)
    ):
        return None
    image_row = {int(i): row for row, i in enumerate(images.tolist())}
    folds = []
    for start in range(0, len(gt_captions), FOLD_CAPTIONS):
        fold = gt_captions[start : start + FOLD_CAPTIONS].tolist()
        owners = dict.fromkeys(gt.coco_gts["t2i"][c][0] for c in fold)  # ordered, unique
        rows = ([image_row[i] for i in owners], [caption_row[c] for c in fold])
        folds.append(tuple(np.asarray(r, dtype=np.int64) for r in rows))
    in_gt = np.isin(captions, gt_captions)
    return KarpathyTest(
        image_ids=images,
        caption_ids=np.where(in_gt, captions, -1),
        folds=tuple(folds),
        t2i_depth=max(len(v) for v in gt.eccv_gts["t2i"].values()),
        i2t_depth=max(len(v) for v in gt.eccv_gts["i2t"].values()) + int((~in_gt).sum()),
    )


def eccv_metrics(
    t2i_top: torch.Tensor, i2t_top: torch.Tensor, test: KarpathyTest
) -> dict[str, dict[str, float]]:
    """``{"i2t": {"eccv_map_at_r", "eccv_rprecision", "eccv_r1", "cxc_r1"}, "t2i": {...}}``
    from the best images per caption (``t2i_top``) and captions per image (``i2t_top``)."""
    image_ids, caption_ids = test.image_ids, test.caption_ids
    t2i_ids = image_ids[t2i_top.cpu().numpy()]
    i2t_ids = caption_ids[i2t_top.cpu().numpy()]
    retrieved = {
        "t2i": {int(c): t2i_ids[row].tolist() for row, c in enumerate(caption_ids) if c >= 0},
        "i2t": {
            int(i): [c for c in i2t_ids[row].tolist() if c >= 0] for row, i in enumerate(image_ids)
        },
    }
    gt = _ground_truth()
    with contextlib.redirect_stderr(io.StringIO()):  # the package's unconditional tqdm bars
        eccv = gt.eccv_metrics(retrieved, "all")
        cxc = gt.cxc_recalls(retrieved, "all", K=1)
    keys = ("eccv_map_at_r", "eccv_rprecision", "eccv_r1")
    return {
        d: {k: float(eccv[k][d]) for k in keys} | {"cxc_r1": float(cxc[d])} for d in ("i2t", "t2i")
    }
