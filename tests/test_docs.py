"""The documentation site: references generated from the code; ``mkdocs build --strict``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from scripts import docs_reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_config_key_has_a_description() -> None:
    assert docs_reference.undocumented_fields() == []


def test_the_config_reference_holds_every_key_type_default_and_range() -> None:
    from asymvlm.training import TrainConfig

    page = docs_reference.config_page()
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

    page = docs_reference.cli_page()
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
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "configuration" / "index.html").read_text()
    assert "the learning-rate grid" in page and "SweepConfig" in page
    assert (tmp_path / "cli" / "index.html").is_file()
    methods = (tmp_path / "methods" / "index.html").read_text()
    assert "asymvlm-vmf" in methods and "asymvlm:methods-table" not in methods


def test_help_texts_are_plain_text() -> None:
    """No Sphinx markup or <placeholders> (which HTML swallows) in any --help."""
    page = docs_reference.cli_page()
    text = "\n".join(line for line in page.splitlines() if not line.startswith("```"))
    assert re.findall(r":\w+:`|``|<[A-Za-z_][\w-]*>", text) == []
    assert "ROOT/SPLIT/{images,texts,errors}" in page
    for script in ("full", "serve", "sweep", "embed"):  # --config points to the key reference
        part = page.split(f"### `pipelines/{script}.py`")[1].split("### `")[0]
        assert "Configuration reference" in " ".join(part.split()), script


def test_readme_is_short_and_links_to_pages_that_exist() -> None:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert len(readme.splitlines()) <= 250
    assert "pip install" in readme and "source .venv/bin/activate" in readme
    assert re.findall(r"[−-]?\b0\.\d\d|\b\d+ s\b", readme) == []  # results: the report's
    for link in re.findall(r"\]\(((?:docs|cluster|benchmarks)/[^)#]+)", readme):
        assert os.path.exists(os.path.join(REPO, link)), link


def _clip_retrieval_folder(src, sizes: tuple[int, ...], short: int = 0) -> list[str]:
    """clip-retrieval's output: shards of float16 embeddings and metadata (the last ``short``
    rows short); shard 0's rows 3 and 7 have no caption (None, NaN). Returns the image ids."""
    rng, ids = np.random.default_rng(0), []
    for i, n in enumerate(sizes):
        for kind in ("img", "text"):
            (src / f"{kind}_emb").mkdir(parents=True, exist_ok=True)
            x = rng.normal(size=(n, 8))
            np.save(src / f"{kind}_emb" / f"{kind}_emb_{i}.npy", (x / 3).astype(np.float16))
        names = [f"images/{i}/{k}.jpg" for k in range(n)]
        captions = [f"a photo {s}" for s in names]
        if i == 0:
            captions[3], captions[7] = None, float("nan")
        ids += names
        (src / "metadata").mkdir(exist_ok=True)
        meta = pd.DataFrame({"image_path": names, "caption": captions})
        meta.iloc[: n - short if i == len(sizes) - 1 else n].to_parquet(
            src / "metadata" / f"metadata_{i}.parquet"
        )
    return ids


def test_the_clip_retrieval_example_of_the_tables_page_converts(tmp_path, monkeypatch) -> None:
    """docs/tables.md's converter, run on a clip-retrieval-style folder of two shards: pairs
    without a caption are left out; a shard whose metadata is short is refused in one line."""
    from asymvlm.tables import read_split

    with open(os.path.join(REPO, "docs", "tables.md"), encoding="utf-8") as fh:
        code = compile(fh.read().split("```python\n")[1].split("```")[0], "docs/tables.md", "exec")
    src = tmp_path / "clip-inference-output"
    ids = _clip_retrieval_folder(src, (30, 25))
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    splits = {s: read_split("tables/my-data", s) for s in ("train", "test")}
    captioned = sorted(set(ids) - {"images/0/3.jpg", "images/0/7.jpg"})
    assert sorted(splits["train"].image_ids + splits["test"].image_ids) == captioned
    assert 0 < len(splits["test"].image_ids) < len(splits["train"].image_ids)
    test = splits["test"]
    assert test.manifest.dim == 8 and test.text_norms is None
    assert test.texts[0] == f"a photo {test.image_ids[0]}"
    shard, row = (int(p) for p in re.findall(r"\d+", test.image_ids[0]))
    raw = np.load(src / "text_emb" / f"text_emb_{shard}.npy")[row].astype(np.float32)
    np.testing.assert_allclose(test.text_embeddings[0], raw / np.linalg.norm(raw), atol=1e-6)
    (tmp_path / "short").mkdir()
    _clip_retrieval_folder(tmp_path / "short" / "clip-inference-output", (30, 25), short=3)
    monkeypatch.chdir(tmp_path / "short")
    with pytest.raises(SystemExit, match="^shard 1: 25 img embeddings, 22 metadata rows$"):
        exec(code, {})
