"""``asymvlm import-official``: an authors' checkpoint scored and evaluated with their numbers."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from asymvlm.checkpoints import load_checkpoint
from asymvlm.cli import main
from tests import conformance
from tests.helpers import write_table

SEED0 = [c for c in conformance.cases() if c[1] == 0]
pytestmark = pytest.mark.skipif(not SEED0, reason="conformance vectors not found")
OFFICIAL_KEY = {"asymvlm-ps": "asymvlm-psd"}


def _official_file(tmp_path, method: str) -> str:
    arrays, _ = conformance.load(method, 0)
    state = {k: v.float() for k, v in conformance.official_state_dict(arrays).items()}
    path = str(tmp_path / f"{method}.pt")
    torch.save(state, path)  # as the authors' train.py saves it
    return path


def _test_table(root: str, inputs) -> None:
    """The test set as a table without image norms (unit images, as the authors evaluate)."""
    images = inputs["input/test_image_emb"].astype(np.float32)
    texts = inputs["input/test_text_emb"].astype(np.float64)
    write_table(root, images, texts, inputs["input/test_caption_image_index"])


@pytest.mark.parametrize("method", ["asymvlm-ps", "probvlm", "pcmepp"])
def test_imported_checkpoint_gives_the_official_numbers(method, tmp_path, capsys) -> None:
    arrays, inputs = conformance.load(method, 0)
    out = str(tmp_path / "ckpt")
    key = OFFICIAL_KEY.get(method, method)
    argv = ["import-official", "--method", key, "--checkpoint", _official_file(tmp_path, method)]
    assert main([*argv, "--output", out]) == 0

    model, meta = load_checkpoint(out)
    assert meta["method"] == method and meta["complete"]
    assert meta["method_kwargs"]["protocol"] == "official"
    model = model.double().eval()
    text = torch.as_tensor(inputs["input/text_emb"])
    image = torch.as_tensor(inputs["input/image_emb"])
    with torch.no_grad():
        uncertainty = model.text_uncertainty(text).numpy()
        scores = model.log_likelihood(image, text).numpy()
    torch.testing.assert_close(uncertainty, arrays["out/text_uncertainty"], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(scores, arrays["out/scores"], rtol=1e-6, atol=1e-9)

    # Through the CLI on a table of the test set: the ranking key of the official evaluation
    # (float32 here, as the authors evaluate).
    root = str(tmp_path / "tables")
    _test_table(root, inputs)
    scores = str(tmp_path / "scores.parquet")
    common = ["--checkpoint", out, "--embeddings", root, "--split", "test", "--quiet"]
    assert main(["score", *common, "--output", scores]) == 0
    unc = pq.read_table(scores).column("uncertainty").to_numpy()
    np.testing.assert_allclose(unc, arrays["out/test_text_uncertainty"], rtol=2e-5)
    assert main(["evaluate", *common, "--output", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["t2i"]["uncertainty_source"] == "text"
    assert len(result["t2i"]["binned_recall@1"]) == 10

    # Nothing already written is replaced without --overwrite.
    assert main([*argv, "--output", out]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([*argv, "--output", out, "--overwrite"]) == 0


def test_import_errors_are_one_line(tmp_path, capsys) -> None:
    good = _official_file(tmp_path, "pfe")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    cases = [
        (["--method", "bayes", "--checkpoint", good], "has no method 'bayes'"),
        (["--method", "pfe", "--checkpoint", str(tmp_path / "none.pt")], "no such file"),
        (["--method", "pfe", "--checkpoint", str(junk)], "not a torch state dict"),
        (["--method", "probvlm", "--checkpoint", good], "unexpected parameter"),
        (["--method", "pcmepp", "--checkpoint", good], "unexpected parameter"),
    ]
    for args, message in cases:
        code = main(["import-official", *args, "--output", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2, args
        assert message in err and "Traceback" not in err, err
