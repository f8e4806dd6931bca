"""Protocol official: PFE* and ProbVLM take the raw image projection, all else unit images."""

from __future__ import annotations

import logging

import pytest
import torch

from asymvlm.checkpoints import load_checkpoint, save_checkpoint
from asymvlm.methods import METHODS, build_method
from asymvlm.splits import load_split
from asymvlm.training import TrainConfig, Trainer

RAW = {"pfe", "probvlm"}
SMALL = {"hidden_dim": 8, "depth": 1}


def test_only_official_pfe_and_probvlm_take_raw_images(pre_world, small_world, caplog) -> None:
    data = load_split(pre_world, "test")
    assert data.image_norm is not None and float(data.image_norm.std()) > 0
    raw = data.image_emb * data.image_norm[:, None]
    for name in sorted(set(METHODS) - {"bayesvlm"}):  # bayesvlm: [embedding | pre-projection]
        for protocol in ("official", "improved"):
            rows = build_method(name, 16, protocol=protocol).split_inputs(data)[0]
            expected = raw if (protocol == "official" and name in RAW) else data.image_emb
            torch.testing.assert_close(rows, expected, msg=f"{name}/{protocol}")
    # tables without image norms: the unit rows, with one warning
    data = load_split(small_world, "test")
    method = build_method("pfe", 16, protocol="official", **SMALL)
    with caplog.at_level(logging.WARNING, logger="asymvlm.methods.base"):
        assert method.split_inputs(data)[0] is data.image_emb
        method.split_inputs(data)
    messages = [r.getMessage() for r in caplog.records]
    (warning,) = [m for m in messages if "no image `norm` column" in m]
    assert "pfe" in warning


@pytest.mark.parametrize("name", sorted(RAW))
def test_training_and_evaluation_see_the_raw_images(name, pre_world, tmp_path) -> None:
    """Trained and saved on the raw image rows; the checkpoint comes back official."""
    from asymvlm.evaluation.retrieval import encode_split

    data = load_split(pre_world, "train")
    run = dict(epochs=1, batch_size=64, device="cpu", **SMALL)
    cfg = TrainConfig(method=name, protocol="official", **run)
    torch.manual_seed(0)
    method = build_method(name, 16, protocol="official", **SMALL)
    trainer = Trainer(method, cfg, data)
    raw = data.image_emb * data.image_norm[:, None]
    torch.testing.assert_close(trainer.data.image_emb, raw)
    txt, rows = data.text_emb[:32], data.text_to_image[:32]
    with torch.no_grad():
        gap = float(method.loss(raw[rows], txt)) - float(method.loss(data.image_emb[rows], txt))
        assert abs(gap) > 1e-3
    trainer.fit()
    save_checkpoint(str(tmp_path / "ckpt"), method, cfg, 16)
    loaded, _ = load_checkpoint(str(tmp_path / "ckpt"))
    assert loaded.protocol == "official" and loaded.raw_image_input
    test = load_split(pre_world, "test")
    _, images = encode_split(loaded, test)
    with torch.no_grad():
        expected = loaded.encode_images(test.image_emb * test.image_norm[:, None])
    uncertainty = loaded.image_uncertainty_from
    torch.testing.assert_close(uncertainty(images), uncertainty(expected))
