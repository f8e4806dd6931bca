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

#: Rows encoded at once: a split's encodings are made (and checked) in blocks of this many.
ENCODE_ROWS = 8192


def _row(data: SplitTensors, kind: str, row: int) -> str:
    """``caption 'c17' (row 17)``, or ``caption row 17`` when the split has no ids."""
    ids = getattr(data.split, "caption_ids" if kind == "caption" else "image_ids", None)
    return f"{kind} {ids[row]!r} (row {row})" if ids is not None else f"{kind} row {row}"


def _finite(value: torch.Tensor) -> bool:
    """Whether every value is finite (NaN/inf shows in the extremes: no temporary of its size)."""
    low, high = torch.aminmax(value)
    return bool(low.isfinite() & high.isfinite())


def _first_bad_row(value: torch.Tensor) -> int:
    return int((~torch.isfinite(value.reshape(value.shape[0], -1)).all(dim=1)).nonzero()[0, 0])


def check_finite(
    method: Method,
    name: str,
    value: torch.Tensor | None,
    kind: str,
    data: SplitTensors,
    start: int = 0,
) -> None:
    """:class:`NonFiniteError` naming the first row (from ``start``) of ``value`` with a NaN/inf."""
    if not torch.is_tensor(value) or not value.is_floating_point() or not value.numel():
        return
    if _finite(value):
        return
    where = (
        f"a {kind} scalar" if value.ndim == 0 else _row(data, kind, start + _first_bad_row(value))
    )
    raise NonFiniteError(f"{method.name}: non-finite {name} for {where}")


def encode_rows(
    method: Method, kind: str, rows: torch.Tensor, data: SplitTensors, start: int, stop: int
) -> Encoding:
    """The encoding of the ``kind`` inputs ``rows[start:stop]``, checked finite."""
    encode = method.encode_texts if kind == "caption" else method.encode_images
    encoding = encode(rows[start:stop])
    for name, value in encoding.items():
        check_finite(method, name, value, kind, data, start)
    return encoding


def _encode_all(
    method: Method, kind: str, rows: torch.Tensor, data: SplitTensors, chunk_size: int = ENCODE_ROWS
) -> Encoding:
    """:func:`encode_rows` of every row in chunks, written into tensors allocated once."""
    out: Encoding = {}
    for start in range(0, len(rows), chunk_size):
        for name, value in encode_rows(method, kind, rows, data, start, start + chunk_size).items():
            if name not in out:
                out[name] = value.new_empty((len(rows), *value.shape[1:]))
            out[name][start : start + len(value)] = value
    return out


@torch.no_grad()
def encode_split(
    method: Method, data: SplitTensors, chunk_size: int = ENCODE_ROWS
) -> tuple[Encoding, Encoding]:
    """(text encoding, image encoding) of a whole split in chunks, checked finite."""
    method.eval()
    image_rows, text_rows = method.split_inputs(data)
    texts = _encode_all(method, "caption", text_rows, data, chunk_size)
    return texts, _encode_all(method, "image", image_rows, data, chunk_size)


class _CaptionBlocks:
    """The captions' encodings for the rank pass: blocks of ``size`` rows encoded as the pass
    moves forward, one held at a time (a caption's numbers do not depend on the pass's chunks),
    and the uncertainty of each block (:attr:`uncertainty`, in order)."""

    def __init__(
        self, method: Method, rows: torch.Tensor, data: SplitTensors, size: int = ENCODE_ROWS
    ) -> None:
        self.method, self.rows, self.data, self.size = method, rows, data, size
        self.uncertainty: list[torch.Tensor] = []
        self._block: tuple[int, Encoding] = (-1, {})

    def _encoded(self, start: int) -> Encoding:
        if self._block[0] != start:
            texts = encode_rows(
                self.method, "caption", self.rows, self.data, start, start + self.size
            )
            unc = self.method.text_uncertainty_from(texts)
            check_finite(self.method, "uncertainty", unc, "caption", self.data, start)
            self.uncertainty += [] if unc is None else [unc]
            self._block = (start, texts)
        return self._block[1]

    def between(self, start: int, stop: int) -> Encoding:
        """The encodings of captions ``start..stop-1`` (after those of every earlier caption)."""
        parts = [
            {k: v[max(start, lo) - lo : stop - lo] for k, v in self._encoded(lo).items()}
            for lo in range(start - start % self.size, stop, self.size)
        ]
        if len(parts) == 1:
            return parts[0]
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def coco_karpathy_test(data: SplitTensors) -> eccv_caption.KarpathyTest | None:
    """The ECCV Caption row maps when ``data`` is COCO's Karpathy 5k test split (manifest, ids)."""
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
    method.eval()
    image_rows, text_rows = method.split_inputs(data)
    images = _encode_all(method, "image", image_rows, data)
    image_unc = method.image_uncertainty_from(images)
    check_finite(method, "uncertainty", image_unc, "image", data)
    captions = _CaptionBlocks(method, text_rows, data)

    def score_fn(start: int, stop: int) -> torch.Tensor:
        texts = captions.between(start, stop)
        scores = method.score(texts, images)
        if not _finite(scores):
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
    text_unc = torch.cat(captions.uncertainty) if captions.uncertainty else None
    result = ranking_metrics(ranking, (1, 5, 10), text_unc, image_unc, n_bins)
    if with_eccv:
        result["eccv"] = eccv_caption.eccv_metrics(ranking.t2i_top, ranking.i2t_top, karpathy)
    if fold_size is not None:
        if karpathy is not None and fold_size == 1000:
            folds = list(karpathy.folds)
        else:
            owner = data.text_to_image.cpu().numpy()
            rows = np.arange(n_image).reshape(-1, fold_size)  # n_image is a multiple of it
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
def caption_scores(method: Method, data: SplitTensors, chunk_size: int = ENCODE_ROWS) -> pa.Table:
    """Per caption: ``caption_id``, ``text``, ``kappa`` and ``uncertainty`` (null where
    undefined), then the split's other caption columns; encoded chunk by chunk."""
    method.eval()
    _, text_rows = method.split_inputs(data)
    n = len(text_rows)
    numbers: dict[str, list[np.ndarray]] = {"kappa": [], "uncertainty": []}
    for start in range(0, n, chunk_size):
        texts = encode_rows(method, "caption", text_rows, data, start, start + chunk_size)
        unc = method.text_uncertainty_from(texts)
        check_finite(method, "uncertainty", unc, "caption", data, start)
        for name, value in (("kappa", texts.get("kappa")), ("uncertainty", unc)):
            if value is not None:
                numbers[name].append(value.float().cpu().numpy())
    columns = {
        "caption_id": pa.array(data.split.caption_ids, pa.string()),
        "text": pa.array(data.split.texts, pa.string()),
    }
    for name, parts in numbers.items():
        columns[name] = (
            pa.array(np.concatenate(parts), pa.float32()) if parts else pa.nulls(n, pa.float32())
        )
    for name, values in data.split.extra_text_columns.items():
        columns[name] = pa.array(np.asarray(values))
    return pa.table(columns)
