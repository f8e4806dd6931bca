"""Non-finite numbers never pass as results: retrieval metrics, evaluation, training."""

from __future__ import annotations

import re

import pytest
import torch

from asymvlm import tables
from asymvlm.errors import ConfigError, NonFiniteError
from asymvlm.evaluation import caption_scores, evaluate_retrieval
from asymvlm.methods import METHODS, build_method
from asymvlm.splits import SplitTensors, load_split
from asymvlm.synthetic import WorldConfig, write_world
from asymvlm.training import Trainer
from asymvlm.training.trainer import steps_per_epoch
from tests.helpers import PAIRS, SCORES, retrieval, toy_config, toy_split

NAN, INF = float("nan"), float("inf")

KS = (1, 2, 5)


def _recalls(res: dict) -> dict[str, list[float]]:
    return {d: [res[d][f"recall@{k}"] for k in KS] for d in ("t2i", "i2t")}


# -- retrieval_metrics ------------------------------------------------------------------------
@pytest.mark.parametrize("value", [NAN, INF, -INF])
@pytest.mark.parametrize("everywhere", [True, False])
def test_non_finite_pairs_are_misses(value, everywhere) -> None:
    scores = torch.full((6, 3), value) if everywhere else SCORES.clone()
    scores[torch.arange(6), PAIRS] = value
    for chunk_size in (1, 4, 100):  # K=5 exceeds the gallery: only finite pairs may count
        res = retrieval(scores, chunk_size=chunk_size)
        assert _recalls(res) == {"t2i": [0.0, 0.0, 0.0], "i2t": [0.0, 0.0, 0.0]}


# -- evaluation refuses a broken adapter ------------------------------------------------------
@pytest.fixture(scope="module")
def eval_split(tmp_path_factory) -> SplitTensors:
    """A synthetic test split to evaluate on: 12 images, 24 captions."""
    root = tmp_path_factory.mktemp("nf-world") / "tables"
    write_world(str(root), WorldConfig(dim=8, splits={"test": 12}, captions_per_image=2))
    return load_split(str(root), "test")


@pytest.mark.parametrize(
    "name,attr,key,row,kind",
    [
        ("asymvlm-vmf", "encode_texts", "kappa", 17, "caption"),
        ("symvlm", "encode_images", "mu", 5, "image"),
    ],
)
def test_a_non_finite_encoding_names_its_caption_or_image(eval_split, name, attr, key, row, kind):
    method = build_method(name, 8, hidden_dim=8, depth=1)
    original = getattr(method, attr)

    def broken(x):
        out = original(x)
        out[key] = out[key].clone().index_fill_(0, torch.tensor([row]), NAN)
        return out

    setattr(method, attr, broken)
    ident = getattr(eval_split.split, f"{kind}_ids")[row]
    expected = f"{name}: non-finite {key} for {kind} '{ident}' (row {row})"
    for evaluate in (
        (evaluate_retrieval, caption_scores) if kind == "caption" else (evaluate_retrieval,)
    ):
        with pytest.raises(NonFiniteError) as err:
            evaluate(method, eval_split)
        assert str(err.value) == expected


def test_non_finite_score_names_caption_and_image(eval_split) -> None:
    method = build_method("clip", 8)
    original = method.score

    def score(texts, images):
        out = original(texts, images)
        out[-1, 3] = INF  # the last caption of the chunk against image 3
        return out

    method.score = score
    caption, image = eval_split.split.caption_ids[9], eval_split.split.image_ids[3]
    with pytest.raises(NonFiniteError) as err:
        evaluate_retrieval(method, eval_split, chunk_size=10)
    assert str(err.value) == (
        f"clip: non-finite score for caption '{caption}' (row 9) against image '{image}' (row 3)"
    )


# bayesvlm is fitted post hoc on pre-projection features (test_bayesvlm.py)
@pytest.mark.parametrize("name", sorted(set(METHODS) - {"bayesvlm"}))
def test_no_registered_method_raises_a_false_alarm(eval_split, name) -> None:
    torch.manual_seed(0)
    method = build_method(name, 8, hidden_dim=8, depth=1)
    method.fit_start(eval_split.image_emb, eval_split.text_emb)
    res = evaluate_retrieval(method, eval_split)
    assert 0.0 <= res["t2i"]["recall@1"] <= 1.0 and res["n_text"] == 24
    assert caption_scores(method, eval_split).num_rows == 24


# -- training stops at the end of the epoch of the first non-finite step -----------------------
def _trainer() -> Trainer:
    torch.manual_seed(0)  # 100 captions, batch 32: 3 steps per epoch
    method = build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2)
    return Trainer(method, toy_config(), toy_split())


def test_the_first_bad_step_is_named_and_its_epoch_dropped() -> None:
    trainer = _trainer()
    calls, original = [0], trainer.method.loss_features

    def spy(image_emb, text_emb):  # the 5th batch (epoch 2, step 2) carries a NaN caption
        calls[0] += 1
        if calls[0] == 5:
            text_emb = text_emb.clone()
            text_emb[3, 0] = NAN
        return original(image_emb, text_emb)

    trainer.method.loss_features = spy
    with pytest.raises(NonFiniteError) as err:
        trainer.fit(progress=False)
    assert str(err.value) == (
        "non-finite loss and gradient at epoch 2 of 4, step 2 of 3 (asymvlm-vmf, sgd lr 0.01): "
        "the run diverged; lower the learning rate"
    )
    assert calls[0] == 6 and trainer.epoch == 1  # ran to the end of epoch 2, which is dropped


def test_a_non_finite_gradient_with_a_finite_loss() -> None:
    trainer = _trainer()
    calls = [0]

    def poison(grad: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return grad * INF if calls[0] == 3 else grad

    next(p for p in trainer.method.parameters() if p.requires_grad).register_hook(poison)
    with pytest.raises(NonFiniteError, match=r"^non-finite gradient at epoch 1 of 4, step 3 of 3 "):
        trainer.fit(progress=False)


def test_a_nan_embedding_given_to_the_trainer_is_named() -> None:
    data = toy_split()
    data.text_emb[17, 2] = NAN
    with pytest.raises(NonFiniteError, match="non-finite caption embedding for caption row 17 "):
        Trainer(build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2), toy_config(), data)


# -- empty splits -------------------------------------------------------------------------------
def test_an_empty_split_table_is_named_when_loaded(tmp_path) -> None:
    root = str(tmp_path / "tables")
    write_world(root, WorldConfig(dim=8, splits={"train": 0, "test": 4}, captions_per_image=2))
    with pytest.raises(tables.TableError, match=re.escape(f"{root}/train")):
        load_split(root, "train")


def test_the_trainer_refuses_an_empty_split_instead_of_dividing_by_zero() -> None:
    no_rows = torch.zeros(0, 8)
    empty = SplitTensors(no_rows, no_rows, torch.zeros(0, dtype=torch.long), split=None)
    with pytest.raises(ConfigError, match="empty split"):
        Trainer(build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2), toy_config(), empty)
    with pytest.raises(ValueError, match="at least one item"):  # nor counts steps of nothing
        steps_per_epoch(0, 32)
