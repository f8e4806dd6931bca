"""The embedding-table contract (asymvlm.tables): round trips, refusals, atomic writes, lean
loading and the projection file."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
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
from tests.helpers import captioned_images, write_table

DIM = 8
PRE = {"image": 6, "text": 5}


def _unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _data(seed: int = 0, n_img: int = 5, n_txt: int = 12, pre: bool = True, tag: str = "") -> dict:
    rng = np.random.default_rng(seed)
    image_ids = [f"img{tag}{i}" for i in range(n_img)]
    d = {"image_ids": image_ids, "image_embeddings": _unit(rng, n_img)}
    d["caption_ids"] = [f"c{tag}{j}" for j in range(n_txt)]
    d["caption_image_ids"] = [image_ids[(3 * j + 1) % n_img] for j in range(n_txt)]
    d["texts"] = [f"a photo number {j} — é" for j in range(n_txt)]
    d["text_embeddings"] = _unit(rng, n_txt)
    d["text_norms"] = rng.uniform(5.0, 15.0, n_txt).astype(np.float32)
    sources = [f"s{j % 2}" for j in range(n_txt)]
    d["extra_text_columns"] = {"level": np.arange(n_txt) % 3, "source": sources}
    if pre:
        d["image_norms"] = rng.uniform(5.0, 15.0, n_img).astype(np.float32)
        d["image_features_pre"] = rng.standard_normal((n_img, PRE["image"])).astype(np.float32)
        d["text_features_pre"] = rng.standard_normal((n_txt, PRE["text"])).astype(np.float32)
        d["extra_image_columns"] = {"label": np.arange(n_img) % 4}
    return d


D = _data()


@pytest.fixture
def root(tmp_path: Path) -> str:
    r = str(tmp_path / "emb")
    write_manifest(r, {"dim": DIM, "model": "ViT-B-32", "source": "unit-test", "pre_dim": PRE})
    return r


def _file(root: str, kind: str, k: int = 0, split: str = "test") -> str:
    return os.path.join(root, split, kind, f"part-{k:05d}.parquet")


def _listed(matrix) -> pa.Array:
    return pa.array([list(map(float, r)) for r in np.asarray(matrix)], pa.list_(pa.float32()))


def _rewrite(path: str, **columns) -> None:
    """Replace (or add, or with None drop) columns of a parquet file, past the writer."""
    table = pq.read_table(path)
    for name, values in columns.items():
        if name in table.column_names:
            table = table.drop_columns([name])
        if values is not None:
            table = table.append_column(name, values)
    pq.write_table(table, path)


def test_round_trip_over_several_parts(root: str) -> None:
    """Two parts, the second of variable-length lists, read back in name order as written."""
    a, b = _data(), _data(seed=1, n_img=4, n_txt=6, tag="b")
    write_split(root, "test", **a)
    write_split(root, "test", **b, part="part-00001")
    second = _file(root, "images", 1)
    for name in ("embedding", "image_features_pre"):
        _rewrite(second, **{name: _listed(pq.read_table(second)[name].to_pylist())})
    write_split(root, "train", **_data(pre=False))
    s = read_split(root, "test")
    assert s.image_ids == a["image_ids"] + b["image_ids"]
    assert s.caption_ids == a["caption_ids"] + b["caption_ids"]
    assert s.texts == a["texts"] + b["texts"]
    matrices = "image_embeddings text_embeddings text_norms image_norms image_features_pre"
    for key in [*matrices.split(), "text_features_pre"]:
        got = getattr(s, key)
        assert got.dtype == np.float32 and got.flags.writeable and got.flags.c_contiguous, key
        np.testing.assert_array_equal(got, np.concatenate([a[key], b[key]]), err_msg=key)
    owners = a["caption_image_ids"] + b["caption_image_ids"]
    assert [s.image_ids[i] for i in s.text_image_index] == owners
    np.testing.assert_array_equal(
        s.extra_text_columns["level"], np.r_[np.arange(12) % 3, np.arange(6) % 3]
    )
    assert list(s.extra_text_columns["source"][:3]) == ["s0", "s1", "s0"]
    np.testing.assert_array_equal(
        s.extra_image_columns["label"], np.r_[np.arange(5) % 4, np.arange(4) % 4]
    )
    assert s.manifest == Manifest(DIM, "ViT-B-32", {"source": "unit-test", "pre_dim": PRE})
    assert list_splits(root) == ["test", "train"]
    rows = np.flatnonzero(np.isin(s.text_image_index, [3, 1]))
    sub = s.subset(np.array([3, 1]), rows)
    np.testing.assert_array_equal(sub.image_features_pre, a["image_features_pre"][[3, 1]])
    assert sub.texts == [s.texts[r] for r in rows] and sub.image_ids == ["img3", "img1"]
    plain = read_split(root, "train")  # absent optional columns read as None
    assert plain.image_norms is plain.image_features_pre is plain.text_features_pre is None


def test_manifest_errors_and_listing(tmp_path: Path) -> None:
    r = str(tmp_path / "m")
    with pytest.raises(TableError, match="manifest not found"):
        read_manifest(r)
    for split, message in (("test", f"{r}: no such folder"), ("x", "manifest not found")):
        with pytest.raises(TableError, match=message):  # the root first, then its manifest
            tables.check_split(r, split)
        os.makedirs(r, exist_ok=True)
    os.makedirs(os.path.join(r, "junk"))  # a folder that is not a split
    assert list_splits(r) == []
    path = os.path.join(r, "manifest.json")
    for bad, msg in [
        ({"model": "x"}, r"manifest has no 'dim' \(a positive int: the embeddings' width\)$"),
        ({"dim": 4}, r"manifest has no 'model' \(a string: the embedding model\)$"),
        ({"dim": "4", "model": "x"}, "positive int"),
        ({"dim": 2, "model": "m", "pre_dim": [3]}, "'pre_dim' must be"),
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
    local = tmp_path / "uri"  # a file:// URI is the local folder
    write_manifest(local.as_uri(), {"dim": DIM, "model": "m", "pre_dim": PRE})
    write_split(local.as_uri(), "val", **_data())
    assert list_splits(local.as_uri()) == ["val"]
    uri, path = read_split(local.as_uri(), "val"), read_split(str(local), "val")
    assert uri.caption_ids == path.caption_ids


def _corrupt(path: str, column: str, row: int, value) -> None:
    """Set one row of a column of a parquet file (bytes: not UTF-8; parquet does not check)."""
    table = pq.read_table(path)
    values, typ = table[column].to_pylist(), table[column].type
    values[row] = value
    if isinstance(value, bytes):
        raw = [v.encode() if isinstance(v, str) else v for v in values]
        array = pa.array(raw, pa.binary()).view(pa.string())
    else:
        array = pa.array(values, pa.list_(pa.float32()) if "list" in str(typ) else typ)
    _rewrite(path, **{column: array})


NAN, BAD = [float("nan")] * 8, b"caf\xe9 au lait"
# folder, column, row, value, what the message says after "FILE row ROW"
CORRUPTIONS = [
    ("images", "embedding", 3, [0.5] * 7, " (image_id 'img3'): embedding has length 7, manifest"),
    ("texts", "embedding", 7, NAN, " (caption_id 'c7'): embedding has NaN/inf"),
    ("images", "embedding", 4, [1.0] * 8, " (image_id 'img4'): embedding norm is 2.82843"),
    ("texts", "embedding", 2, None, " (caption_id 'c2'): embedding is null"),
    ("images", "image_id", 2, None, ": image_id is null"),
    ("images", "image_id", 3, "img1", " (image_id 'img1'): duplicate image_id, first seen in"),
    ("texts", "image_id", 5, "ghost", " (caption_id 'c5'): unknown image_id 'ghost'"),
    ("texts", "norm", 6, 0.0, " (caption_id 'c6'): norm is 0, must be finite"),
    ("images", "norm", 3, 1e9, " (image_id 'img3'): norm is 1e+09, outside ["),
    ("texts", "text", 4, BAD, " (caption_id 'c4'): column 'text' is not valid UTF-8 (invalid"),
    ("texts", "caption_id", 4, BAD, ": column 'caption_id' is not valid UTF-8"),
    ("images", "image_features_pre", 2, NAN[:6], " (image_id 'img2'): image_features_pre has NaN"),
]


def test_a_corrupt_file_is_refused_naming_file_row_and_id(root: str) -> None:
    """Part 1 is corrupted; part 0 before it is clean (its rows are counted out of the row)."""
    write_split(root, "test", **_data(tag="z"))
    for kind, column, row, value, what in CORRUPTIONS:
        write_split(root, "test", **D, part="part-00001")
        path = _file(root, kind, 1)
        _corrupt(path, column, row, value)
        with pytest.raises(TableError) as exc:
            read_split(root, "test")
        assert str(exc.value).startswith(f"{path} row {row}{what}"), str(exc.value)
    write_split(root, "test", **D, part="part-00001")
    _rewrite(_file(root, "texts", 1), level=pa.array(["x"] * 12))
    with pytest.raises(TableError, match="column 'level' has type string, but int64 in"):
        read_split(root, "test")


def test_what_validation_refuses_and_what_no_validation_reads(root: str) -> None:
    with pytest.raises(TableError, match=rf"^{root}: no split 'nope' \(splits there: none\)$"):
        read_split(root, "nope")
    write_split(root, "test", **D)
    _rewrite(_file(root, "images"), embedding=_listed(D["image_embeddings"] * 2.5))
    assert read_split(root, "test", norm_atol=2.0).n_images == 5
    _corrupt(_file(root, "texts"), "norm", 7, 1e30)
    assert read_split(root, "test", validate=False).text_norms[7] == np.float32(1e30)
    _rewrite(_file(root, "texts"), text=None)
    with pytest.raises(TableError, match=r"texts/part-00000.parquet: missing required .*'text'"):
        read_split(root, "test", validate=False)
    write_split(root, "empty", **_data(n_img=5, n_txt=0))
    with pytest.raises(TableError) as exc:
        read_split(root, "empty")
    assert str(exc.value) == f"{root}/empty/texts: no rows (1 parquet file(s), all empty)"
    write_split(root, "two", **D)
    write_split(root, "two", **_data(pre=False, tag="b"), part="part-00001")
    missing = "part-00001.parquet: missing column 'norm' present in .*part-00000"
    with pytest.raises(TableError, match=missing):
        read_split(root, "two")
    bare = str(Path(root).parent / "bare")  # pre-projection columns need the manifest's pre_dim
    write_manifest(bare, {"dim": DIM, "model": "m"})
    write_split(bare, "test", **D)
    with pytest.raises(TableError, match="present but the manifest has no pre_dim.image"):
        read_split(bare, "test")
    with pytest.raises(ValueError, match="reserved"):
        write_split(root, "test", **{**D, "extra_text_columns": {"norm": np.ones(12)}})
    with pytest.raises(ValueError, match="invalid part name"):
        write_split(root, "test", **D, part=".hidden")


def test_write_split_refuses_missing_strings_and_columns_of_other_lengths(root: str) -> None:
    """A missing id or caption is not written as the text 'None' or 'nan'; nothing is written."""
    for name, row, missing in (
        ("texts", 4, None),
        ("texts", 2, float("nan")),
        ("caption_ids", 0, pd.NA),
        ("image_ids", 1, None),
    ):
        values = list(D[name])
        values[row] = missing
        with pytest.raises(TableError, match=rf"^write_split: {name} row {row} is missing \("):
            write_split(root, "test", **{**D, name: values})
    short = {**D, "texts": D["texts"][:11]}
    lengths = "caption_ids 12, caption_image_ids 12, texts 11, text_embeddings 12, text_norms 12"
    with pytest.raises(TableError, match=f"^write_split: one row per caption .*, got {lengths},"):
        write_split(root, "test", **short)
    label = {"label": np.arange(4)}
    with pytest.raises(TableError, match="got image_ids 5, .*, label 4$"):
        write_split(root, "test", **{**D, "extra_image_columns": label})
    assert not os.path.exists(os.path.join(root, "test"))
    numbered = dict(image_ids=np.arange(5), caption_image_ids=[(3 * j + 1) % 5 for j in range(12)])
    write_split(root, "test", **{**D, **numbered})  # numbers as ids: their text
    assert read_split(root, "test").image_ids == ["0", "1", "2", "3", "4"]


def test_writes_are_atomic(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    write_split(root, "test", **_data(pre=False))
    img, txt = _file(root, "images"), _file(root, "texts")
    before = {p: Path(p).read_bytes() for p in (img, txt)}
    real_write = pq.ParquetWriter.write_table

    def dies(self, table, *args, **kwargs):
        real_write(self, table.slice(0, 1))  # a partial temporary file exists ...
        raise OSError("disk full")  # ... and then the write dies

    monkeypatch.setattr(pq.ParquetWriter, "write_table", dies)
    with pytest.raises(OSError, match="disk full"):
        write_split(root, "test", **_data(seed=2, pre=False))
    monkeypatch.undo()
    assert {p: Path(p).read_bytes() for p in (img, txt)} == before
    assert os.listdir(os.path.dirname(img)) == ["part-00000.parquet"]
    Path(img).with_name(".part-00001.parquet.tmp-dead").write_bytes(b"half a file")  # ignored
    np.testing.assert_array_equal(
        read_split(root, "test").image_embeddings, _data(pre=False)["image_embeddings"]
    )


def test_load_split_makes_raw_inputs_in_place_and_views_the_arrays(root: str, caplog) -> None:
    write_split(root, "test", **D)
    data = load_split(root, "test")  # raw inputs, CPU
    split = data.split
    raw = D["text_embeddings"] * D["text_norms"][:, None]
    assert split.text_is_raw and data.text_to_image.dtype == torch.long
    np.testing.assert_allclose(data.text_emb.numpy(), raw, rtol=1e-6)
    np.testing.assert_allclose(split.text_embeddings, D["text_embeddings"], rtol=1e-6, atol=1e-7)
    for tensor, array in (
        (data.text_emb, split.text_matrix),
        (data.image_emb, split.image_embeddings),
        (data.image_pre, split.image_features_pre),
    ):
        assert tensor.data_ptr() == array.__array_interface__["data"][0]
    unit = load_split(root, "test", adapter_input="unit")
    np.testing.assert_array_equal(unit.text_emb.numpy(), D["text_embeddings"])
    for part in hold_out_images(data, 0.4, seed=0):  # each part's tensors are its arrays
        assert part.text_emb.data_ptr() == part.split.text_matrix.__array_interface__["data"][0]
        rows = [D["caption_ids"].index(c) for c in part.split.caption_ids]
        np.testing.assert_array_equal(part.text_emb.numpy(), data.text_emb.numpy()[rows])
    with pytest.raises(ValueError, match="adapter_input"):
        load_split(root, "test", adapter_input="normalised")
    write_split(root, "test", **{**D, "text_norms": None})
    with caplog.at_level("WARNING", "asymvlm"):
        no_norm = load_split(root, "test")
    assert [r.getMessage() for r in caplog.records] == [
        f"{root}/test: the text table has no `norm` column; the adapter reads raw inputs (it was "
        "trained on embedding x norm) and gets the unit embeddings"
    ]
    np.testing.assert_array_equal(no_norm.text_emb.numpy(), D["text_embeddings"])


def test_reading_allocates_the_matrices_about_once(tmp_path: Path) -> None:
    """tracemalloc while ``load_split`` reads a table: the float32 matrices once, plus strings."""
    dim, n_img, n_cap, root = 128, 2000, 5, str(tmp_path / "mid")
    captioned = captioned_images(np.random.default_rng(2), n_img, n_cap, dim, 1.0, np.float32)
    write_table(root, *captioned, "s")
    matrices = (n_img + n_img * n_cap) * dim * 4  # 6.1 MB
    load_split(root, "s")  # imports and first-call caches
    tracemalloc.start()
    try:
        data = load_split(root, "s")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert data.text_emb.shape == (n_img * n_cap, dim)
    assert peak < 1.15 * matrices + 3 * 2**20, (peak / 2**20, matrices / 2**20)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_projection_file(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    root = str(tmp_path / "p")
    if where == "s3":
        request.getfixturevalue("bucket")
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
    if where == "s3":
        write_split(root, "val", **D)
        assert list_splits(root) == ["val"] and storage.is_remote(root)
        assert read_split(root, "val").image_ids == D["image_ids"]
