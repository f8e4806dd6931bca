"""The documentation site: references generated from the code; ``mkdocs build --strict``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reference():
    spec = importlib.util.spec_from_file_location(
        "docs_reference", os.path.join(REPO, "scripts", "docs_reference.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_key_has_a_description() -> None:
    assert _reference().undocumented_fields() == []


def test_the_config_reference_holds_every_key_type_default_and_range() -> None:
    from asymvlm.training import TrainConfig

    page = _reference().config_page()
    lines = page.splitlines()

    def row(schema: str, key: str) -> list[str]:
        start = lines.index(f"### {schema}")
        line = next(x for x in lines[start:] if x.startswith(f"| `{key}` |"))
        return [c.strip() for c in line.strip("|").split(" | ")]

    assert row("TrainConfig", "epochs")[1:4] == ["int", "`200`", "≥ 1"]
    assert row("TrainConfig", "epochs")[4] == TrainConfig.model_fields["epochs"].description
    assert row("ServeConfig", "port")[2:4] == ["`8000`", "≥ 1, ≤ 65535"]
    assert row("TrainConfig", "protocol")[1] == "`improved` \\| `official`"
    lr = ["list of float", "**required**", "length ≥ 1, each &gt; 0"]
    assert row("SweepConfig", "lr")[1:4] == lr
    assert "[StorageSettings](#storagesettings)" in row("PipelineConfig", "storage")[1]
    for kind in ("retrieval", "zeroshot", "nota", "hierarcaps", "ood"):
        assert f"## Evaluation `{kind}`" in page


def test_the_cli_reference_holds_every_command_and_flag() -> None:
    from asymvlm.cli import build_parser

    page = _reference().cli_page()
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        assert f"## `asymvlm {name}`" in page or f"### `asymvlm {name}`" in page, name
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in page, f"asymvlm {name} {flag}"
    for script in ("full", "sweep", "train", "embed", "serve"):
        assert f"### `pipelines/{script}.py`" in page


@pytest.mark.slow
def test_mkdocs_builds_the_site_strictly(tmp_path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "configuration" / "index.html").read_text()
    assert "the learning-rate grid" in page and "SweepConfig" in page
    assert (tmp_path / "cli" / "index.html").is_file()
    methods = (tmp_path / "methods" / "index.html").read_text()
    assert "asymvlm-vmf" in methods and "asymvlm:methods-table" not in methods
