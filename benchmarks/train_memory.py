"""Peak memory of the synthetic generator and of ``asymvlm train``, ``evaluate`` and ``score`` on a
COCO-sized world.

Writes a world of MS-COCO 2017's size (``python -m asymvlm.synthetic --preset coco``: 118,287
training images with 5 captions each -- 591,435, COCO has 591,753 -- and 5,000 val and test
images, d = 512) into a temporary folder (or ``--root``), then runs, each in a fresh process
whose peak resident set size is read from the kernel (``os.wait4``'s ``ru_maxrss`` of a child
forked from a small launcher, so that it does not start at this process's size):

* ``import``: ``python -c "import asymvlm.cli, torch"``, the floor under every peak;
* ``generator``: that preset (drawn in blocks of 2048 images);
* ``generator_unblocked`` (unless ``--no-unblocked``): the default world at the same sizes and
  width (one stream per split), written to a second folder and deleted;
* ``train``: ``asymvlm train`` on the training split (``--method``, 1 epoch of
  ``--batch-size``, CPU), the command a user runs;
* ``evaluate``: ``asymvlm evaluate`` of that checkpoint on the test split (COCO's 5k);
* ``score``: ``asymvlm score`` of that checkpoint on the training split.

A command's table is the float32 bytes of the split it reads ((images + captions) x d x 4,
from the parquet footers). The targets (issue 42): the generator's peak <= 1 GiB, whatever the
world's size; train, evaluate and score <= 1.5 x their table + 1 GiB. ``--scale`` shrinks every
split (``--scale 0.25``: a quarter of COCO) to check that the generator's peak does not grow
with the world. One JSON object goes to stdout, progress to stderr::

    .venv/bin/python benchmarks/train_memory.py [--scale 1.0] [--root DIR] [--keep]

The commands run the code of the checkout this script is in, with this interpreter: to measure
another commit, copy the script into that checkout and run it with an interpreter whose
``sys.path`` finds that checkout's ``asymvlm`` first (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import pyarrow.parquet as pq
from _common import cpu_model, loadavg, logger  # noqa: E402

log = logger("train_memory")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: MS-COCO 2017: training images, val / test images (Karpathy-style 5k), CLIP ViT-B/32's width.
COCO_TRAIN, COCO_TEST, COCO_DIM = 118_287, 5_000, 512
GIB = 2**30
#: Runs ``python ARGS`` in a child of this small process and prints its exit code and peak RSS
#: (KiB): a child's ``ru_maxrss`` starts at the size of the process it was forked from.
LAUNCH = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def measure(args: list[str]) -> dict[str, Any]:
    """Run ``python ARGS`` from the repository root (its output to stderr) and return its peak
    RSS (bytes) and wall time; a failure raises."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log("$ python " + " ".join(args))
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        check=True,
    )
    seconds = time.perf_counter() - t0
    code, kib = map(int, done.stdout.split()[-2:])
    if code:
        raise subprocess.CalledProcessError(code, args)
    peak = kib * 1024
    log(f"  peak RSS {peak / GIB:.3f} GiB, {seconds:.1f} s")
    return {
        "peak_rss_bytes": peak,
        "peak_rss_gib": round(peak / GIB, 3),
        "seconds": round(seconds, 1),
    }


def split_float32_bytes(root: str, split: str, dim: int) -> dict[str, int]:
    """Rows of a split's images and captions (parquet footers) and their float32 bytes."""
    rows = {}
    for kind in ("images", "texts"):
        folder = os.path.join(root, split, kind)
        files = sorted(f for f in os.listdir(folder) if f.endswith(".parquet"))
        rows[kind] = sum(pq.read_metadata(os.path.join(folder, f)).num_rows for f in files)
    return {
        "images": rows["images"],
        "captions": rows["texts"],
        "float32_bytes": (rows["images"] + rows["texts"]) * dim * 4,
    }


