"""Cross-modal retrieval with uncertainty (paper Sec. 5.1, Table 1, Fig. 3); a non-finite
encoding, uncertainty or score raises :class:`~asymvlm.errors.NonFiniteError` naming the row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from asymvlm.errors import ConfigError, NonFiniteError
from asymvlm.methods import Encoding, Method
from asymvlm.metrics import average_folds, rank_pass, ranking_metrics
from asymvlm.metrics import eccv as eccv_caption
from asymvlm.splits import SplitTensors


def _row(data: SplitTensors, kind: str, row: int) -> str:
    """``caption 'c17' (row 17)``, or ``caption row 17`` when the split has no ids."""
    ids = getattr(data.split, "caption_ids" if kind == "caption" else "image_ids", None)
    return f"{kind} {ids[row]!r} (row {row})" if ids is not None else f"{kind} row {row}"


def _first_bad_row(value: torch.Tensor) -> int:
    return int((~torch.isfinite(value.reshape(value.shape[0], -1)).all(dim=1)).nonzero()[0, 0])


def check_finite(
    method: Method, name: str, value: torch.Tensor | None, kind: str, data: SplitTensors
) -> None:
    """:class:`NonFiniteError` when ``value`` (a row per caption/image) has a NaN/inf."""
    if not torch.is_tensor(value) or not value.is_floating_point() or value.isfinite().all():
        return
    where = f"a {kind} scalar" if value.ndim == 0 else _row(data, kind, _first_bad_row(value))
    raise NonFiniteError(f"{method.name}: non-finite {name} for {where}")


@torch.no_grad()
def encode_split(
    method: Method, data: SplitTensors, chunk_size: int = 8192
) -> tuple[Encoding, Encoding]:
    """(text encoding, image encoding) of a whole split in chunks, checked finite."""
    method.eval()
    image_rows, text_rows = method.split_inputs(data)
    out = []
    for kind, fn, x in (
        ("caption", method.encode_texts, text_rows),
        ("image", method.encode_images, image_rows),
    ):
        parts = [fn(x[i : i + chunk_size]) for i in range(0, x.shape[0], chunk_size)]
        encoding = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        for name, value in encoding.items():
            check_finite(method, name, value, kind, data)
        out.append(encoding)
    return out[0], out[1]


def coco_karpathy_test(data: SplitTensors) -> eccv_caption.KarpathyTest | None:
    """The ECCV Caption row maps when the manifest says ``data`` is the COCO Karpathy 5k test
    split and its ids are that split's."""
    split = data.split
    described = getattr(getattr(split, "manifest", None), "extra", {}).get("splits")
    if not isinstance(described, dict) or not any(
        isinstance(d, dict) and d.get("dataset") == "coco-karpathy" and d.get("split") == "test"
        for d in described.values()
    ):
        return None
    return eccv_caption.karpathy_test(split.image_ids, split.caption_ids)


@torch.no_grad()
def evaluate_retrieval(
    method: Method,
    data: SplitTensors,
    n_bins: int = 10,
    chunk_size: int | None = None,
    progress: bool = False,
    fold_size: int | None = None,
    eccv: bool = True,
    memory_budget: int | None = None,
) -> dict[str, Any]:
    """The retrieval metrics of docs/metrics.md (App. B) per direction and RSUM; with
    ``fold_size`` also their mean over folds of that many consecutive images (``coco_1k``: COCO
    1K's folds), with ``eccv`` ECCV Caption / CxC on the COCO Karpathy test split."""
    n_text, n_image = data.text_emb.shape[0], data.image_emb.shape[0]
    if n_text == 0 or n_image == 0:
        raise ValueError(
            f"{method.name}: cannot evaluate retrieval on a split with {n_image} images and "
            f"{n_text} captions"
        )
    if n_bins > min(n_text, n_image):  # each bin needs at least one caption and one image
        raise ConfigError(
            f"{n_bins} uncertainty bins: the split has {n_text} captions and {n_image} images; "
            "give at most as many bins (--levels) as either"
        )
    if fold_size is not None and n_image % fold_size:
        raise ConfigError(
            f"fold size {fold_size}: the split has {n_image} images, not a multiple of it"
        )
    karpathy = coco_karpathy_test(data) if eccv or fold_size == 1000 else None
    texts, images = encode_split(method, data)
    text_unc = method.text_uncertainty_from(texts)
    image_unc = method.image_uncertainty_from(images)
    check_finite(method, "uncertainty", text_unc, "caption", data)
    check_finite(method, "uncertainty", image_unc, "image", data)

    def score_fn(start: int, stop: int) -> torch.Tensor:
        scores = method.score({k: v[start:stop] for k, v in texts.items()}, images)
        if not bool(torch.isfinite(scores).all()):
            row = _first_bad_row(scores)
            col = int((~torch.isfinite(scores[row])).nonzero()[0, 0])
            raise NonFiniteError(
                f"{method.name}: non-finite score for {_row(data, 'caption', start + row)}"
                f" against {_row(data, 'image', col)}"
            )
        return scores

    with_eccv = eccv and karpathy is not None
    ranking = rank_pass(
        score_fn,
        n_text,
        n_image,
        data.text_to_image,
        depth=max(10, karpathy.i2t_depth if with_eccv else 0),
        top_t2i=karpathy.t2i_depth if with_eccv else 1,
        scale=method.calibration_scale(),
        chunk_size=chunk_size,
        memory_budget=memory_budget,
        progress=progress,
    )
    result = ranking_metrics(ranking, (1, 5, 10), text_unc, image_unc, n_bins)
    if with_eccv:
        result["eccv"] = eccv_caption.eccv_metrics(ranking.t2i_top, ranking.i2t_top, karpathy)
    if fold_size is not None:
        if karpathy is not None and fold_size == 1000:
            folds = list(karpathy.folds)
        else:
            owner = data.text_to_image.cpu().numpy()
            starts = range(0, n_image, fold_size)
            rows = [np.arange(s, s + fold_size) for s in starts]
            folds = [(r, np.flatnonzero(np.isin(owner, r))) for r in rows]
        per_fold = [
            evaluate_retrieval(
                method,
                data.subset(image_rows, caption_rows),
                n_bins=n_bins,
                chunk_size=chunk_size,
                eccv=False,
                memory_budget=memory_budget,
            )
            for image_rows, caption_rows in folds
        ]
        key = "coco_1k" if fold_size == 1000 else f"folds_{fold_size}"
        result[key] = {**average_folds(per_fold), "fold_size": fold_size}
    return result | {"method": method.name, "n_text": n_text, "n_image": n_image}


@torch.no_grad()
def caption_scores(method: Method, data: SplitTensors) -> pa.Table:
    """Per caption: ``caption_id``, ``text``, ``kappa`` and ``uncertainty`` (null where
    undefined), then the split's other caption columns."""
    texts, _ = encode_split(method, data)
    unc = method.text_uncertainty_from(texts)
    check_finite(method, "uncertainty", unc, "caption", data)
    n = data.text_emb.shape[0]

    def column(value: torch.Tensor | None) -> pa.Array:
        if value is None:
            return pa.nulls(n, pa.float32())
        return pa.array(value.float().cpu().numpy(), pa.float32())

    columns = {
        "caption_id": pa.array(data.split.caption_ids, pa.string()),
        "text": pa.array(data.split.texts, pa.string()),
        "kappa": column(texts.get("kappa")),
        "uncertainty": column(unc),
    }
    for name, values in data.split.extra_text_columns.items():
        columns[name] = pa.array(np.asarray(values))
    return pa.table(columns)
