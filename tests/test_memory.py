"""Peak memory of the commands, each a subprocess whose peak resident set size is read from the
kernel (``os.wait4``'s ``ru_maxrss``) against the import floor measured beside it: the synthetic
generator streams (its peak does not grow with the world), and training, evaluation and scoring
hold a table about once (benchmarks/train_memory.py measures the same at COCO's size)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO, captioned_images, write_table

GIB = 2**30
DIM = 512
#: A world of 12,000 training images drawn in one stream (0.15 GiB of float32 tables): drawn
#: in one piece, its writer held 0.75 GiB beyond the import floor.
WORLD_IMAGES = 12_000
#: The table trained, evaluated and scored: 200 images with 750 captions each (0.29 GiB of
#: float32), few images so that evaluating it ranks only 3e7 pairs.
IMAGES, CAPTIONS_PER_IMAGE = 200, 750
#: What a command may hold beyond the import floor and its table: the generator a few windows
#: of its draw; training, evaluation and scoring 1.5 x the table plus a batch, an encoded chunk,
#: the ranking's budget and the allocators' slack.
GENERATOR_BYTES = 0.5 * GIB
TABLE_FACTOR, SLACK_BYTES = 1.5, 0.3 * GIB
#: The evaluation's ranking budget (``--memory-budget``), within SLACK_BYTES.
RANK_BUDGET = 64 * 2**20


#: Runs ``python ARGS`` in a child of this small process and prints its exit code and peak RSS
#: (KiB): a child's ``ru_maxrss`` starts at what it was forked from (the pytest process here).
_LAUNCH = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def _peak(*args: str) -> int:
    """Peak RSS in bytes of ``python ARGS`` run from the repository root (it must succeed)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the tiny adapter trains fastest on one
    run = [sys.executable, "-c", _LAUNCH, *args]
    done = subprocess.run(run, cwd=REPO, env=env, capture_output=True, text=True)
    code, kib = map(int, done.stdout.split()[-2:])
    assert code == 0, done.stderr[-2000:]
    return kib * 1024


def _write_table(root: str) -> int:
    """Captions scattered around their image, with raw norms; returns the float32 bytes."""
    rng, n_captions = np.random.default_rng(0), IMAGES * CAPTIONS_PER_IMAGE
    captioned = captioned_images(rng, IMAGES, CAPTIONS_PER_IMAGE, DIM, 1 / 16, np.float32)
    write_table(root, *captioned, norms=rng.uniform(6.0, 10.0, n_captions).astype(np.float32))
    return (IMAGES + n_captions) * DIM * 4


@pytest.fixture(scope="module")
def peaks(tmp_path_factory) -> dict[str, int]:
    """The peak of each command, of ``import asymvlm.cli, torch`` (the floor), and the table's
    float32 bytes."""
    tmp = tmp_path_factory.mktemp("memory")
    world, root, ckpt = (str(tmp / name) for name in ("world", "table", "ckpt"))
    out = {"floor": _peak("-c", "import asymvlm.cli, torch"), "table": _write_table(root)}
    sizes = f"--dim {DIM} --train-images {WORLD_IMAGES} --test-images 10 --output {world}"
    out["generator"] = _peak("-m", "asymvlm.synthetic", *sizes.split())
    on = f"--embeddings {root} --split test --device cpu --quiet"
    adapter = "--method asymvlm-vmf --hidden-dim 64 --depth 1 --batch-size 256 --epochs 1"
    for command, flags in (
        ("train", f"{adapter} --output {ckpt}"),
        ("evaluate", f"--checkpoint {ckpt} --memory-budget {RANK_BUDGET} --output {tmp}/m.json"),
        ("score", f"--checkpoint {ckpt} --output {tmp}/s.parquet"),
    ):
        # the lower of two runs: one command's peak varies by up to 0.05 GiB from run to run
        argv = ["-m", "asymvlm.cli", command, *on.split(), *flags.split(), "--overwrite"]
        out[command] = min(_peak(*argv), _peak(*argv))
    return out


def test_the_generator_does_not_hold_the_world(peaks) -> None:
    above = peaks["generator"] - peaks["floor"]
    assert above <= GENERATOR_BYTES, f"{above / GIB:.2f} GiB above the import floor"


@pytest.mark.parametrize("command", ["train", "evaluate", "score"])
def test_a_command_holds_its_table_about_once(peaks, command) -> None:
    """At most 1.5 x the table (0.29 GiB) plus 0.3 GiB beyond the import floor (read whole
    into Arrow, copied, checked and encoded in full-size temporaries: 1.8 to 2.4 GiB)."""
    above, bound = peaks[command] - peaks["floor"], TABLE_FACTOR * peaks["table"] + SLACK_BYTES
    assert above <= bound, f"{above / GIB:.2f} GiB above the floor, bound {bound / GIB:.2f} GiB"
