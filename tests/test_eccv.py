"""ECCV Caption / CxC and the COCO 1K folds on a fake COCO Karpathy 5k test table: the real test
ids (``eccv_caption``'s ground truth) plus ten captions outside it, sorted by id string as our
readers do; scores are fixed noise in [0, 1) plus a bonus for the ECCV positives (known answers)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from asymvlm import tables
from asymvlm.evaluation import evaluate_retrieval
from asymvlm.evaluation.retrieval import coco_karpathy_test
from asymvlm.methods.base import Method
from asymvlm.metrics import eccv
from asymvlm.metrics.glossary import retrieval_metric_names
from asymvlm.splits import SplitTensors

GT = eccv._ground_truth()
N_EXTRA = 10


class _Table:
    """Row order of the fake table: images by id string, captions by (image, caption) string."""

    def __init__(self) -> None:
        images = sorted(GT.coco_gts["i2t"], key=str)
        owner = {c: ids[0] for c, ids in GT.coco_gts["t2i"].items()}
        # Captions outside the 25,000: the two ECCV positives that are not among them (given to
        # the image they are positive for) and made-up ids.
        for i, captions in GT.eccv_gts["i2t"].items():
            owner.update({c: i for c in captions if c not in owner})
        fake = 10**9
        owner.update({fake + k: images[k] for k in range(N_EXTRA - len(owner) + 25000)})
        captions = sorted(owner, key=lambda c: (str(owner[c]), str(c)))
        self.image_ids = [str(i) for i in images]
        self.caption_ids = [str(c) for c in captions]
        image_row = {i: r for r, i in enumerate(images)}
        caption_row = {c: r for r, c in enumerate(captions)}
        self.text_to_image = torch.tensor([image_row[owner[c]] for c in captions])
        self.n_text, self.n_image = len(captions), len(images)
        # The ECCV positives (caption row, image row), both directions.
        pairs = {
            (caption_row[c], image_row[i]) for c, ids in GT.eccv_gts["t2i"].items() for i in ids
        }
        for i, ids in GT.eccv_gts["i2t"].items():
            pairs |= {(caption_row[c], image_row[i]) for c in ids}
        self.positive = torch.zeros(self.n_text, self.n_image, dtype=torch.bool)
        self.positive[tuple(torch.tensor(sorted(pairs)).T)] = True

    def scores(self, rows: torch.Tensor, cols: torch.Tensor, bonus: float) -> torch.Tensor:
        """Fixed noise in [0, 1) per (caption row, image row), + ``bonus`` for ECCV positives."""
        x = torch.sin(rows.double()[:, None] * 12.9898 + cols.double()[None, :] * 78.233)
        return torch.frac(torch.abs(x * 43758.5453)) + bonus * self.positive[rows[:, None], cols]


TABLE = _Table()


class _RowScores(Method):
    """Scores by row index (the embedding's first coordinate): :meth:`_Table.scores`."""

    name = "row-scores"

    def __init__(self, bonus: float) -> None:
        super().__init__(dim=1)
        self.bonus = bonus

    def encode_texts(self, text_emb):
        return {"row": text_emb[:, 0]}

    def encode_images(self, image_emb):
        return {"row": image_emb[:, 0]}

    def score(self, texts, images):
        return TABLE.scores(texts["row"].long(), images["row"].long(), self.bonus).float()


def _data(dataset: str = "coco-karpathy", split: str = "test") -> SplitTensors:
    described = {"dataset": dataset, "split": split, "karpathy_splits": [split]}
    manifest = tables.Manifest(dim=1, model="fake", extra={"splits": {"test": described}})
    image_rows = np.arange(TABLE.n_image, dtype=np.float32)[:, None]
    text_rows = np.arange(TABLE.n_text, dtype=np.float32)[:, None]
    emb = tables.EmbeddingSplit(
        image_ids=TABLE.image_ids,
        image_embeddings=image_rows,
        caption_ids=TABLE.caption_ids,
        text_image_index=TABLE.text_to_image.numpy(),
        texts=[""] * TABLE.n_text,
        text_embeddings=text_rows,
        text_norms=None,
        extra_text_columns={},
        manifest=manifest,
    )
    rows = (torch.from_numpy(image_rows), torch.from_numpy(text_rows))
    return SplitTensors(*rows, TABLE.text_to_image, emb)


def test_the_table_maps_onto_the_ground_truth_and_no_other_does() -> None:
    test = eccv.karpathy_test(TABLE.image_ids, TABLE.caption_ids)
    assert (test.caption_ids == -1).sum() == N_EXTRA
    assert sorted(test.caption_ids[test.caption_ids >= 0].tolist()) == sorted(GT.coco_ids.tolist())
    assert [(len(i), len(c)) for i, c in test.folds] == [(1000, 5000)] * 5
    # Fold 0 is the first 1000 images of the Karpathy order, with their five captions each.
    first = [int(c) for c in GT.coco_ids[:5000]]
    assert [int(TABLE.caption_ids[r]) for r in test.folds[0][1]] == first
    owners = {GT.coco_gts["t2i"][c][0] for c in first}
    assert {int(TABLE.image_ids[r]) for r in test.folds[0][0]} == owners
    # Depths: the most ECCV positives of a query (+ the captions outside the ground truth).
    assert test.t2i_depth == max(len(v) for v in GT.eccv_gts["t2i"].values())
    assert test.i2t_depth == max(len(v) for v in GT.eccv_gts["i2t"].values()) + N_EXTRA
    assert eccv.karpathy_test(TABLE.image_ids[:-1], TABLE.caption_ids) is None  # an image short
    missing = [c for c in TABLE.caption_ids if c != str(GT.coco_ids[7])]
    assert eccv.karpathy_test(TABLE.image_ids, missing) is None  # a ground-truth caption short
    assert eccv.karpathy_test(["a"] * 5000, TABLE.caption_ids) is None  # not COCO ids
    # The ids are the test split's, but the manifest records another data set or split.
    assert coco_karpathy_test(_data()) is not None
    assert coco_karpathy_test(_data("coco", "test")) is None
    assert coco_karpathy_test(_data("coco-karpathy", "val")) is None


def _best_eccv() -> dict[str, dict[str, float]]:
    """ECCV metrics when every query's positives rank first; in i2t, m / R for a query with m
    of its R positives among the 25,000 (the others are never ranked, as in the package)."""
    gallery = {int(c) for c in GT.coco_ids}
    share = [len(set(v) & gallery) / len(v) for v in GT.eccv_gts["i2t"].values()]
    assert min(share) < 1.0  # the ground truth has such queries
    i2t = float(np.mean(share))
    return {
        "i2t": {"eccv_map_at_r": i2t, "eccv_rprecision": i2t, "eccv_r1": 1.0},
        "t2i": {"eccv_map_at_r": 1.0, "eccv_rprecision": 1.0, "eccv_r1": 1.0},
    }


def _fold_top10(test: eccv.KarpathyTest, bonus: float):
    """Per query, its COCO 1K fold's 10 best items (COCO ids; no ties)."""
    t2i, i2t = {}, {}
    for images, captions in test.folds:
        rows, cols = torch.from_numpy(captions), torch.from_numpy(images)
        s = TABLE.scores(rows, cols, bonus)
        best_images = cols[torch.topk(s, 10, dim=1).indices].tolist()
        for r, top in zip(captions.tolist(), best_images, strict=True):
            t2i[int(TABLE.caption_ids[r])] = [int(TABLE.image_ids[i]) for i in top]
        best_captions = rows[torch.topk(s, 10, dim=0).indices].T.tolist()
        for i, top in zip(images.tolist(), best_captions, strict=True):
            i2t[int(TABLE.image_ids[i])] = [int(TABLE.caption_ids[c]) for c in top]
    return {"i2t": i2t, "t2i": t2i}


@pytest.mark.slow
def test_evaluate_adds_eccv_and_coco_1k_on_the_karpathy_test_split() -> None:
    res = evaluate_retrieval(_RowScores(2.0), _data(), fold_size=1000, chunk_size=4096)
    json.dumps(res, allow_nan=False)
    assert res["n_text"] == 25000 + N_EXTRA and res["n_image"] == 5000
    for direction, best in _best_eccv().items():  # ECCV positives first
        for key, value in best.items():
            assert res["eccv"][direction][key] == pytest.approx(value, abs=1e-12), key
        assert 0.0 < res["eccv"][direction]["cxc_r1"] < 1.0
    # COCO 1K = the package's five-fold recall over independently ranked folds.
    coco = res["coco_1k"]
    assert coco["n_folds"] == 5 and coco["fold_size"] == 1000
    retrieved = _fold_top10(eccv.karpathy_test(TABLE.image_ids, TABLE.caption_ids), 2.0)
    for k in (1, 5, 10):
        ref = GT.coco_1k_recalls(retrieved, "all", K=k)
        for direction in ("i2t", "t2i"):
            assert coco[direction][f"recall@{k}"] == pytest.approx(ref[direction], abs=1e-12)
    assert 0.0 < coco["t2i"]["recall@1"] < 1.0 and 0.0 < coco["i2t"]["recall@1"] < 1.0
    names = retrieval_metric_names(res)
    assert names["eccv_i2t_map_at_r"] == res["eccv"]["i2t"]["eccv_map_at_r"]
    assert names["eccv_t2i_rprecision"] == res["eccv"]["t2i"]["eccv_rprecision"]
    assert names["cxc_t2i_r1"] == res["eccv"]["t2i"]["cxc_r1"]
    assert names["coco1k_t2i_recall_at_1"] == coco["t2i"]["recall@1"]
    assert names["coco1k_rsum"] == coco["rsum"] and names["rsum"] == res["rsum"]


def test_a_sample_of_the_karpathy_test_split_gets_no_eccv() -> None:
    sub = _data().subset(np.arange(100), np.flatnonzero(TABLE.text_to_image.numpy() < 100))
    assert eccv.karpathy_test(sub.split.image_ids, sub.split.caption_ids) is None
    assert "eccv" not in evaluate_retrieval(_RowScores(0.0), sub)
