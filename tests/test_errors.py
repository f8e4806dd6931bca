"""The exit-code mapping: the project's errors exit 2, anything else shows its traceback."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
from pydantic import BaseModel, ValidationError

from asymvlm.data.sources import SourceError
from asymvlm.entry import guarded
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError, Unfinished
from asymvlm.tables import TableError


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("c.yaml: epochs = 0: too small"), 2),
        (CheckpointError("ckpt: no config.json"), 2),
        (TableError("t/train/texts/part-0.parquet row 3: NaN"), 2),
        (SourceError("captions.json: line 2: not JSON"), 2),
        (NonFiniteError("non-finite loss at epoch 2"), 3),
        (Unfinished("2 trials left"), 75),
        (KeyboardInterrupt(), 130),
    ],
)
def test_the_projects_errors_are_one_line_and_their_code(exc, code, capsys) -> None:
    assert guarded(Mock(side_effect=exc)) == code
    assert capsys.readouterr().err == f"error: {str(exc) or 'interrupted'}\n"


@pytest.mark.parametrize("exc", [ValueError("a bug"), OSError(5, "a bug"), KeyError("bug")])
def test_anything_else_is_a_bug_with_its_traceback(exc) -> None:
    with pytest.raises(type(exc)):
        guarded(Mock(side_effect=exc))


def test_a_validation_error_that_escaped_the_config_boundary_is_one_line(capsys) -> None:
    class Spec(BaseModel):
        epochs: int

    with pytest.raises(ValidationError) as caught:
        Spec(epochs="many")
    assert guarded(Mock(side_effect=caught.value)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Spec: epochs: Input should be a valid integer")
    assert len(err.strip().splitlines()) == 1
