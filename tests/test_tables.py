"""The embedding-table contract (asymvlm.tables): round trips, every refusal naming its file, row
and id, parts that must agree, atomic writes, lean loading (one float32 copy, raw inputs in
place) and the projection file."""

from __future__ import annotations

import json
import os
import re
import shutil
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from asymvlm import storage, tables
from asymvlm.splits import hold_out_images, load_split
from asymvlm.tables import (
    Manifest,
    TableError,
    list_splits,
    read_manifest,
    read_split,
    write_manifest,
    write_split,
)

DIM = 8
PRE = {"image": 6, "text": 5}


def _unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _data(seed: int = 0, n_img: int = 5, n_txt: int = 12, pre: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    image_ids = [f"img{i}" for i in range(n_img)]
    d = dict(
        image_ids=image_ids,
        image_embeddings=_unit(rng, n_img),
        caption_ids=[f"c{j}" for j in range(n_txt)],
        caption_image_ids=[image_ids[(3 * j + 1) % n_img] for j in range(n_txt)],
        texts=[f"a photo number {j}" for j in range(n_txt)],
        text_embeddings=_unit(rng, n_txt),
        text_norms=rng.uniform(5.0, 15.0, n_txt).astype(np.float32),
        extra_text_columns={"level": np.arange(n_txt, dtype=np.int64) % 3},
    )
    if pre:
        d.update(
            image_norms=rng.uniform(5.0, 15.0, n_img).astype(np.float32),
            image_features_pre=rng.standard_normal((n_img, PRE["image"])).astype(np.float32),
            text_features_pre=rng.standard_normal((n_txt, PRE["text"])).astype(np.float32),
        )
    return d


@pytest.fixture
def root(tmp_path: Path) -> str:
    r = str(tmp_path / "emb")
    write_manifest(r, {"dim": DIM, "model": "ViT-B-32", "source": "unit-test", "pre_dim": PRE})
    return r


def _file(root: str, kind: str, k: int = 0, split: str = "test") -> str:
    return os.path.join(root, split, kind, f"part-{k:05d}.parquet")


def _listed(matrix) -> pa.Array:
    return pa.array([list(map(float, r)) for r in np.asarray(matrix)], pa.list_(pa.float32()))


def _fixed(matrix: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def _rewrite(path: str, **columns) -> None:
    """Replace (or add, or with None drop) columns of a parquet file, past the writer's checks."""
    table = pq.read_table(path)
    for name, values in columns.items():
        if name in table.column_names:
            table = table.drop_columns([name])
        if values is not None:
            table = table.append_column(name, values)
    pq.write_table(table, path)


def test_round_trip(root: str) -> None:
    d = _data(pre=True)
    write_split(root, "test", **d)
    write_split(root, "train", **_data(seed=1, pre=True))
    s = read_split(root, "test")
    assert (s.image_ids, s.caption_ids, s.texts) == (d["image_ids"], d["caption_ids"], d["texts"])
    for got, key in (
        (s.image_embeddings, "image_embeddings"),
        (s.text_embeddings, "text_embeddings"),
        (s.text_norms, "text_norms"),
        (s.image_norms, "image_norms"),
        (s.image_features_pre, "image_features_pre"),
        (s.text_features_pre, "text_features_pre"),
    ):
        assert got.dtype == np.float32 and got.flags.writeable, key
        np.testing.assert_array_equal(got, d[key], err_msg=key)
    assert [s.image_ids[i] for i in s.text_image_index] == d["caption_image_ids"]
    assert s.text_image_index.dtype == np.int64
    np.testing.assert_array_equal(s.extra_text_columns["level"], np.arange(12) % 3)
    assert s.extra_image_columns == {}  # norm and the features are contract columns
    assert s.manifest == Manifest(DIM, "ViT-B-32", {"source": "unit-test", "pre_dim": PRE})
    assert list_splits(root) == ["test", "train"]
    field = pq.read_schema(_file(root, "images")).field("image_features_pre")
    assert field.type == pa.list_(pa.float32(), PRE["image"])  # fixed-size lists
    rows = np.flatnonzero(np.isin(s.text_image_index, [3, 1]))
    sub = s.subset(np.array([3, 1]), rows)
    np.testing.assert_array_equal(sub.image_features_pre, d["image_features_pre"][[3, 1]])
    np.testing.assert_array_equal(sub.text_features_pre, d["text_features_pre"][rows])
    assert sub.texts == [d["texts"][r] for r in rows]
    plain = str(Path(root).parent / "plain")  # absent optional columns read as None
    write_manifest(plain, {"dim": DIM, "model": "m"})
    write_split(plain, "test", **_data())
    s = read_split(plain, "test")
    assert s.image_norms is s.image_features_pre is s.text_features_pre is None


def test_manifest_errors_and_listing(tmp_path: Path) -> None:
    r = str(tmp_path / "m")
    with pytest.raises(TableError, match="manifest not found"):
        read_manifest(r)
    assert list_splits(r) == []
    os.makedirs(os.path.join(r, "junk"))  # a folder that is not a split
    assert list_splits(r) == []
    path = os.path.join(r, "manifest.json")
    for bad, msg in [
        ({"model": "x"}, "'dim'"),
        ({"dim": 4}, "'model'"),
        ({"dim": "4", "model": "x"}, "positive int"),
        ({"dim": 2, "model": "m", "pre_dim": [3]}, "'pre_dim' must map"),
    ]:
        Path(path).write_text(json.dumps(bad))
        with pytest.raises(TableError, match=msg) as exc:
            read_manifest(r)
        assert "manifest.json" in str(exc.value)
    Path(path).write_text("{not json")
    with pytest.raises(TableError, match="not valid JSON"):
        read_manifest(r)
    write_manifest(r, Manifest(dim=3, model="m", extra={"k": [1, 2]}))
    assert read_manifest(r) == Manifest(3, "m", {"k": [1, 2]})


def test_file_uri(tmp_path: Path) -> None:
    local = tmp_path / "uri"
    uri = local.as_uri()
    assert storage.filesystem(uri)[1] == str(local)
    write_manifest(uri, {"dim": DIM, "model": "m"})
    write_split(uri, "val", **_data())
    assert list_splits(uri) == ["val"]
    assert read_split(uri, "val").caption_ids == read_split(str(local), "val").caption_ids


def test_text_inputs_raw_unit_and_in_place(root: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    s = read_split(root, "test")
    raw = s.text_inputs()  # a new array
    np.testing.assert_allclose(raw, d["text_embeddings"] * d["text_norms"][:, None], rtol=1e-6)
    assert not s.text_is_raw and np.shares_memory(s.text_inputs("unit"), s.text_matrix)
    in_place = s.text_inputs("raw", in_place=True)
    assert s.text_is_raw and in_place is s.text_matrix and s.text_inputs("raw") is in_place
    np.testing.assert_array_equal(in_place, raw)  # bit for bit
    np.testing.assert_allclose(s.text_embeddings, d["text_embeddings"], rtol=1e-6, atol=1e-7)
    rows = np.flatnonzero(np.isin(s.text_image_index, [1, 3]))
    sub = s.subset(np.array([1, 3]), rows)
    assert sub.text_is_raw
    np.testing.assert_array_equal(sub.text_inputs("raw"), raw[rows])
    with pytest.raises(ValueError, match="adapter_input"):
        s.text_inputs("normalised")
    write_split(root, "test", **{**d, "text_norms": None})
    s = read_split(root, "test")
    with pytest.warns(UserWarning, match="`norm` column"):
        np.testing.assert_array_equal(s.text_inputs("raw"), s.text_inputs("unit"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.text_inputs("raw")  # warned once


def _bad_utf8(values: list[str], row: int) -> pa.Array:
    raw = [v.encode() for v in values]
    raw[row] = b"caf\xe9 au lait"  # latin-1, not UTF-8; parquet does not check it
    return pa.array(raw, pa.binary()).view(pa.string())


def _rows_with(matrix, row: int, value) -> pa.Array:
    rows = list(matrix) if isinstance(matrix, list) else np.asarray(matrix).tolist()
    rows[row] = value
    return pa.array(rows, pa.list_(pa.float32()))


def _scaled(matrix, row: int, factor: float) -> np.ndarray:
    out = np.array(matrix)
    out[row] *= factor
    return out


def _with(values, row: int, value) -> list:
    out = list(values)
    out[row] = value
    return out


D = _data(pre=True)
_NORMS = {"text": D["text_norms"], "image": D["image_norms"]}
# case: (folder, columns to rewrite, where in the file, what the message says)
CORRUPTIONS = {
    "short row": (
        "images",
        {"embedding": _rows_with(D["image_embeddings"], 3, [0.5] * 7)},
        "row 3 (image_id 'img3')",
        "embedding has length 7, manifest dim is 8",
    ),
    "wrong fixed width": (
        "texts",
        {"embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(108, np.float32)), 9)},
        "row 0 (caption_id 'c0')",
        "embedding has length 9, manifest dim is 8",
    ),
    "nan": (
        "texts",
        {"embedding": _listed(_scaled(D["text_embeddings"], 7, np.nan))},
        "row 7 (caption_id 'c7')",
        "embedding has NaN/inf",
    ),
    "not unit": (
        "images",
        {"embedding": _listed(_scaled(D["image_embeddings"], 4, 2.5))},
        "row 4 (image_id 'img4')",
        "embedding norm is 2.5",
    ),
    "null id": (
        "images",
        {"image_id": pa.array(_with(D["image_ids"], 2, None), pa.string())},
        "row 2 (image_id None)",
        "image_id is null",
    ),
    "duplicate id": (
        "images",
        {"image_id": pa.array(_with(D["image_ids"], 3, "img1"))},
        "row 3 (image_id 'img1')",
        "duplicate image_id, first seen in",
    ),
    "unknown image": (
        "texts",
        {"image_id": pa.array(_with(D["caption_image_ids"], 5, "ghost"))},
        "row 5 (caption_id 'c5')",
        "unknown image_id 'ghost'",
    ),
    "zero norm": (
        "texts",
        {"norm": pa.array(_with(_NORMS["text"], 6, 0.0), pa.float32())},
        "row 6 (caption_id 'c6')",
        "norm is np.float64(0.0), must be finite and > 0",
    ),
    "norm outlier": (
        "texts",
        {"norm": pa.array(_with(_NORMS["text"], 7, 1e30), pa.float32())},
        "row 7 (caption_id 'c7')",
        "norm is 1e+30, outside [",
    ),
    "image norm outlier": (
        "images",
        {"norm": pa.array(_with(_NORMS["image"], 3, 1e9), pa.float32())},
        "row 3 (image_id 'img3')",
        "the split's median norm",
    ),
    "invalid utf8 text": (
        "texts",
        {"text": _bad_utf8(D["texts"], 4)},
        "row 4 (caption_id 'c4')",
        "column 'text' is not valid UTF-8 (invalid continuation byte at byte 3",
    ),
    "invalid utf8 id": (
        "texts",
        {"caption_id": _bad_utf8(D["caption_ids"], 4)},
        "row 4",
        "column 'caption_id' is not valid UTF-8",
    ),
    "invalid utf8 extra": (
        "texts",
        {"clean": _bad_utf8(D["texts"], 4)},
        "row 4 (caption_id 'c4')",
        "column 'clean' is not valid UTF-8",
    ),
    "pre length": (
        "texts",
        {"text_features_pre": _rows_with(D["text_features_pre"], 4, [1.0] * 4)},
        "row 4 (caption_id 'c4')",
        "text_features_pre has length 4, manifest pre_dim.text is 5",
    ),
    "pre nan": (
        "images",
        {"image_features_pre": _listed(_scaled(D["image_features_pre"], 2, np.nan))},
        "row 2 (image_id 'img2')",
        "image_features_pre has NaN/inf",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupt_file_is_refused_naming_file_row_and_id(root: str, case: str) -> None:
    kind, columns, where, what = CORRUPTIONS[case]
    write_split(root, "test", **D)
    read_split(root, "test")  # the clean split passes
    path = _file(root, kind)
    _rewrite(path, **columns)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert str(exc.value).startswith(f"{path} {where}: "), str(exc.value)
    assert what in str(exc.value)


def test_validate_false_and_a_loose_tolerance_accept_what_validation_refuses(root: str) -> None:
    write_split(root, "test", **D)
    _rewrite(_file(root, "images"), embedding=_listed(_scaled(D["image_embeddings"], 4, 2.5)))
    assert read_split(root, "test", norm_atol=2.0).n_images == 5
    _rewrite(_file(root, "texts"), norm=pa.array(_with(D["text_norms"], 7, 1e30), pa.float32()))
    assert read_split(root, "test", validate=False).text_norms[7] == np.float32(1e30)


def test_missing_files_columns_and_rows_are_named(root: str) -> None:
    with pytest.raises(TableError, match=f"{root}/nope/images: no parquet files"):
        read_split(root, "nope")
    write_split(root, "test", **D)
    _rewrite(_file(root, "texts"), text=None)
    with pytest.raises(TableError, match=r"texts/part-00000.parquet: missing required .*'text'"):
        read_split(root, "test")
    write_split(root, "empty", **_data(n_img=5, n_txt=0))
    with pytest.raises(TableError) as exc:
        read_split(root, "empty")
    assert str(exc.value) == f"{root}/empty/texts: no rows (1 parquet file(s), all empty)"


def test_the_writer_checks_its_arguments(root: str) -> None:
    d = _data(pre=True)
    for change, match in [
        ({"text_embeddings": np.ones((12, 4), np.float32)}, "dim"),
        ({"caption_ids": d["caption_ids"][:-1]}, "caption_ids"),
        ({"image_embeddings": _scaled(d["image_embeddings"], 1, np.nan)}, "row 1"),
        ({"text_norms": _with(d["text_norms"], 6, -1.0)}, "text_norms row 6"),
        ({"image_norms": _with(d["image_norms"], 3, np.inf)}, "image_norms row 3"),
        ({"text_features_pre": np.zeros((12, 6))}, "width 6, manifest pre_dim.text is 5"),
        (
            {"image_embeddings": np.eye(5, 4), "text_embeddings": np.eye(12, 4)},
            "embedding dim 4 != manifest dim 8",
        ),
    ]:
        with pytest.raises(ValueError, match=match):
            write_split(root, "test", **{**d, **change})
    assert list_splits(root) == []
    bare = str(Path(root).parent / "bare")
    write_manifest(bare, {"dim": DIM, "model": "m"})
    with pytest.raises(ValueError, match="no pre_dim.image"):
        write_split(bare, "test", **d)
    write_split(root, "test", **d)
    shutil.copytree(os.path.join(root, "test"), os.path.join(bare, "test"))
    with pytest.raises(TableError, match="present but the manifest has no pre_dim.image"):
        read_split(str(Path(root).parent / "bare"), "test")


# -- several parts ----------------------------------------------------------------------------
def _part(rng: np.random.Generator, k: int, n_img: int, n_cap: int = 3) -> tuple[dict, dict]:
    """Image and text columns of part ``k``; odd parts use variable-length lists."""
    as_list = _listed if k % 2 else _fixed
    ids = [f"img{k}-{i}" for i in range(n_img)]
    n = n_img * n_cap
    images = {
        "image_id": pa.array(ids, pa.string()),
        "embedding": as_list(_unit(rng, n_img)),
        "norm": pa.array(rng.uniform(5, 9, n_img).astype(np.float32)),
        "image_features_pre": as_list(rng.standard_normal((n_img, 6)).astype(np.float32)),
        "label": pa.array(np.arange(n_img) % 4),
    }
    texts = {
        "caption_id": pa.array([f"cap{k}-{j}" for j in range(n)], pa.string()),
        "image_id": pa.array([ids[j // n_cap] for j in range(n)], pa.string()),
        "text": pa.array([f"caption {k} {j} — é" for j in range(n)], pa.string()),
        "embedding": as_list(_unit(rng, n)),
        "norm": pa.array(rng.uniform(5, 9, n).astype(np.float32)),
        "text_features_pre": as_list(rng.standard_normal((n, 6)).astype(np.float32)),
        "level": pa.array(np.arange(n) % 4),
        "source": pa.array([f"s{j % 3}" for j in range(n)], pa.string()),
    }
    return images, texts


def _write_parts(root: str, parts: list[tuple[dict, dict]], row_group_size: int = 4) -> None:
    tables.write_manifest(root, {"dim": DIM, "model": "m", "pre_dim": {"image": 6, "text": 6}})
    for k, (images, texts) in enumerate(parts):
        for kind, cols in (("images", images), ("texts", texts)):
            os.makedirs(os.path.join(root, "s", kind), exist_ok=True)
            path = _file(root, kind, k, split="s")
            pq.write_table(pa.table(cols), path, row_group_size=row_group_size)


@pytest.fixture
def world(tmp_path: Path) -> str:
    rng = np.random.default_rng(0)
    root = str(tmp_path / "t")
    _write_parts(root, [_part(rng, k, n) for k, n in enumerate((5, 0, 7, 11))])  # 1 is empty
    return root


def test_parts_read_in_name_order_as_plain_pyarrow_reads_them(world: str) -> None:
    s = read_split(world, "s")
    ref = {
        kind: pa.concat_tables(
            [pq.read_table(_file(world, kind, k, "s")) for k in range(4)],
            promote_options="permissive",
        )
        for kind in ("images", "texts")
    }
    images, texts = ref["images"], ref["texts"]
    for got, table, name in (
        (s.image_embeddings, images, "embedding"),
        (s.text_embeddings, texts, "embedding"),
        (s.image_features_pre, images, "image_features_pre"),
        (s.text_features_pre, texts, "text_features_pre"),
    ):
        want = np.array(table.column(name).to_pylist(), np.float32)
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert s.image_ids == images.column("image_id").to_pylist()
    assert s.texts == texts.column("text").to_pylist()
    index = {i: k for k, i in enumerate(s.image_ids)}
    want_index = [index[i] for i in texts.column("image_id").to_pylist()]
    np.testing.assert_array_equal(s.text_image_index, want_index)
    np.testing.assert_array_equal(s.image_norms, images.column("norm").to_numpy())
    assert list(s.extra_text_columns["source"]) == texts.column("source").to_pylist()
    np.testing.assert_array_equal(s.extra_image_columns["label"], images.column("label"))


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        # a row of another length in the first row group outranks a null row in a later one
        ("length_then_null", "row 1 (caption_id 'cap2-1'): embedding has length 3, manifest"),
        # within one row group a null row outranks a row of another length before it
        ("null_after_length", "row 3 (caption_id 'cap2-3'): embedding is null"),
        # a pre-projection problem waits for the checks of the norms
        ("pre_nan_and_norm", "texts/part-00000.parquet row 1 (caption_id 'cap0-1'): norm is"),
    ],
)
def test_problems_are_reported_in_file_and_row_group_order(
    tmp_path: Path, fault: str, expected: str
) -> None:
    rng = np.random.default_rng(1)
    parts = [_part(rng, k, n) for k, n in enumerate((5, 0, 7, 11))]
    texts2 = parts[2][1]
    if fault == "length_then_null":
        texts2["embedding"] = _rows_with(texts2["embedding"].to_pylist(), 1, [0.5] * 3)
        texts2["embedding"] = _rows_with(texts2["embedding"].to_pylist(), 17, None)
    elif fault == "null_after_length":
        texts2["embedding"] = _rows_with(texts2["embedding"].to_pylist(), 1, [0.5] * 3)
        texts2["embedding"] = _rows_with(texts2["embedding"].to_pylist(), 3, None)
    else:
        pre = parts[3][0]["image_features_pre"].to_pylist()
        parts[3][0]["image_features_pre"] = _rows_with(pre, 2, [float("nan")] * 6)
        parts[0][1]["norm"] = pa.array(_with(parts[0][1]["norm"].to_pylist(), 1, 0.0), pa.float32())
    root = str(tmp_path / "t")
    _write_parts(root, parts, row_group_size=8)
    with pytest.raises(TableError, match=re.escape(expected)):
        read_split(root, "s")


def test_parts_that_disagree_name_both_files(world: str) -> None:
    first, second = _file(world, "texts", 0, "s"), _file(world, "texts", 2, "s")
    wide = pa.array(pq.read_table(second)["embedding"].to_pylist(), pa.list_(pa.float64()))
    for columns, message in [
        ({"embedding": wide}, f"{second}: column 'embedding' has type list<element: double>, but"),
        ({"source": None}, f"{second}: missing column 'source' present in {first}"),
        ({"level": pa.array(np.arange(21, dtype=np.int32))}, f"{second}: column 'level' has "),
        ({"norm": None}, f"{second}: missing column 'norm' present in {first}"),
    ]:
        kept = pq.read_table(second)
        _rewrite(second, **columns)
        with pytest.raises(TableError) as exc:
            read_split(world, "s")
        assert str(exc.value).startswith(message), str(exc.value)
        pq.write_table(kept, second)


def test_ids_are_unique_across_parts_and_captions_may_point_across(root: str) -> None:
    d0, d1 = _data(seed=0), _data(seed=1, n_img=5, n_txt=4)
    d1["image_ids"] = [f"other{i}" for i in range(5)]
    d1["caption_image_ids"] = ["img0"] * 4  # part 0's image
    d1["caption_ids"] = ["n0", "n1", "n2", "n3"]
    write_split(root, "test", **d0, part="part-00000")
    write_split(root, "test", **d1, part="part-00001")
    assert read_split(root, "test").text_image_index[-4:].tolist() == [0] * 4
    write_split(root, "test", **{**d1, "caption_ids": ["n0", "n1", "c10", "n3"]}, part="part-00001")
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert str(exc.value).startswith(f"{_file(root, 'texts', 1)} row 2 (caption_id 'c10')")
    assert f"first seen in {_file(root, 'texts', 0)} row 10" in str(exc.value)


# -- atomic writes ------------------------------------------------------------------------------
def test_writes_are_atomic(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    write_split(root, "test", **_data())
    write_split(root, "test", **_data(seed=1))  # the same part, replaced
    img, txt = _file(root, "images"), _file(root, "texts")
    before = {p: Path(p).read_bytes() for p in (img, txt)}
    real_write = pq.ParquetWriter.write_table

    def dies(self, table, *args, **kwargs):
        real_write(self, table.slice(0, 1))  # a partial temporary file exists ...
        raise OSError("disk full")  # ... and then the write dies

    monkeypatch.setattr(pq.ParquetWriter, "write_table", dies)
    with pytest.raises(OSError, match="disk full"):
        write_split(root, "test", **_data(seed=2))
    monkeypatch.undo()
    assert {p: Path(p).read_bytes() for p in (img, txt)} == before
    assert os.listdir(os.path.dirname(img)) == ["part-00000.parquet"]
    Path(img).with_name(".part-00001.parquet.tmp-dead").write_bytes(b"half a file")  # ignored
    np.testing.assert_array_equal(
        read_split(root, "test").image_embeddings, _data(seed=1)["image_embeddings"]
    )


# -- lean loading -------------------------------------------------------------------------------
def test_load_split_tensors_are_the_split_arrays(world: str) -> None:
    data = load_split(world, "s")  # raw inputs, CPU
    split = data.split
    assert split.text_is_raw
    for tensor, array in (
        (data.text_emb, split.text_matrix),
        (data.image_emb, split.image_embeddings),
        (data.image_pre, split.image_features_pre),
    ):
        assert tensor.data_ptr() == array.__array_interface__["data"][0]
    reference = read_split(world, "s")
    np.testing.assert_array_equal(data.text_emb.numpy(), reference.text_inputs("raw"))
    assert data.text_to_image.dtype == torch.long
    unit = load_split(world, "s", adapter_input="unit")
    np.testing.assert_array_equal(unit.text_emb.numpy(), reference.text_embeddings)
    for part in hold_out_images(data, 0.3, seed=0):  # each part's tensors are its arrays
        ptr = part.split.text_matrix.__array_interface__["data"][0]
        assert part.text_emb.data_ptr() == ptr and part.split.text_is_raw
        rows = [reference.caption_ids.index(c) for c in part.split.caption_ids]
        np.testing.assert_array_equal(part.text_emb.numpy(), reference.text_inputs("raw")[rows])


def test_reading_allocates_the_matrices_about_once(tmp_path: Path) -> None:
    """numpy's and Python's allocations (tracemalloc) while ``load_split`` reads a mid-size
    table and makes the raw text inputs: about the float32 matrices once, plus the strings."""
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


# -- the projection file ------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["local", "s3"])
def test_projection_file(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    root = str(tmp_path / "p")
    if where == "s3":
        import s3fs

        server = request.getfixturevalue("s3_server")
        s3fs.S3FileSystem(client_kwargs={"endpoint_url": server}).mkdir("bucket")
        root = "s3://bucket/tables"
    write_manifest(root, {"dim": DIM, "model": "m", "pre_dim": PRE})
    rng = np.random.default_rng(3)
    image = rng.standard_normal((DIM, PRE["image"])).astype(np.float32)
    text = rng.standard_normal((DIM, PRE["text"])).astype(np.float32)
    assert tables.read_projection(root) is None
    tables.write_projection(root, image=image, text=text)
    got = tables.read_projection(root)
    np.testing.assert_array_equal(got["image"], image)
    np.testing.assert_array_equal(got["text"], text)
    tables.write_projection(root, image=image, text=text[:, :4])
    with pytest.raises(TableError, match=r"text projection has shape \[8, 4\].*\[8, 5\]"):
        tables.read_projection(root)
    with pytest.raises(ValueError, match="NaN/inf"):
        tables.write_projection(root, image=np.full((DIM, 6), np.nan))
