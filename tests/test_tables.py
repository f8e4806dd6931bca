"""Tests for the embedding-table contract (asymvlm.tables)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asymvlm import storage, tables
from asymvlm.tables import (
    EmbeddingSplit,
    Manifest,
    TableError,
    list_splits,
    read_manifest,
    read_split,
    write_manifest,
    write_split,
)

DIM = 8


def _unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _data(seed: int = 0, n_img: int = 5, n_txt: int = 12) -> dict:
    rng = np.random.default_rng(seed)
    image_ids = [f"img{i}" for i in range(n_img)]
    caption_img = [image_ids[(3 * j + 1) % n_img] for j in range(n_txt)]
    return dict(
        image_ids=image_ids,
        image_embeddings=_unit(rng, n_img),
        caption_ids=[f"c{j}" for j in range(n_txt)],
        caption_image_ids=caption_img,
        texts=[f"a photo number {j}" for j in range(n_txt)],
        text_embeddings=_unit(rng, n_txt),
        text_norms=rng.uniform(5.0, 15.0, n_txt).astype(np.float32),
        extra_text_columns={"level": np.arange(n_txt, dtype=np.int64) % 3},
    )


@pytest.fixture
def root(tmp_path: Path) -> str:
    r = str(tmp_path / "emb")
    write_manifest(r, {"dim": DIM, "model": "ViT-B-32", "source": "unit-test", "seed": 7})
    return r


def _split_files(root: str, split: str = "test") -> tuple[str, str]:
    return (
        os.path.join(root, split, "images", "part-00000.parquet"),
        os.path.join(root, split, "texts", "part-00000.parquet"),
    )


def _emb_col(matrix: np.ndarray) -> pa.Array:
    """Variable-length list<float32> column (can hold rows of any length)."""
    return pa.array([list(map(float, r)) for r in matrix], type=pa.list_(pa.float32()))


def _write_images(path: str, ids: list[str], emb, **extra) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    col = emb if isinstance(emb, pa.Array) else _emb_col(np.asarray(emb))
    pq.write_table(
        pa.table({"image_id": pa.array(ids, pa.string()), "embedding": col, **extra}), path
    )


def _write_texts(path: str, d: dict, emb=None, **extra) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    emb = d["text_embeddings"] if emb is None else emb
    col = emb if isinstance(emb, pa.Array) else _emb_col(np.asarray(emb))
    cols = {
        "caption_id": pa.array(d["caption_ids"], pa.string()),
        "image_id": pa.array(d["caption_image_ids"], pa.string()),
        "text": pa.array(d["texts"], pa.string()),
        "embedding": col,
        **extra,
    }
    pq.write_table(pa.table(cols), path)


# --------------------------------------------------------------------------------------------
# round trip


def test_round_trip(root: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    write_split(root, "train", **_data(seed=1))
    s = read_split(root, "test")

    assert isinstance(s, EmbeddingSplit)
    assert s.image_ids == d["image_ids"]
    assert s.caption_ids == d["caption_ids"]
    assert s.texts == d["texts"]
    np.testing.assert_array_equal(s.image_embeddings, d["image_embeddings"])
    np.testing.assert_array_equal(s.text_embeddings, d["text_embeddings"])
    assert s.image_embeddings.dtype == np.float32 and s.image_embeddings.shape == (5, DIM)
    assert s.text_embeddings.dtype == np.float32 and s.text_embeddings.shape == (12, DIM)
    expected_index = [d["image_ids"].index(i) for i in d["caption_image_ids"]]
    assert s.text_image_index.dtype == np.int64
    np.testing.assert_array_equal(s.text_image_index, expected_index)
    assert [s.image_ids[i] for i in s.text_image_index] == d["caption_image_ids"]
    assert s.text_norms is not None and s.text_norms.dtype == np.float32
    np.testing.assert_array_equal(s.text_norms, d["text_norms"])
    assert set(s.extra_text_columns) == {"level"}
    np.testing.assert_array_equal(s.extra_text_columns["level"], np.arange(12) % 3)
    assert s.manifest == Manifest(DIM, "ViT-B-32", {"source": "unit-test", "seed": 7})
    assert s.manifest.to_dict() == {
        "dim": DIM,
        "model": "ViT-B-32",
        "source": "unit-test",
        "seed": 7,
    }
    assert list_splits(root) == ["test", "train"]

    # the files use fixed-size list<float32>[dim] embeddings
    img_file, txt_file = _split_files(root)
    assert pq.read_schema(img_file).field("embedding").type == pa.list_(pa.float32(), DIM)
    assert pq.read_schema(txt_file).field("embedding").type == pa.list_(pa.float32(), DIM)


def test_manifest_errors(tmp_path: Path) -> None:
    r = str(tmp_path / "m")
    with pytest.raises(TableError, match="manifest not found"):
        read_manifest(r)
    os.makedirs(r)
    path = os.path.join(r, "manifest.json")
    for bad, msg in [
        ({"model": "x"}, "'dim'"),
        ({"dim": 4}, "'model'"),
        ({"dim": "4", "model": "x"}, "positive int"),
    ]:
        with open(path, "w") as f:
            json.dump(bad, f)
        with pytest.raises(TableError, match=msg) as exc:
            read_manifest(r)
        assert "manifest.json" in str(exc.value)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(TableError, match="not valid JSON"):
        read_manifest(r)
    write_manifest(r, Manifest(dim=3, model="m", extra={"k": [1, 2]}))
    assert read_manifest(r) == Manifest(3, "m", {"k": [1, 2]})
    assert Manifest.from_dict(read_manifest(r).to_dict()) == read_manifest(r)


def test_list_splits_empty_and_missing(tmp_path: Path, root: str) -> None:
    assert list_splits(str(tmp_path / "nothing-here")) == []
    assert list_splits(root) == []
    os.makedirs(os.path.join(root, "junk"))  # a folder that is not a split
    assert list_splits(root) == []


def test_file_uri(tmp_path: Path) -> None:
    local = tmp_path / "uri"
    uri = local.as_uri()
    assert uri.startswith("file://")
    fs, path = storage.filesystem(uri)
    assert path == str(local)
    write_manifest(uri, {"dim": DIM, "model": "m"})
    write_split(uri, "val", **_data())
    assert (local / "val" / "texts" / "part-00000.parquet").is_file()
    assert list_splits(uri) == ["val"]
    s_uri, s_local = read_split(uri, "val"), read_split(str(local), "val")
    assert s_uri.caption_ids == s_local.caption_ids
    np.testing.assert_array_equal(s_uri.text_embeddings, s_local.text_embeddings)


# --------------------------------------------------------------------------------------------
# text_inputs


def test_text_inputs(root: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    s = read_split(root, "test")
    raw = s.text_inputs()
    assert raw.dtype == np.float32 and raw.shape == (12, DIM)
    np.testing.assert_allclose(raw, d["text_embeddings"] * d["text_norms"][:, None], rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(raw, axis=1), d["text_norms"], rtol=1e-4)
    np.testing.assert_array_equal(s.text_inputs("unit"), d["text_embeddings"])
    with pytest.raises(ValueError, match="adapter_input"):
        s.text_inputs("normalised")


def test_text_inputs_without_norm_warns_once(root: str) -> None:
    d = _data()
    d["text_norms"] = None
    write_split(root, "test", **d)
    s = read_split(root, "test")
    assert s.text_norms is None
    with pytest.warns(UserWarning, match="`norm` column"):
        raw = s.text_inputs("raw")
    np.testing.assert_array_equal(raw, s.text_inputs("unit"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.text_inputs("raw")  # second call: no warning


# --------------------------------------------------------------------------------------------
# validation errors


def _assert_row_error(exc: pytest.ExceptionInfo, file: str, row: int, ident: str, what: str):
    msg = str(exc.value)
    assert os.path.basename(file) in msg and os.path.dirname(file) in msg, msg
    assert f"row {row} " in msg, msg
    assert repr(ident) in msg, msg
    assert what in msg, msg


def test_missing_column(root: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    _, txt = _split_files(root)
    t = pq.read_table(txt).drop_columns(["text"])
    pq.write_table(t, txt)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert txt in str(exc.value) and "'text'" in str(exc.value)


def test_wrong_length(root: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    img, _ = _split_files(root)
    emb = [list(map(float, r)) for r in d["image_embeddings"]]
    emb[3] = emb[3][:-1]
    _write_images(img, d["image_ids"], pa.array(emb, pa.list_(pa.float32())))
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    _assert_row_error(exc, img, 3, "img3", "length 7")


def test_wrong_dim_fixed_size(root: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    _, txt = _split_files(root)
    rng = np.random.default_rng(3)
    emb = _unit(rng, 12, DIM + 1)
    col = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), DIM + 1)
    _write_texts(txt, d, col)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    _assert_row_error(exc, txt, 0, "c0", "manifest dim is 8")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite(root: str, bad: float) -> None:
    d = _data()
    write_split(root, "test", **d)
    _, txt = _split_files(root)
    emb = d["text_embeddings"].copy()
    emb[7, 2] = bad
    emb[9, 0] = bad
    _write_texts(txt, d, emb)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    _assert_row_error(exc, txt, 7, "c7", "NaN/inf")


def test_not_unit_norm(root: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    img, _ = _split_files(root)
    emb = d["image_embeddings"].copy()
    emb[4] *= 2.5
    _write_images(img, d["image_ids"], emb)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    _assert_row_error(exc, img, 4, "img4", "norm is 2.5")
    # a loose tolerance, or validate=False, accepts it
    assert read_split(root, "test", norm_atol=2.0).image_embeddings.shape == (5, DIM)
    assert read_split(root, "test", validate=False).image_embeddings.shape == (5, DIM)


def test_unknown_image_id(root: str) -> None:
    d = _data()
    d["caption_image_ids"][5] = "ghost"
    write_split(root, "test", **d)
    _, txt = _split_files(root)
    for validate in (True, False):
        with pytest.raises(TableError) as exc:
            read_split(root, "test", validate=validate)
        _assert_row_error(exc, txt, 5, "c5", "unknown image_id 'ghost'")


def test_duplicate_image_id(root: str) -> None:
    d = _data()
    d["image_ids"][3] = "img1"
    write_split(root, "test", **d)
    img, _ = _split_files(root)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    _assert_row_error(exc, img, 3, "img1", "duplicate image_id")
    assert "row 1" in str(exc.value)  # names the first occurrence too


def test_duplicate_caption_id_across_files(root: str) -> None:
    d0, d1 = _data(seed=0), _data(seed=1, n_img=5, n_txt=4)
    d1["image_ids"] = [f"other{i}" for i in range(5)]
    d1["caption_image_ids"] = ["other0"] * 4
    d1["caption_ids"] = ["n0", "n1", "c10", "n3"]  # 'c10' already in part-00000
    write_split(root, "test", **d0, part="part-00000")
    write_split(root, "test", **d1, part="part-00001")
    txt1 = os.path.join(root, "test", "texts", "part-00001.parquet")
    txt0 = os.path.join(root, "test", "texts", "part-00000.parquet")
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    _assert_row_error(exc, txt1, 2, "c10", "duplicate caption_id")
    assert f"{txt0} row 10" in str(exc.value)


def test_no_files(root: str) -> None:
    with pytest.raises(TableError) as exc:
        read_split(root, "nope")
    assert os.path.join(root, "nope", "images") in str(exc.value)
    d = _data()
    img, _ = _split_files(root)
    _write_images(img, d["image_ids"], d["image_embeddings"])
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert os.path.join(root, "test", "texts") in str(exc.value)
    assert "no parquet files" in str(exc.value)


def _with_norm(root: str, d: dict, row: int, value: float) -> tuple[str, np.ndarray]:
    """Write ``d``, then rewrite its texts file with ``norm[row] = value`` (past write_split's
    own check); returns (texts file, the norms)."""
    write_split(root, "test", **d)
    _, txt = _split_files(root)
    norms = d["text_norms"].copy()
    norms[row] = value
    _write_texts(txt, d, norm=pa.array(norms, pa.float32()))
    return txt, norms


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf])
def test_bad_norm_column(root: str, bad: float) -> None:
    d = _data()
    txt, norms = _with_norm(root, d, 6, bad)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    _assert_row_error(exc, txt, 6, "c6", "norm is")
    with pytest.raises(ValueError, match="text_norms row 6"):
        write_split(root, "test", **{**d, "text_norms": norms})


def test_null_id(root: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    img, _ = _split_files(root)
    ids = list(d["image_ids"])
    ids[2] = None
    _write_images(img, ids, d["image_embeddings"])
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert img in str(exc.value) and "row 2" in str(exc.value) and "null" in str(exc.value)


def test_write_split_argument_checks(root: str) -> None:
    d = _data()
    with pytest.raises(ValueError, match="dim"):
        write_split(root, "test", **{**d, "text_embeddings": np.ones((12, 4), np.float32)})
    with pytest.raises(ValueError, match="caption_ids"):
        write_split(root, "test", **{**d, "caption_ids": d["caption_ids"][:-1]})
    bad = d["image_embeddings"].copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="row 1"):
        write_split(root, "test", **{**d, "image_embeddings": bad})
    # the manifest's dim is enforced at write time
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="manifest dim"):
        write_split(
            root,
            "test",
            **{**d, "image_embeddings": _unit(rng, 5, 4), "text_embeddings": _unit(rng, 12, 4)},
        )
    assert list_splits(root) == []


# --------------------------------------------------------------------------------------------
# multiple parts, atomic writes


def test_parts_concatenated_in_name_order(root: str) -> None:
    parts = {}
    for k, name in [(2, "part-00002"), (0, "part-00000"), (1, "part-00001")]:
        d = _data(seed=k, n_img=3, n_txt=4)
        d["image_ids"] = [f"p{k}_img{i}" for i in range(3)]
        d["caption_ids"] = [f"p{k}_c{j}" for j in range(4)]
        # part 2's captions point at part 0's images: references work across parts
        owner = 0 if k == 2 else k
        d["caption_image_ids"] = [f"p{owner}_img{j % 3}" for j in range(4)]
        write_split(root, "train", **d, part=name)
        parts[k] = d
    s = read_split(root, "train")
    assert s.image_ids == [i for k in range(3) for i in parts[k]["image_ids"]]
    assert s.caption_ids == [c for k in range(3) for c in parts[k]["caption_ids"]]
    np.testing.assert_array_equal(
        s.image_embeddings, np.concatenate([parts[k]["image_embeddings"] for k in range(3)])
    )
    np.testing.assert_array_equal(
        s.text_norms, np.concatenate([parts[k]["text_norms"] for k in range(3)])
    )
    np.testing.assert_array_equal(s.text_image_index, [0, 1, 2, 0, 3, 4, 5, 3, 0, 1, 2, 0])
    assert len(s.extra_text_columns["level"]) == 12


def _folder_names(root: str, split: str = "test") -> list[str]:
    return sorted(os.listdir(os.path.join(root, split, "images"))) + sorted(
        os.listdir(os.path.join(root, split, "texts"))
    )


def test_atomic_write_leaves_no_temp_files(root: str) -> None:
    write_split(root, "test", **_data())
    write_split(root, "test", **_data(seed=1))  # overwrite the same part
    assert _folder_names(root) == ["part-00000.parquet", "part-00000.parquet"]
    assert sorted(os.listdir(root)) == ["manifest.json", "test"]
    np.testing.assert_array_equal(
        read_split(root, "test").image_embeddings, _data(seed=1)["image_embeddings"]
    )


def test_failed_write_keeps_old_file(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    write_split(root, "test", **_data())
    img, txt = _split_files(root)
    before = {p: Path(p).read_bytes() for p in (img, txt)}
    real_write = pq.write_table
    written: list[str] = []

    def half_write(table, where, *args, **kwargs):
        real_write(table.slice(0, 1), where, *args, **kwargs)  # a partial temp file exists ...
        written.append(str(where))
        raise OSError("disk full")  # ... and then the write dies

    monkeypatch.setattr(pq, "write_table", half_write)
    with pytest.raises(OSError, match="disk full"):
        write_split(root, "test", **_data(seed=1))
    monkeypatch.undo()

    assert written and all(os.path.basename(w) != "part-00000.parquet" for w in written)
    assert {p: Path(p).read_bytes() for p in (img, txt)} == before
    assert _folder_names(root) == ["part-00000.parquet", "part-00000.parquet"]
    np.testing.assert_array_equal(
        read_split(root, "test").image_embeddings, _data()["image_embeddings"]
    )


def test_stray_temp_files_are_ignored(root: str) -> None:
    write_split(root, "test", **_data())
    img, _ = _split_files(root)
    stray = os.path.join(os.path.dirname(img), ".part-00001.parquet.tmp-deadbeef")
    Path(stray).write_bytes(b"half a file")
    assert read_split(root, "test").image_ids == _data()["image_ids"]


# --------------------------------------------------------------------------------------------
# bad input that used to pass or crash: empty splits, norm outliers, invalid UTF-8, parts that
# disagree


@pytest.mark.parametrize("kind", ["images", "texts"])
def test_split_with_files_but_no_rows(root: str, kind: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    empty = _data(n_img=0 if kind == "images" else 5, n_txt=0)
    if kind == "images":  # captions must point at images: only the (empty) image side here
        write_split(root, "empty", **{**empty, "text_embeddings": np.zeros((0, DIM))})
        write_split(root, "empty", **d, part="part-00001")
        os.remove(os.path.join(root, "empty", "images", "part-00001.parquet"))
        os.remove(os.path.join(root, "empty", "texts", "part-00000.parquet"))
    else:
        write_split(root, "empty", **empty)
    with pytest.raises(TableError) as exc:
        read_split(root, "empty")
    assert (
        str(exc.value) == f"{os.path.join(root, 'empty', kind)}: no rows (1 parquet file(s), "
        "all empty)"
    )


@pytest.mark.parametrize("bad", [1e30, 1e-30, 2e6])
def test_norm_outlier_is_named(root: str, bad: float) -> None:
    d = _data(n_txt=12)
    d["text_norms"] = np.full(12, 1e3 if bad == 2e6 else 8.0, np.float32)  # 2e6 < 1e4 x median
    write_split(root, "test", **d)
    read_split(root, "test")  # the clean split passes
    txt, _ = _with_norm(root, d, 7, bad)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    _assert_row_error(exc, txt, 7, "c7", f"norm is {bad:.6g}, outside [")
    assert "the split's median norm" in str(exc.value)
    assert read_split(root, "test", validate=False).text_norms[7] == np.float32(bad)


def test_synthetic_and_clip_like_norms_pass(small_world: str) -> None:
    split = read_split(small_world, "train")
    assert split.text_norms is not None and split.text_norms.max() < 20


def _invalid_utf8(values: list[bytes]) -> pa.Array:
    return pa.array(values, pa.binary()).view(pa.string())  # parquet does not check UTF-8


@pytest.mark.parametrize("column", ["text", "caption_id", "clean_text"])
def test_invalid_utf8_is_named(root: str, column: str) -> None:
    d = _data()
    write_split(root, "test", **d)
    _, txt = _split_files(root)
    key = {"text": "texts", "caption_id": "caption_ids"}.get(column, "texts")
    values = [v.encode() for v in d[key]]
    values[4] = b"caf\xe9 au lait"  # latin-1, not UTF-8
    if column == "clean_text":
        _write_texts(txt, d, clean_text=_invalid_utf8(values))
    else:
        table = pq.read_table(txt)
        index = table.column_names.index(column)
        pq.write_table(table.set_column(index, column, _invalid_utf8(values)), txt)
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    message = str(exc.value)
    assert message.startswith(f"{txt} row 4")
    assert f"column {column!r} is not valid UTF-8 (invalid continuation byte at byte 3" in message
    if column != "caption_id":
        assert "(caption_id 'c4')" in message


def _two_parts(root: str) -> tuple[dict, dict]:
    a, b = _data(seed=0, n_img=3, n_txt=4), _data(seed=1, n_img=3, n_txt=4)
    b["image_ids"] = [f"b{i}" for i in range(3)]
    b["caption_ids"] = [f"bc{j}" for j in range(4)]
    b["caption_image_ids"] = [f"b{j % 3}" for j in range(4)]
    a["caption_image_ids"] = [f"img{j % 3}" for j in range(4)]
    a["image_ids"] = [f"img{i}" for i in range(3)]
    write_split(root, "test", **a, part="part-00000")
    write_split(root, "test", **b, part="part-00001")
    return a, b


def _part(root: str, kind: str, k: int) -> str:
    return os.path.join(root, "test", kind, f"part-{k:05d}.parquet")


def test_parts_with_another_embedding_type_name_both_files(root: str) -> None:
    a, b = _two_parts(root)
    for kind, emb in (("images", "image_embeddings"), ("texts", "text_embeddings")):
        first, second = _part(root, kind, 0), _part(root, kind, 1)
        table = pq.read_table(second)
        index = table.column_names.index("embedding")
        # A variable-length list<float32> beside fixed-size ones is the same contract ...
        pq.write_table(table.set_column(index, "embedding", _emb_col(b[emb])), second)
        read_split(root, "test")
        # ... float64 values are not.
        wide = pa.array([list(map(float, r)) for r in b[emb]], pa.list_(pa.float64()))
        pq.write_table(table.set_column(index, "embedding", wide), second)
        with pytest.raises(TableError) as exc:
            read_split(root, "test")
        message = str(exc.value)
        assert message.startswith(f"{second}: column 'embedding' has type list<")
        assert "double>, but fixed_size_list<" in message
        assert message.endswith(f"in {first} (all files of a folder must share one schema)")
        write_split(root, "test", **b, part="part-00001")


def test_parts_with_other_columns_name_both_files(root: str) -> None:
    a, b = _two_parts(root)
    first, second = _part(root, "texts", 0), _part(root, "texts", 1)
    # An extra column only in the second part (it used to be dropped silently).
    _write_texts(
        second,
        b,
        norm=pa.array(b["text_norms"]),
        level=pa.array(np.arange(4)),
        source=pa.array(["x"] * 4),
    )
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert str(exc.value).startswith(f"{first}: missing column 'source' present in {second}")
    # An extra column of another type.
    _write_texts(
        second, b, norm=pa.array(b["text_norms"]), level=pa.array(np.arange(4, dtype=np.int32))
    )
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert str(exc.value).startswith(
        f"{second}: column 'level' has type int32, but int64 in {first}"
    )
    # `norm` in one part only, then as float64 beside float32.
    _write_texts(second, b, level=pa.array(np.arange(4)))
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert str(exc.value).startswith(f"{second}: missing column 'norm' present in {first}")
    _write_texts(
        second, b, level=pa.array(np.arange(4)), norm=pa.array(b["text_norms"].astype(np.float64))
    )
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    assert str(exc.value).startswith(f"{second}: column 'norm' has type double, but float in")
    # Image side: an extra image column missing in one part.
    write_split(root, "test", **b, part="part-00001")
    write_split(root, "test", **a, part="part-00000", extra_image_columns={"label": np.arange(3)})
    with pytest.raises(TableError) as exc:
        read_split(root, "test")
    img0, img1 = _part(root, "images", 0), _part(root, "images", 1)
    assert str(exc.value).startswith(f"{img1}: missing column 'label' present in {img0}")


# -- image norms, pre-projection columns and the projection file ------------------------------

PRE = {"image": 6, "text": 5}


@pytest.fixture
def pre_root(tmp_path: Path) -> str:
    r = str(tmp_path / "pre")
    write_manifest(r, {"dim": DIM, "model": "m", "pre_dim": PRE})
    return r


def _pre_data(seed: int = 0) -> dict:
    d = _data(seed)
    rng = np.random.default_rng(seed + 100)
    d.update(
        image_norms=rng.uniform(5.0, 15.0, 5).astype(np.float32),
        image_features_pre=rng.standard_normal((5, PRE["image"])).astype(np.float32),
        text_features_pre=rng.standard_normal((12, PRE["text"])).astype(np.float32),
    )
    return d


def test_pre_projection_columns_round_trip(pre_root: str) -> None:
    d = _pre_data()
    write_split(pre_root, "test", **d)
    s = read_split(pre_root, "test")
    assert s.manifest.pre_dim == PRE
    np.testing.assert_array_equal(s.image_norms, d["image_norms"])
    np.testing.assert_array_equal(s.image_features_pre, d["image_features_pre"])
    np.testing.assert_array_equal(s.text_features_pre, d["text_features_pre"])
    assert s.extra_image_columns == {}  # norm and the features are contract columns
    img_file, txt_file = _split_files(pre_root)
    field = pq.read_schema(img_file).field("image_features_pre")
    assert field.type == pa.list_(pa.float32(), PRE["image"])
    sub = s.subset(np.array([3, 1]), np.flatnonzero(np.isin(s.text_image_index, [3, 1])))
    np.testing.assert_array_equal(sub.image_features_pre, d["image_features_pre"][[3, 1]])
    np.testing.assert_array_equal(sub.image_norms, d["image_norms"][[3, 1]])
    rows = np.flatnonzero(np.isin(s.text_image_index, [3, 1]))
    np.testing.assert_array_equal(sub.text_features_pre, d["text_features_pre"][rows])
    # absent columns cost nothing and read as None
    plain = str(Path(pre_root).parent / "plain")
    write_manifest(plain, {"dim": DIM, "model": "m"})
    write_split(plain, "test", **_data())
    s = read_split(plain, "test")
    assert s.image_norms is s.image_features_pre is s.text_features_pre is None


def test_pre_projection_wrong_width_nan_and_missing_pre_dim(pre_root: str, root: str) -> None:
    d = _pre_data()
    write_split(pre_root, "test", **d)
    img, txt = _split_files(pre_root)
    table = pq.read_table(txt)
    bad = d["text_features_pre"].tolist()
    bad[4] = bad[4][:-1]
    col = pa.array(bad, type=pa.list_(pa.float32()))
    pq.write_table(
        table.set_column(table.column_names.index("text_features_pre"), "text_features_pre", col),
        txt,
    )
    with pytest.raises(TableError) as exc:
        read_split(pre_root, "test")
    _assert_row_error(exc, txt, 4, "c4", "text_features_pre has length 4, manifest pre_dim.text")

    write_split(pre_root, "test", **d)
    table = pq.read_table(img)
    nan = d["image_features_pre"].copy()
    nan[2, 1] = np.nan
    col = pa.FixedSizeListArray.from_arrays(pa.array(nan.ravel()), PRE["image"])
    pq.write_table(
        table.set_column(table.column_names.index("image_features_pre"), "image_features_pre", col),
        img,
    )
    with pytest.raises(TableError) as exc:
        read_split(pre_root, "test")
    _assert_row_error(exc, img, 2, "img2", "image_features_pre has NaN/inf")

    # a manifest without pre_dim: refused on write, and on read of a foreign file
    with pytest.raises(ValueError, match="no pre_dim.image"):
        write_split(root, "test", **d)
    write_split(pre_root, "test", **d)
    shutil.copytree(os.path.join(pre_root, "test"), os.path.join(root, "test"))
    with pytest.raises(TableError, match="present but the manifest has no pre_dim.image"):
        read_split(root, "test")
    with pytest.raises(ValueError, match="width 6, manifest pre_dim.text is 5"):
        write_split(pre_root, "test", **{**d, "text_features_pre": np.zeros((12, 6))})
    with pytest.raises(TableError, match="'pre_dim' must map"):
        write_manifest(str(Path(root).parent / "x"), {"dim": 2, "model": "m", "pre_dim": [3]})


@pytest.mark.parametrize("bad", [0.0, np.nan, 1e9])
def test_bad_image_norm_is_named(pre_root: str, bad: float) -> None:
    d = _pre_data()
    write_split(pre_root, "test", **d)
    img, _ = _split_files(pre_root)
    table = pq.read_table(img)
    norms = d["image_norms"].copy()
    norms[3] = bad
    pq.write_table(
        table.set_column(table.column_names.index("norm"), "norm", pa.array(norms, pa.float32())),
        img,
    )
    with pytest.raises(TableError) as exc:
        read_split(pre_root, "test")
    _assert_row_error(exc, img, 3, "img3", "norm is")
    if not bad > 0 or not np.isfinite(bad):  # the writer checks positivity; the spread is read's
        with pytest.raises(ValueError, match="image_norms row 3"):
            write_split(pre_root, "test", **{**d, "image_norms": norms})


def _projection_round_trip(root: str) -> None:
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


def test_projection_file(pre_root: str) -> None:
    _projection_round_trip(pre_root)
    with pytest.raises(ValueError, match="NaN/inf"):
        tables.write_projection(pre_root, image=np.full((DIM, 6), np.nan))


def test_projection_file_on_s3(s3_server) -> None:
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server}).mkdir("bucket")
    root = "s3://bucket/tables"
    write_manifest(root, {"dim": DIM, "model": "m", "pre_dim": PRE})
    _projection_round_trip(root)
