"""Fingerprints of written synthetic worlds, to check that worlds of the old knobs stay the same.

A fingerprint holds, per table of a world (its splits' ``images``/``texts`` folders and the
classification sets' ``images``/``prompts``): the SHA-256 of every integer and string column and
of ``manifest.json``, exactly; and for every float column, its sum, its sum of squares and 16
values at evenly spaced positions -- compared with a tolerance, because another BLAS may round a
matrix product differently in the last bit, while a change of any random stream changes them
entirely. ``tests/data/old_world_fingerprints.json`` was recorded by running the code of the
commit before generic captions and far negatives existed (``python -m tests.world_fingerprint``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa

from asymvlm import tables
from asymvlm.synthetic import (
    COCO_LEVEL_PROBS,
    ClassificationSpec,
    WorldConfig,
    write_classification_sets,
    write_world,
)

RECORDED = os.path.join(os.path.dirname(__file__), "data", "old_world_fingerprints.json")

#: Worlds of the knobs that existed before (keyword arguments of WorldConfig).
OLD_WORLDS: dict[str, dict[str, Any]] = {
    "defaults": dict(dim=16, splits={"train": 300, "val": 60, "test": 60}, captions_per_image=3),
    # the demo preset as it was, at a smaller size
    "old-demo": dict(
        dim=32,
        captions_per_image=4,
        splits={"train": 300, "val": 60, "test": 60},
        block_images=128,
        caption_words=True,
        finetune_roots=4,
        domain_misalignment=0.5,
        level_probs=COCO_LEVEL_PROBS,
    ),
    "pre-projection": dict(
        dim=16,
        splits={"train": 200, "test": 40},
        captions_per_image=2,
        pre_dim=24,
        caption_words=True,
        level_probs=COCO_LEVEL_PROBS,
        misalignment=0.3,
        seed=7,
    ),
}
CLASS_IMAGES = 100


def _column(col: pa.ChunkedArray) -> dict[str, Any]:
    if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
        values = np.asarray(tables.column_matrix(col), dtype=np.float64)
    else:
        values = np.asarray(col.to_pylist())
    if values.dtype.kind == "f":
        flat = values.reshape(-1)
        picks = np.linspace(0, len(flat) - 1, 16).round().astype(int) if len(flat) else []
        return {
            "sum": float(flat.sum()),
            "sumsq": float((flat**2).sum()),
            "values": [float(flat[i]) for i in picks],
        }
    text = "\x1f".join(map(str, values.tolist()))
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "n": int(len(values))}


def fingerprint_root(root: str) -> dict[str, Any]:
    """One table root's fingerprint (every split and folder under it)."""
    with open(os.path.join(root, "manifest.json"), "rb") as fh:
        out: dict[str, Any] = {"manifest": hashlib.sha256(fh.read()).hexdigest()}
    for split in sorted(tables.list_splits(root)):
        for kind in ("images", "texts", "prompts"):
            table = tables.read_parts(root, split, kind)
            if table is None:
                continue
            out[f"{split}/{kind}"] = {
                name: _column(table.column(name)) for name in table.column_names
            }
    return out


def fingerprint_world(name: str, folder: str) -> dict[str, Any]:
    """Write world ``name`` of :data:`OLD_WORLDS` (and its classification sets) under ``folder``
    and fingerprint every table root."""
    cfg = WorldConfig(**OLD_WORLDS[name])
    root = os.path.join(folder, name)
    write_world(root, cfg)
    spec = ClassificationSpec(positives=CLASS_IMAGES, negatives=CLASS_IMAGES, zeroshot=CLASS_IMAGES)
    roots = {"world": root, **write_classification_sets(root, cfg, spec)}
    return {role: fingerprint_root(where) for role, where in sorted(roots.items())}


def compare(got: Any, want: Any, where: str = "") -> list[str]:
    """Differences between two fingerprints (floats within 1e-6 relative, the rest exact)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [
                f"{where}: keys {sorted(got) if isinstance(got, dict) else got} != {sorted(want)}"
            ]
        return [d for k in want for d in compare(got[k], want[k], f"{where}/{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {got} != {want}"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in compare(g, w, f"{where}[{i}]")
        ]
    if isinstance(want, float):
        ok = isinstance(got, float) and abs(got - want) <= 1e-6 * max(1.0, abs(want))
        return [] if ok else [f"{where}: {got} != {want}"]
    return [] if got == want else [f"{where}: {got} != {want}"]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        prints = {name: fingerprint_world(name, tmp) for name in OLD_WORLDS}
    json.dump(prints, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
