"""Peak memory of ``asymvlm train`` and of the synthetic generator on a COCO-sized world.

Writes a world of MS-COCO 2017's size (``python -m asymvlm.synthetic --preset coco``: 118,287
training images with 5 captions each -- 591,435, COCO has 591,753 -- and 5,000 val and test
images, d = 512) into a temporary folder (or ``--root``), then runs, each in a fresh process
whose peak resident set size is read from the kernel (``os.wait4``'s ``ru_maxrss``):

* ``generator``: that preset (drawn in blocks of 2048 images);
* ``generator_unblocked`` (unless ``--no-unblocked``): the same world without blocks (one
  stream per split, the draw older worlds use), written to a second folder and deleted;
* ``train``: ``asymvlm train`` on the training split (``--method``, 1 epoch of
  ``--batch-size``, CPU), the command a user runs;
* ``import``: ``python -c "import asymvlm.cli, torch"``, the floor under every peak.

The table's float32 bytes are those of the training split's embedding matrices
((images + captions) x d x 4, from the parquet footers). The target of the issue "Sweeps at the
speed of the math" is ``train`` peak <= 1.5 x table bytes + 1 GiB. ``--scale`` shrinks every
split (``--scale 0.25``: a quarter of COCO) to check that the generator's peak does not grow with
the world. One JSON object goes to stdout, progress to stderr::

    .venv/bin/python benchmarks/train_memory.py [--scale 1.0] [--root DIR] [--keep]
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

from asymvlm.training import TrainConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu_model, loadavg, logger  # noqa: E402

log = logger("train_memory")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: MS-COCO 2017: training images, val / test images (Karpathy-style 5k), CLIP ViT-B/32's width.
COCO_TRAIN, COCO_TEST, COCO_DIM = 118_287, 5_000, 512
GIB = 2**30


def measure(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd`` from the repository root (its output to stderr) and return its peak RSS
    (bytes, ``ru_maxrss`` of that one child) and wall time; a failure raises."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log("$ " + " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sys.stderr, stderr=sys.stderr)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    peak = int(usage.ru_maxrss) * 1024  # KiB on Linux
    log(f"  peak RSS {peak / GIB:.2f} GiB, {seconds:.1f} s")
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
    test_images = max(1, round(COCO_TEST * args.scale))
    py = sys.executable
    work = tempfile.mkdtemp(prefix="train_memory-")
    root = args.root or os.path.join(work, "world")
    sizes = ["--train-images", str(train_images), "--test-images", str(test_images)]
    batch = [] if args.batch_size is None else ["--batch-size", str(args.batch_size)]
    load_before = loadavg()
    try:
        result: dict[str, Any] = {"import": measure([py, "-c", "import asymvlm.cli, torch"])}
        log(f"writing the coco preset ({train_images} train images) to {root}")
        result["generator"] = measure(
            [py, "-m", "asymvlm.synthetic", "--preset", "coco", *sizes, "--output", root]
        )
        table = split_float32_bytes(root, "train", COCO_DIM)
        if not args.no_unblocked:
            other = os.path.join(work, "unblocked")
            result["generator_unblocked"] = measure(
                [
                    py,
                    "-m",
                    "asymvlm.synthetic",
                    "--dim",
                    str(COCO_DIM),
                    "--caption-words",
                    *sizes,
                    "--output",
                    other,
                ]
            )
            shutil.rmtree(other, ignore_errors=True)
        result["train"] = measure(
            [
                py,
                "-m",
                "asymvlm.cli",
                "train",
                "--embeddings",
                root,
                "--split",
                "train",
                "--method",
                args.method,
                "--epochs",
                "1",
                *batch,
                "--device",
                "cpu",
                "--quiet",
                "--output",
                os.path.join(work, "checkpoint"),
            ]
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.root and not args.keep:
            shutil.rmtree(args.root, ignore_errors=True)
    load_after = loadavg()

    nbytes = table["float32_bytes"]
    bound = 1.5 * nbytes + GIB
    for key in ("generator", "generator_unblocked", "train"):
        if key in result:
            result[key]["peak_over_table"] = round(result[key]["peak_rss_bytes"] / nbytes, 3)
    train_peak = result["train"]["peak_rss_bytes"]
    out = {
        "world": {
            "preset": "coco",
            "scale": args.scale,
            "dim": COCO_DIM,
            "train_images": table["images"],
            "train_captions": table["captions"],
            "val_test_images": test_images,
        },
        "table_float32_bytes": nbytes,
        "table_float32_gib": round(nbytes / GIB, 3),
        **result,
        "train_peak_over_table": round(train_peak / nbytes, 3),
        "target": {
            "bound_bytes": int(bound),
            "bound_gib": round(bound / GIB, 3),
            "rule": "train peak <= 1.5 x table float32 bytes + 1 GiB",
            "met": train_peak <= bound,
        },
        "config": {
            "method": args.method,
            "epochs": 1,
            "batch_size": args.batch_size or TrainConfig().batch_size,
            "device": "cpu",
        },
        "loadavg_1min_before_after": [load_before, load_after],
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