def judged(run: dict[str, Any], bound: float, rule: str, table: dict | None = None) -> dict:
    """``run`` with its bound, whether it is met, and (with a table) the peak over the table."""
    out = dict(run)
    if table is not None:
        out["peak_over_table"] = round(run["peak_rss_bytes"] / table["float32_bytes"], 3)
    out["bound_gib"], out["rule"] = round(bound / GIB, 3), rule
    out["met"] = run["peak_rss_bytes"] <= bound
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="fraction of COCO's size")
    p.add_argument("--root", default=None, help="write the world here (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the world (default: delete it)")
    p.add_argument("--method", default="asymvlm-vmf")
    p.add_argument("--batch-size", type=int, default=None, help="default: asymvlm train's")
    p.add_argument("--no-unblocked", action="store_true", help="skip the generator without blocks")
    args = p.parse_args(argv)
    if not 0 < args.scale <= 1:
        p.error(f"--scale must be in (0, 1], got {args.scale}")
    train_images = max(1, round(COCO_TRAIN * args.scale))
    test_images = max(10, round(COCO_TEST * args.scale))  # 10 uncertainty bins of images
    work = tempfile.mkdtemp(prefix="train_memory-")
    root = args.root or os.path.join(work, "world")
    ckpt = os.path.join(work, "checkpoint")
    sizes = ["--train-images", str(train_images), "--test-images", str(test_images)]
    batch = [] if args.batch_size is None else ["--batch-size", str(args.batch_size)]
    on = ["--embeddings", root, "--device", "cpu", "--quiet"]
    load_before = loadavg()
    runs: dict[str, Any] = {}
    try:
        runs["import"] = measure(["-c", "import asymvlm.cli, torch"])
        log(f"writing the coco preset ({train_images} train images) to {root}")
        synthetic = ["-m", "asymvlm.synthetic", *sizes]
        runs["generator"] = measure([*synthetic, "--preset", "coco", "--output", root])
        if not args.no_unblocked:
            other = os.path.join(work, "unblocked")
            runs["generator_unblocked"] = measure(
                [*synthetic, "--dim", str(COCO_DIM), "--output", other]
            )
            shutil.rmtree(other, ignore_errors=True)
        cli = ["-m", "asymvlm.cli"]
        train = ["--split", "train", "--method", args.method, "--epochs", "1", *batch]
        runs["train"] = measure([*cli, "train", *on, *train, "--output", ckpt])
        scored = ["--checkpoint", ckpt, "--output"]
        evaluate = [*cli, "evaluate", *on, "--split", "test", *scored, f"{work}/metrics.json"]
        runs["evaluate"] = measure(evaluate)
        score = [*cli, "score", *on, "--split", "train", *scored, f"{work}/scores.parquet"]
        runs["score"] = measure(score)
        splits = {s: split_float32_bytes(root, s, COCO_DIM) for s in ("train", "test")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.root and not args.keep:
            shutil.rmtree(args.root, ignore_errors=True)
    load_after = loadavg()

    for key in ("generator", "generator_unblocked"):
        if key in runs:
            runs[key] = judged(runs[key], GIB, "peak <= 1 GiB")
    for key, split in (("train", "train"), ("evaluate", "test"), ("score", "train")):
        table = splits[split]
        bound = 1.5 * table["float32_bytes"] + GIB
        runs[key] = judged(runs[key], bound, f"peak <= 1.5 x {split} table + 1 GiB", table)
        runs[key]["split"] = split
    out = {
        "world": {"preset": "coco", "scale": args.scale, "dim": COCO_DIM},
        "tables": {
            split: {**rows, "float32_gib": round(rows["float32_bytes"] / GIB, 3)}
            for split, rows in splits.items()
        },
        **runs,
        "all_met": all(run.get("met", True) for run in runs.values()),
        "config": {
            "method": args.method,
            "epochs": 1,
            "batch_size": args.batch_size or "asymvlm train's default",
            "device": "cpu",
        },
        "loadavg_1min_before_after": [load_before, load_after],
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
