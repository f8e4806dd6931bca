"""Installs by need: the core runs; a missing extra is named in one line with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

from asymvlm.entry import exit_code, require
from asymvlm.extras import EXTRAS, missing_extra

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Runs ``asymvlm`` commands (JSON argv lines on stdin) in one process where no extra's module
#: is found, as in a core install; prints each command's exit code and stderr.
DRIVER = r"""
import contextlib, io, json, sys

BLOCKED = set(sys.argv[1].split(","))


class Hidden:  # a finder that finds no blocked module: absent, as where no extra is installed

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in BLOCKED:
            return self.finder.find_spec(name, path, target)

    def __getattr__(self, name):  # find_distributions: importlib.metadata finds the packages
        return getattr(self.finder, name)


sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
from asymvlm.cli import main

results = []
for line in sys.stdin:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        results.append([main(json.loads(line)), err.getvalue()])
print(json.dumps(results))
"""


def test_a_missing_extra_is_one_line_naming_the_extra() -> None:
    line = "mlflow is not installed: pip install 'asymvlm[tracking]'"
    exc = ModuleNotFoundError("No module named 'mlflow'", name="mlflow.pyfunc")
    assert missing_extra(exc) == line and exit_code(exc) == 2
    try:  # fsspec's way: its own ImportError, raised from the missing module's
        raise ImportError("Install s3fs to access S3") from ModuleNotFoundError(name="s3fs")
    except ImportError as chained:
        assert missing_extra(chained) == "s3fs is not installed: pip install 'asymvlm[s3]'"
    not_an_extra = ModuleNotFoundError("No module named 'numpy'", name="numpy")
    assert missing_extra(not_an_extra) is None and exit_code(not_an_extra) is None


def test_an_entry_point_that_needs_a_missing_extra_exits_2_with_one_line(
    monkeypatch, capsys
) -> None:
    require("s3", "tracking")  # installed here: nothing happens
    monkeypatch.setitem(EXTRAS, "no_such_module", "s3")
    with pytest.raises(SystemExit) as exited:
        require("ray", "s3")
    want = "error: no_such_module is not installed: pip install 'asymvlm[s3]'\n"
    assert exited.value.code == 2 and capsys.readouterr().err == want


def test_every_extra_named_is_declared_and_the_core_has_none_of_them() -> None:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert set(EXTRAS.values()) <= set(project["optional-dependencies"])
    core = " ".join(project["dependencies"]).lower()
    for name in ("ray", "mlflow", "transformers", "open_clip", "s3fs", "eccv", "matplotlib"):
        assert name not in core, name


@pytest.mark.slow
def test_the_core_trains_evaluates_scores_and_searches_without_the_extras(
    small_world, tmp_path
) -> None:
    from asymvlm.tables import read_split

    ckpt, metrics, scores = tmp_path / "ckpt", tmp_path / "m.json", tmp_path / "s.parquet"
    index, caption = tmp_path / "index", read_split(small_world, "test").texts[0]
    common = ["--device", "cpu", "--quiet"]
    commands = [
        ["train", "--embeddings", small_world, "--method", "asymvlm-vmf", "--epochs", "1"]
        + ["--batch-size", "64", "--output", str(ckpt), *common],
        ["evaluate", "--embeddings", small_world, "--checkpoint", str(ckpt)]
        + ["--output", str(metrics), *common],
        ["score", "--embeddings", small_world, "--checkpoint", str(ckpt)]
        + ["--output", str(scores), *common],
        ["index", "--embeddings", small_world, "--checkpoint", str(ckpt), "--output", str(index)],
        ["search", "--index", str(index), caption],
        ["evaluate", "--embeddings", small_world, "--checkpoint", "runs:/0123/model"]
        + ["--output", str(tmp_path / "x.json"), *common],
        ["train", "--embeddings", "s3://bucket/world", "--method", "asymvlm-vmf"]
        + ["--output", str(tmp_path / "y"), *common],
        ["report", "--experiment", "x", "--output", str(tmp_path / "report")],
        ["index", "--embeddings", small_world, "--checkpoint", str(ckpt)]
        + ["--output", str(tmp_path / "logged"), "--tracking-uri", "sqlite:///x.db"],
    ]
    blocked = ",".join(sorted(set(EXTRAS) | {"timm", "torchvision"}))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # no store here
    run = dict(capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    commands = "\n".join(map(json.dumps, commands))
    proc = subprocess.run([sys.executable, "-c", DRIVER, blocked], input=commands, **run)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    done, missing = results[:5], results[5:]
    assert [code for code, _ in done] == [0, 0, 0, 0, 0], proc.stdout[-3000:]
    assert (index / "manifest.json").exists()
    assert 0 <= json.loads(metrics.read_text())["t2i"]["recall@1"] <= 1 and scores.stat().st_size
    assert [(code, err.splitlines()[-1]) for code, err in missing] == [
        (2, "error: mlflow is not installed: pip install 'asymvlm[tracking]'"),
        (2, "error: s3fs is not installed: pip install 'asymvlm[s3]'"),
        (2, "error: mlflow is not installed: pip install 'asymvlm[tracking]'"),
        (2, "error: mlflow is not installed: pip install 'asymvlm[tracking]'"),
    ]
    assert not (tmp_path / "logged").exists(), "the index is refused before it is built"
