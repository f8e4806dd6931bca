"""Lean loading (:mod:`asymvlm.tables.read`, :func:`asymvlm.training.load_split`): a multi-part
split reads as a plain pyarrow reading gives it, problems are reported as reading whole files
reported them, the raw text inputs share the unit embeddings' memory, and reading allocates
about the split's float32 matrices once; and the synthetic generator's streamed windows are
its one-piece draw."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from asymvlm import tables
from asymvlm.splits import hold_out_images, load_split
from asymvlm.synthetic import COCO_LEVEL_PROBS, SyntheticWorld, WorldConfig
from asymvlm.synthetic.world import concat_splits
from asymvlm.tables import TableError, read_split

DIM, PRE = 8, 6


def _unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _fixed(matrix: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def _listed(matrix: np.ndarray) -> pa.Array:
    return pa.array([list(map(float, row)) for row in matrix], pa.list_(pa.float32()))


def _part(rng: np.random.Generator, k: int, n_img: int, n_cap: int = 3) -> tuple[dict, dict]:
    """Image and text columns of part ``k``; odd parts use variable-length lists."""
    as_list = _listed if k % 2 else _fixed
    ids = [f"img{k}-{i}" for i in range(n_img)]
    n = n_img * n_cap
    images = {
        "image_id": pa.array(ids, pa.string()),
        "embedding": as_list(_unit(rng, n_img)),
        "norm": pa.array(rng.uniform(5, 9, n_img).astype(np.float32)),
        "image_features_pre": as_list(rng.standard_normal((n_img, PRE)).astype(np.float32)),
        "label": pa.array(np.arange(n_img) % 4),
    }
    texts = {
        "caption_id": pa.array([f"cap{k}-{j}" for j in range(n)], pa.string()),
        "image_id": pa.array([ids[j // n_cap] for j in range(n)], pa.string()),
        "text": pa.array([f"caption {k} {j} — é" for j in range(n)], pa.string()),
        "embedding": as_list(_unit(rng, n)),
        "norm": pa.array(rng.uniform(5, 9, n).astype(np.float32)),
        "text_features_pre": as_list(rng.standard_normal((n, PRE)).astype(np.float32)),
        "level": pa.array(np.arange(n) % 4),
        "source": pa.array([f"s{j % 3}" for j in range(n)], pa.string()),
    }
    return images, texts


def _write(root: str, parts: list[tuple[dict, dict]], row_group_size: int | None = None) -> None:
    tables.write_manifest(root, {"dim": DIM, "model": "m", "pre_dim": {"image": PRE, "text": PRE}})
    for k, (images, texts) in enumerate(parts):
        for kind, cols in (("images", images), ("texts", texts)):
            folder = os.path.join(root, "s", kind)
            os.makedirs(folder, exist_ok=True)
            pq.write_table(
                pa.table(cols),
                os.path.join(folder, f"part-{k:05d}.parquet"),
                row_group_size=row_group_size,
            )


def _reference(root: str, kind: str) -> pa.Table:
    """The folder as one table, the straightforward way."""
    folder = os.path.join(root, "s", kind)
    files = sorted(f for f in os.listdir(folder) if f.endswith(".parquet"))
    return pa.concat_tables(
        [pq.read_table(os.path.join(folder, f)) for f in files], promote_options="permissive"
    )


def _matrix(table: pa.Table, name: str) -> np.ndarray:
    return np.array(table.column(name).to_pylist(), dtype=np.float32)


@pytest.fixture
def world(tmp_path: Path) -> str:
    rng = np.random.default_rng(0)
    parts = [_part(rng, k, n) for k, n in enumerate((5, 0, 7, 11))]  # part 1 is empty
    root = str(tmp_path / "t")
    _write(root, parts, row_group_size=4)  # several row groups per file
    return root


def test_a_multi_part_split_reads_as_plain_pyarrow_reads_it(world: str) -> None:
    s = read_split(world, "s")
    images, texts = _reference(world, "images"), _reference(world, "texts")
    for got, ref, name in (
        (s.image_embeddings, images, "embedding"),
        (s.text_embeddings, texts, "embedding"),
        (s.image_features_pre, images, "image_features_pre"),
        (s.text_features_pre, texts, "text_features_pre"),
    ):
        want = _matrix(ref, name)
        assert got.dtype == np.float32 and got.flags.writeable and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert s.image_ids == images.column("image_id").to_pylist()
    assert s.caption_ids == texts.column("caption_id").to_pylist()
    want_texts = texts.column("text").to_pylist()
    assert s.texts == want_texts
    index = {i: k for k, i in enumerate(s.image_ids)}
    want_index = [index[i] for i in texts.column("image_id").to_pylist()]
    np.testing.assert_array_equal(s.text_image_index, want_index)
    np.testing.assert_array_equal(s.text_norms, texts.column("norm").to_numpy())
    np.testing.assert_array_equal(s.image_norms, images.column("norm").to_numpy())
    np.testing.assert_array_equal(s.extra_text_columns["level"], texts.column("level").to_numpy())
    assert list(s.extra_text_columns["source"]) == texts.column("source").to_pylist()
    np.testing.assert_array_equal(s.extra_image_columns["label"], images.column("label"))
    sub = s.subset(np.array([2, 0]), np.flatnonzero(np.isin(s.text_image_index, [2, 0])))
    rows = np.flatnonzero(np.isin(s.text_image_index, [2, 0]))
    assert sub.texts == [want_texts[r] for r in rows]


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        # a row of another length in the first row group outranks a null row in a later one
        (
            "length_then_null",
            "texts/part-00002.parquet row 1 (caption_id 'cap2-1'): embedding "
            "has length 3, manifest dim is 8",
        ),
        # within one row group a null row outranks a row of another length before it
        (
            "null_after_length",
            "texts/part-00002.parquet row 3 (caption_id 'cap2-3'): embedding is null",
        ),
        # NaN/inf outranks a bad norm earlier in the same file
        (
            "norm_then_nan",
            "texts/part-00002.parquet row 9 (caption_id 'cap2-9'): embedding has NaN/inf",
        ),
        # a pre-projection problem waits for the checks of the norms
        (
            "pre_nan_and_norm",
            "texts/part-00000.parquet row 1 (caption_id 'cap0-1'): norm is "
            "np.float64(0.0), must be finite and > 0",
        ),
        (
            "pre_length",
            "images/part-00003.parquet row 2 (image_id 'img3-2'): "
            "image_features_pre has length 5, manifest pre_dim.image is 6",
        ),
    ],
)
def test_problems_are_reported_as_reading_whole_files_did(
    tmp_path: Path, fault: str, expected: str
) -> None:
    rng = np.random.default_rng(1)
    parts = [_part(rng, k, n) for k, n in enumerate((5, 0, 7, 11))]

    def set_row(cols: dict, name: str, row: int, value: list | None) -> None:
        values = cols[name].to_pylist()
        values[row] = value
        cols[name] = pa.array(values, pa.list_(pa.float32()))

    texts2 = parts[2][1]
    if fault == "length_then_null":
        set_row(texts2, "embedding", 1, [0.5] * 3)
        set_row(texts2, "embedding", 17, None)
    elif fault == "null_after_length":
        set_row(texts2, "embedding", 1, [0.5] * 3)
        set_row(texts2, "embedding", 3, None)
    elif fault == "norm_then_nan":
        set_row(texts2, "embedding", 3, [1.0] * DIM)
        set_row(texts2, "embedding", 9, [float("inf")] * DIM)
    elif fault == "pre_nan_and_norm":
        set_row(parts[3][0], "image_features_pre", 2, [float("nan")] * PRE)
        norms = parts[0][1]["norm"].to_pylist()
        norms[1] = 0.0
        parts[0][1]["norm"] = pa.array(norms, pa.float32())
    elif fault == "pre_length":
        set_row(parts[3][0], "image_features_pre", 2, [1.0] * 5)
    root = str(tmp_path / "t")
    _write(root, parts, row_group_size=8 if fault == "length_then_null" else None)
    with pytest.raises(TableError) as exc:
        read_split(root, "s")
    assert str(exc.value).endswith(expected), str(exc.value)


def test_raw_text_inputs_in_place_are_the_copying_ones(world: str) -> None:
    s = read_split(world, "s")
    unit = s.text_embeddings.copy()
    raw = s.text_inputs("raw")  # a new array
    assert not s.text_is_raw and np.shares_memory(s.text_inputs("unit"), s.text_matrix)
    in_place = s.text_inputs("raw", in_place=True)
    assert s.text_is_raw and in_place is s.text_matrix
    np.testing.assert_array_equal(in_place, raw)  # bit for bit
    assert s.text_inputs("raw") is in_place and s.text_inputs("raw", in_place=True) is in_place
    np.testing.assert_allclose(s.text_embeddings, unit, rtol=1e-6, atol=1e-7)  # derived
    np.testing.assert_allclose(s.text_inputs("unit"), unit, rtol=1e-6, atol=1e-7)
    sub = s.subset(np.array([1, 3]), np.flatnonzero(np.isin(s.text_image_index, [1, 3])))
    rows = np.flatnonzero(np.isin(s.text_image_index, [1, 3]))
    assert sub.text_is_raw
    np.testing.assert_array_equal(sub.text_inputs("raw"), raw[rows])


def test_load_split_tensors_are_the_split_arrays(world: str) -> None:
    data = load_split(world, "s")  # raw inputs, CPU
    split = data.split
    assert split.text_is_raw
    assert data.text_emb.data_ptr() == split.text_matrix.__array_interface__["data"][0]
    assert data.image_emb.data_ptr() == split.image_embeddings.__array_interface__["data"][0]
    assert data.image_pre.data_ptr() == split.image_features_pre.__array_interface__["data"][0]
    reference = read_split(world, "s")
    np.testing.assert_array_equal(data.text_emb.numpy(), reference.text_inputs("raw"))
    np.testing.assert_array_equal(data.image_emb.numpy(), reference.image_embeddings)
    assert data.text_to_image.dtype == torch.long
    unit = load_split(world, "s", adapter_input="unit")
    np.testing.assert_array_equal(unit.text_emb.numpy(), reference.text_embeddings)
    # the hold-out: each part's tensors are its split's arrays, with the reference's rows
    rest, held = hold_out_images(data, 0.3, seed=0)
    for part in (rest, held):
        ptr = part.split.text_matrix.__array_interface__["data"][0]
        assert part.text_emb.data_ptr() == ptr and part.split.text_is_raw
        rows = [reference.caption_ids.index(c) for c in part.split.caption_ids]
        np.testing.assert_array_equal(part.text_emb.numpy(), reference.text_inputs("raw")[rows])
        image_rows = [reference.image_ids.index(i) for i in part.split.image_ids]
        np.testing.assert_array_equal(
            part.image_pre.numpy(), reference.image_features_pre[image_rows]
        )


def test_reading_allocates_the_matrices_about_once(tmp_path: Path) -> None:
    """numpy's allocations (tracemalloc) while ``load_split`` reads a mid-size table and makes
    the raw text inputs: about the float32 matrices once (a copy of the captions' matrix, as the
    raw inputs or a concatenation, would add ~80 %), plus the id strings."""
    rng = np.random.default_rng(2)
    dim, n_img, n_cap = 128, 3000, 5
    root = str(tmp_path / "mid")
    tables.write_manifest(root, {"dim": dim, "model": "m"})
    for k in range(3):
        ids = [f"i{k}-{i}" for i in range(n_img)]
        tables.write_split(
            root,
            "s",
            part=f"part-{k:05d}",
            image_ids=ids,
            image_embeddings=_unit(rng, n_img, dim),
            caption_ids=[f"c{k}-{j}" for j in range(n_img * n_cap)],
            caption_image_ids=[ids[j // n_cap] for j in range(n_img * n_cap)],
            texts=[f"t{j}" for j in range(n_img * n_cap)],
            text_embeddings=_unit(rng, n_img * n_cap, dim),
            text_norms=rng.uniform(5, 9, n_img * n_cap),
        )
    matrices = 3 * (n_img + n_img * n_cap) * dim * 4  # 27.6 MB
    load_split(root, "s")  # imports and first-call caches
    tracemalloc.start()
    try:
        data = load_split(root, "s")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert data.text_emb.shape == (3 * n_img * n_cap, dim)
    assert peak < 1.15 * matrices + 8 * 2**20, (peak / 2**20, matrices / 2**20)


# -- the synthetic generator -------------------------------------------------------------------
@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"caption_words": True, "pre_dim": 40, "level_probs": COCO_LEVEL_PROBS},
        {"caption_words": True, "finetune_roots": 4, "domain_misalignment": 0.5},
    ],
)
def test_an_unblocked_split_streamed_in_windows_is_the_one_piece_draw(knobs: dict) -> None:
    """Windows of the one-piece draw (states recorded in one pass, then restored) hold its
    numbers bit for bit, whatever the window and part sizes (a short tail joins a window)."""
    n = 1300
    world = SyntheticWorld(WorldConfig(dim=32, splits={"train": n}, **knobs))
    whole = world.sample_split("train", n)
    for shard, window in ((10_000, 300), (128, 300), (1, 512), (700, 1024)):
        pieces = list(world.iter_pieces("train", n, shard, window_images=window))
        parts = [k for k, _ in pieces]
        assert parts == sorted(parts) and parts[-1] == (n - 1) // shard
        assert max(len(p["image_ids"]) for _, p in pieces) <= max(window, 2 * 256)
        got = concat_splits([piece for _, piece in pieces])
        for key, value in whole.items():
            if isinstance(value, dict):
                for name, column in value.items():
                    np.testing.assert_array_equal(got[key][name], column, err_msg=name)
            elif isinstance(value, np.ndarray):
                np.testing.assert_array_equal(got[key], value, err_msg=key)
            else:
                assert got[key] == value, key
