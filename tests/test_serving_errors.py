"""The adapter as an MLflow model (embeddings in): bad input is an invalid-parameter error
(HTTP 400 from MLflow's server) naming the row, never NaN."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from asymvlm.protocol import train
from asymvlm.scoring.models import CaptionUncertaintyModel
from asymvlm.training import TrainConfig

DIM = 16  # the small world's


@pytest.fixture(scope="module")
def checkpoint(small_world, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("serve") / "ckpt")
    cfg = TrainConfig(method="asymvlm-vmf", epochs=1, lr=1e-3, optimizer="adamw", hidden_dim=16)
    train(small_world, "train", cfg, output=out, progress=False)
    return out


def _adapter(folder: str) -> CaptionUncertaintyModel:
    model = CaptionUncertaintyModel()
    model.load_context(SimpleNamespace(artifacts={"checkpoint": folder}))
    return model


def _frame(embedding, norm=8.0) -> pd.DataFrame:
    return pd.DataFrame({"embedding": [embedding], "norm": [norm]})


UNIT = list(np.eye(DIM)[0])


# -- predict() directly --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (_frame(UNIT[:8]), "row 0: 'embedding' has 8 values; this adapter expects dim 16"),
        (_frame([math.nan] + UNIT[1:]), "row 0: 'embedding' holds a NaN or infinite value"),
        (_frame([math.inf] + UNIT[1:]), "row 0: 'embedding' holds a NaN or infinite value"),
        (_frame(["a"] * DIM), "row 0: 'embedding' must be a list of 16 numbers"),
        (_frame(None), "row 0: 'embedding' has shape (); this adapter expects dim 16"),
        (_frame(UNIT, math.nan), "row 0: 'norm' must be a positive finite number, got nan"),
        (_frame(UNIT, -1.0), "row 0: 'norm' must be a positive finite number, got -1.0"),
        (_frame(UNIT, "big"), "row 0: 'norm' must be a positive finite number, got 'big'"),
        (pd.DataFrame({"embedding": [UNIT]}), "input needs a 'norm' column"),
        (pd.DataFrame({"text": ["a dog"]}), "input needs a 'embedding' column"),
        (pd.DataFrame({"embedding": [], "norm": []}), "input has no rows"),
    ],
)
def test_bad_input_is_an_invalid_parameter(checkpoint, frame, message) -> None:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as err:
        _adapter(checkpoint).predict(None, frame)
    assert err.value.error_code == "INVALID_PARAMETER_VALUE"
    assert err.value.get_http_status_code() == 400
    assert err.value.message.startswith(message)


def test_the_bad_row_is_named(checkpoint) -> None:
    from mlflow.exceptions import MlflowException

    frame = pd.DataFrame({"embedding": [UNIT, UNIT, UNIT[:3]], "norm": [8.0, 8.0, 8.0]})
    with pytest.raises(MlflowException, match="^row 2: 'embedding' has 3 values"):
        _adapter(checkpoint).predict(None, frame)


def test_a_method_without_kappa_answers_null_not_nan(small_world, tmp_path) -> None:
    out = str(tmp_path / "clip")
    train(small_world, "train", TrainConfig(method="clip"), output=out, progress=False)
    result = _adapter(out).predict(None, _frame(UNIT))
    assert result.to_dict("records") == [{"uncertainty": None, "kappa": None}]


def test_a_good_request_gets_finite_numbers(checkpoint) -> None:
    model = CaptionUncertaintyModel()
    model.load_context(SimpleNamespace(artifacts={"checkpoint": checkpoint}))
    rows = model.predict(None, pd.DataFrame({"embedding": [UNIT, UNIT[::-1]], "norm": [8.0, 7.5]}))
    assert (rows["kappa"] > 0).all() and np.isfinite(rows["kappa"]).all()
    np.testing.assert_allclose(rows["uncertainty"], 1.0 / rows["kappa"], rtol=1e-5)
