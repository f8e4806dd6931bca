"""Fingerprints of written synthetic worlds: the guard that the world's random streams stay those
of the recorded code (``tests/data/old_world_fingerprints.json``, ``python -m
tests.world_fingerprint``). Per table: SHA-256 of ``manifest.json`` and of every integer and
string column; per float column its sum, sum of squares and 16 evenly spaced values, compared
within 1e-6 (another BLAS may round the last bit; another stream changes them entirely)."""

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
_OLD_DEMO = dict(block_images=128, caption_words=True, finetune_roots=4, domain_misalignment=0.5)
#: The recorded worlds (keyword arguments of WorldConfig).
OLD_WORLDS: dict[str, dict[str, Any]] = {
    "defaults": dict(dim=16, splits={"train": 300, "val": 60, "test": 60}, captions_per_image=3),
    "old-demo": dict(
        dim=32, captions_per_image=4, splits={"train": 300, "val": 60, "test": 60}, **_OLD_DEMO
    )
    | {"level_probs": COCO_LEVEL_PROBS},
    "pre-projection": dict(
        dim=16, splits={"train": 200, "test": 40}, captions_per_image=2, pre_dim=24, seed=7
    )
    | {"caption_words": True, "level_probs": COCO_LEVEL_PROBS, "misalignment": 0.3},
}


def _column(col: pa.ChunkedArray) -> dict[str, Any]:
    if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
        values = np.asarray(tables.column_matrix(col), dtype=np.float64)
    else:
        values = np.asarray(col.to_pylist())
    if values.dtype.kind != "f":
        text = "\x1f".join(map(str, values.tolist()))
        return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "n": int(len(values))}
    flat = values.reshape(-1)
    picks = np.linspace(0, len(flat) - 1, 16).round().astype(int) if len(flat) else []
    values = [float(flat[i]) for i in picks]
    return {"sum": float(flat.sum()), "sumsq": float((flat**2).sum()), "values": values}


def fingerprint_world(name: str, folder: str) -> dict[str, Any]:
    """Write world ``name`` and its classification sets; the fingerprint of every table root."""
    cfg = WorldConfig(**OLD_WORLDS[name])
    root = write_world(os.path.join(folder, name), cfg)
    spec = ClassificationSpec(positives=100, negatives=100, zeroshot=100)
    out = {}
    for role, where in {"world": root, **write_classification_sets(root, cfg, spec)}.items():
        with open(os.path.join(where, "manifest.json"), "rb") as fh:
            out[role] = {"manifest": hashlib.sha256(fh.read()).hexdigest()}
        for split in tables.list_splits(where):
            for kind in ("images", "texts", "prompts"):
                table = tables.read_parts(where, split, kind)
                if table is not None:
                    columns = {c: _column(table.column(c)) for c in table.column_names}
                    out[role][f"{split}/{kind}"] = columns
    return out


def flatten(tree: Any, at: str = "") -> dict[str, Any]:
    if isinstance(tree, dict | list):
        items = tree.items() if isinstance(tree, dict) else enumerate(tree)
        return {k: v for key, sub in items for k, v in flatten(sub, f"{at}/{key}").items()}
    return {at: tree}


def compare(got: Any, want: Any) -> list[str]:
    """Where two fingerprints differ (floats within 1e-6 relative, the rest exactly)."""
    got, want = flatten(got), flatten(want)

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return abs(a - b) <= 1e-6 * max(1.0, abs(b))
        return a == b

    keys = sorted(set(got) | set(want))
    return [
        f"{k}: {got.get(k)} != {want.get(k)}" for k in keys if not same(got.get(k), want.get(k))
    ]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        prints = {name: fingerprint_world(name, tmp) for name in OLD_WORLDS}
    json.dump(prints, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
