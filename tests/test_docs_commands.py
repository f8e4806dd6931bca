"""Every shell block of README.md and docs/*.md runs as written, so the docs cannot drift from
the code: each block in a fresh folder holding the tiny inputs its commands name (a small
synthetic world as ``tables/my-data``, an adapter over a tiny random CLIP as ``CKPT`` and as the
demo's HierarCaps adapter). A block that cannot run offline and quickly (a cluster, a server,
the Hub, a long training) carries, on the line before it, the marker
``<!-- not run by tests/test_docs_commands.py: REASON -->``; any other block is run.

``asymvlm ...`` and ``python -m asymvlm.synthetic ...`` run in this process (their imports
once), anything else in a shell; each command must exit 0."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- not run by tests/test_docs_commands\.py: (?P<reason>.*) -->$", re.M)
FENCE = re.compile(r"^```(?P<lang>bash|console|sh|shell)\n(?P<body>.*?)^```$", re.M | re.S)
#: What the repository's commands read (configs, spaces, examples ...), seen from each folder.
CHECKOUT = ("configs", "tune_spaces", "examples", "pipelines", "benchmarks", "notebooks", "scripts")
#: Where a demo run leaves its HierarCaps adapter (the docs' example of a text-in adapter).
DEMO_ADAPTER = "runs/demo/sweeps/hierarcaps-tiny/adapters/asymvlm-vmf/seed0"


class Block(NamedTuple):
    page: Path
    line: int
    commands: list[str]
    skip: str | None  # the marker's reason

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def commands(body: str, lang: str) -> list[str]:
    """The command lines of a block, continuation lines joined (a console block: its ``$ ``
    lines), without blank and comment-only lines."""
    lines = body.replace("\\\n", " ").splitlines()
    if lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if shlex.split(line, comments=True)]


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for fence in FENCE.finditer(text):
            before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = MARKER.fullmatch(before)
            line = text.count("\n", 0, fence.start()) + 1
            body = commands(fence["body"], fence["lang"])
            found.append(Block(page, line, body, marker["reason"] if marker else None))
    return found


BLOCKS = blocks()


def test_every_marker_names_its_reason_and_precedes_a_block() -> None:
    markers = sum(len(MARKER.findall(page.read_text())) for page in PAGES)
    skipped = [b for b in BLOCKS if b.skip is not None]
    assert markers == len(skipped) and all(b.skip.strip() for b in skipped)
    assert len(skipped) < len(BLOCKS)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The tiny inputs the docs' commands name, written once."""
    from types import SimpleNamespace

    from asymvlm import tables
    from asymvlm.checkpoints import provenance, save_checkpoint
    from asymvlm.data.tiny import save_tiny_clip
    from asymvlm.embedding.encoders import load_encoder
    from asymvlm.methods import build_method
    from asymvlm.synthetic import WorldConfig, write_world
    from asymvlm.training import TrainConfig

    base = tmp_path_factory.mktemp("docs-inputs")
    world = WorldConfig(dim=16, splits={"train": 24, "test": 16}, captions_per_image=1)
    write_world(str(base / "tables" / "my-data"), world)
    model = save_tiny_clip(str(tmp_path_factory.mktemp("docs-encoder") / "tiny-clip"))
    info = load_encoder(model, device="cpu", load_model=False).info
    manifest = tables.Manifest(dim=info.dim, model=model, extra=vars(info))
    split = SimpleNamespace(manifest=manifest, fingerprint=None)
    cfg = TrainConfig(method="asymvlm-vmf", hidden_dim=32, epochs=1)
    method = build_method("asymvlm-vmf", info.dim, **cfg.method_args())
    save_checkpoint(str(base / "CKPT"), method, cfg, info.dim, provenance(split), complete=True)
    shutil.copytree(base / "CKPT", base / DEMO_ADAPTER)
    for name in CHECKOUT:
        (base / name).symlink_to(REPO / name)
    (base / ".venv").symlink_to(sys.prefix)  # .venv/bin/... as in a checkout
    return base


def run(command: str, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """Exit code and output of one documented command, run in the current folder."""
    from asymvlm.cli import main as asymvlm
    from asymvlm.synthetic.command_line import main as synthetic

    words = shlex.split(command, comments=True)
    program, shell = os.path.basename(words[0]), any(set(w) & set("|<>;&$`") for w in words)
    if program == "asymvlm" and not shell:
        main, argv = asymvlm, words[1:]
    elif program == "python" and words[1:3] == ["-m", "asymvlm.synthetic"] and not shell:
        main, argv = synthetic, words[3:]
    else:
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr
    try:
        code = main(argv)
    except SystemExit as stop:  # --help
        code = stop.code
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_the_documented_commands_run(block, inputs, tmp_path, monkeypatch, capsys, one_thread):
    if block.skip:
        pytest.skip(block.skip)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # nothing is downloaded
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folder = tmp_path / "here"
    shutil.copytree(inputs, folder, symlinks=True)
    monkeypatch.chdir(folder)
    for command in block.commands:
        code, output = run(command, capsys)
        assert code == 0, f"{block}: `{command}` exited {code}:\n{output[-3000:]}"
