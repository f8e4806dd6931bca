"""The quickstart notebook: stripped, in step with its script, and executed offline."""

from __future__ import annotations

import ast
import importlib
import json
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "notebooks", "quickstart.ipynb")
SCRIPT = os.path.join(REPO, "notebooks", "quickstart.py")


def _cells() -> list[dict]:
    with open(NOTEBOOK) as fh:
        return json.load(fh)["cells"]


def _code() -> list[str]:
    return ["".join(c["source"]) for c in _cells() if c["cell_type"] == "code"]


def test_the_notebook_is_stripped() -> None:
    for cell in _cells():
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None


def test_the_notebook_and_its_script_agree() -> None:
    jupytext = pytest.importorskip("jupytext")
    paired = jupytext.read(SCRIPT)
    ours = [(c["cell_type"], "".join(c["source"]).strip()) for c in _cells()]
    theirs = [(c["cell_type"], c["source"].strip()) for c in paired.cells]
    assert ours == theirs, "run `.venv/bin/jupytext --sync notebooks/quickstart.py`"


def test_the_notebook_imports_public_names_only() -> None:
    imported = []
    for source in _code():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asymvlm"):
                imported += [(node.module, alias.name) for alias in node.names]
    assert len(imported) >= 8
    for module_name, name in imported:
        module = importlib.import_module(module_name)
        assert not name.startswith("_"), f"{module_name}.{name}"
        assert name in getattr(module, "__all__", ()), f"{module_name}.{name} is not public"


@pytest.mark.slow
def test_the_notebook_runs_offline(tmp_path, monkeypatch) -> None:
    nbclient = pytest.importorskip("nbclient")
    import nbformat

    monkeypatch.setenv("QUICKSTART_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("QUICKSTART_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    resources = {"metadata": {"path": str(tmp_path)}}
    nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources=resources
    ).execute()
    figures = ["binned_recall.png", "risk_coverage.png", "uncertainty_by_level.png"]
    assert sorted(os.listdir(tmp_path / "figures")) == figures
    text = "".join(
        o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs
    )
    assert "Traceback" not in text
    assert "['README.md', 'config.json', 'model.safetensors']" in text
    assert "rejected as 'a photo'" in text
    spearman = float(text.split("\nS ")[1].split()[0])
    assert spearman < -0.5  # the uncertainty orders the bins on this world
