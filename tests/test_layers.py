"""The layers hold: the science package imports without Ray, and the import contracts pass."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Imports every module of asymvlm/ (their __main__ scripts aside) in a fresh interpreter in which
# `ray` and `pipelines` cannot be imported, then says which modules it imported.
_IMPORT_ALL = """
import importlib, json, pkgutil, sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "pipelines"):
            raise ImportError(f"{name} is blocked in this test")

sys.meta_path.insert(0, Blocked())
import asymvlm
names = [m.name for m in pkgutil.walk_packages(asymvlm.__path__, "asymvlm.")
         if not m.name.endswith(".__main__")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "ray": sorted(m for m in sys.modules
                                                    if m.split(".")[0] in ("ray", "pipelines"))}))
"""


@pytest.mark.slow
def test_every_science_module_imports_with_ray_unimportable() -> None:
    import json

    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ray"] == []
    imported = set(out["imported"])
    # every package and the CLI (whose `embed` imports the Ray layer only when it runs)
    assert {
        "asymvlm.cli",
        "asymvlm.cli.embed",
        "asymvlm.protocol",
        "asymvlm.training",
        "asymvlm.evaluation.registry",
        "asymvlm.scoring.models",
        "asymvlm.report",
        "asymvlm.checkpoints",
        "asymvlm.config",
        "asymvlm.splits",
    } <= imported


def test_the_blocker_blocks() -> None:
    """The check above could not pass by accident: the same blocker stops an import of Ray."""
    code = _IMPORT_ALL.split("import asymvlm")[0] + "import pipelines.session\n"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "is blocked in this test" in done.stderr


def test_the_embed_subcommand_reaches_ray_only_when_it_runs() -> None:
    """`asymvlm --help` (the whole parser, every sub-command registered) imports no Ray."""
    code = _IMPORT_ALL.split("import asymvlm")[0] + (
        "from asymvlm.cli import build_parser\n"
        "build_parser().format_help()\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'ray']\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
