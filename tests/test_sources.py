"""Readers of asymvlm.data.sources on small files written in each data set's real format."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from asymvlm.data.sources import (
    CAPTION_SCHEMA,
    IMAGE_SCHEMA,
    PROMPT_SCHEMA,
    READERS,
    SourceError,
    open_fs,
    read_source,
)
from asymvlm.data.templates import (
    GENERIC_TEMPLATES,
    IMAGENET_CLASSES,
    TEMPLATES,
    imagenet_class_names,
    templates_for,
)
from tests.helpers import HIERARCAPS


def write_json(path: Path, obj) -> str:
    path.write_text(json.dumps(obj))
    return str(path)


def rows(table: pa.Table) -> list[dict]:
    return table.to_pylist()


def check_contract(data) -> None:
    assert data.images.schema == IMAGE_SCHEMA
    assert data.captions.schema.names[:3] == CAPTION_SCHEMA.names
    ids = data.images["image_id"].to_pylist()
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    keys = list(
        zip(
            data.captions["image_id"].to_pylist(),
            data.captions["caption_id"].to_pylist(),
            strict=True,
        )
    )
    assert keys == sorted(keys)
    assert set(data.captions["image_id"].to_pylist()) <= set(ids)
    json.dumps(data.description)  # goes into the manifest
    assert data.description["counts"]["images"] == data.images.num_rows


def test_registry_and_unknown_dataset():
    assert set(READERS) == {
        "coco",
        "coco-karpathy",
        "flickr30k",
        "cc",
        "hierarcaps",
        "cifar10",
        "cifar100",
        "stl10",
        "imagenet",
    }
    with pytest.raises(ValueError, match="unknown data set 'nope'"):
        read_source("nope", annotations=None, images=None, split="test")


@pytest.mark.parametrize("dataset", ["hierarcaps", "coco"])
def test_a_folder_given_for_an_annotation_file_is_named(dataset, tmp_path):
    with pytest.raises(SourceError, match=rf"^{tmp_path}: a folder; this reads a file"):
        read_source(dataset, annotations=str(tmp_path), images=str(tmp_path), split="test")


def test_open_fs_local_and_s3_endpoint(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("hi")
    fs, path = open_fs(str(tmp_path / "a.txt"))
    with fs.open(path, "rb") as f:
        assert f.read() == b"hi"
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    fs, path = open_fs("s3://bucket/some/key.json")
    assert path == "bucket/some/key.json"
    assert fs.endpoint_url == "http://127.0.0.1:9"
    assert fs.config_kwargs["retries"]["mode"] == "standard"


# -- COCO --------------------------------------------------------------------------------------
def coco_doc() -> dict:
    return {
        "info": {},
        "licenses": [],
        "images": [
            {"id": 397133, "file_name": "000000397133.jpg", "height": 427, "width": 640},
            {"id": 37777, "file_name": "000000037777.jpg", "height": 230, "width": 352},
        ],
        "annotations": [
            {"image_id": 397133, "id": 370509, "caption": "A man is in a kitchen making pizzas."},
            {"image_id": 37777, "id": 9, "caption": "  The dining table near the kitchen \n"},
            {"image_id": 397133, "id": 375000, "caption": "   "},
        ],
    }


def test_coco(tmp_path):
    ann = write_json(tmp_path / "captions_val2017.json", coco_doc())
    data = read_source("coco", annotations=ann, images="s3://bucket/val2017/", split="val")
    check_contract(data)
    assert rows(data.images.select(["image_id", "path"])) == [
        {"image_id": "37777", "path": "s3://bucket/val2017/000000037777.jpg"},
        {"image_id": "397133", "path": "s3://bucket/val2017/000000397133.jpg"},
    ]
    assert rows(data.captions) == [
        {"caption_id": "9", "image_id": "37777", "text": "The dining table near the kitchen"},
        {
            "caption_id": "370509",
            "image_id": "397133",
            "text": "A man is in a kitchen making pizzas.",
        },
        {"caption_id": "375000", "image_id": "397133", "text": ""},  # empty kept
    ]
    assert data.description["split"] == "val"
    assert data.description["counts"] == {"images": 2, "captions": 3}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda d: d["annotations"][1].pop("caption"),
            r"annotations\[1\]\.caption: Field required",
        ),
        (
            lambda d: d["annotations"][0].update(image_id=5),
            r"annotations\[0\]: image_id 5 is not in 'images'",
        ),
        (
            lambda d: d["images"][1].update(file_name=None),
            r"images\[1\]\.file_name: Input should be a valid string",
        ),
        (lambda d: d["images"][1].update(id=397133), r"images\[1\]: duplicate image id 397133"),
        (lambda d: d.pop("annotations"), r"captions_val2017\.json: annotations: Field required"),
    ],
)
def test_coco_malformed(tmp_path, mutate, message):
    doc = coco_doc()
    mutate(doc)
    ann = write_json(tmp_path / "captions_val2017.json", doc)
    with pytest.raises(SourceError, match=message) as info:
        read_source("coco", annotations=ann, images=str(tmp_path), split="val")
    assert str(info.value).startswith(f"{ann}: ")


# -- Karpathy splits ---------------------------------------------------------------------------
def karpathy_coco() -> dict:
    def item(cocoid, split, sentids, folder="val2014"):
        return {
            "filepath": folder,
            "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
            "imgid": cocoid % 100,
            "split": split,
            "cocoid": cocoid,
            "sentids": sentids,
            "sentences": [
                {"tokens": ["a"], "raw": f" caption {s} of {cocoid}.", "imgid": 0, "sentid": s}
                for s in sentids
            ],
        }

    images = [
        item(11, "train", [1, 2], "train2014"),
        item(22, "restval", [3]),
        item(33, "val", [4, 5]),
        item(44, "test", [6]),
        item(55, "test", [7, 8]),
    ]
    return {"dataset": "coco", "images": images}


@pytest.mark.parametrize(
    "split, expected",
    [("train", ["11", "22"]), ("restval", ["22"]), ("val", ["33"]), ("test", ["44", "55"])],
)
def test_coco_karpathy_splits(tmp_path, split, expected):
    ann = write_json(tmp_path / "dataset_coco.json", karpathy_coco())
    data = read_source("coco-karpathy", annotations=ann, images="/data/coco", split=split)
    check_contract(data)
    assert data.images["image_id"].to_pylist() == expected
    if split == "train":
        assert data.images["path"].to_pylist() == [
            "/data/coco/train2014/COCO_train2014_000000000011.jpg",
            "/data/coco/val2014/COCO_val2014_000000000022.jpg",
        ]
        assert rows(data.captions) == [
            {"caption_id": "1", "image_id": "11", "text": "caption 1 of 11."},
            {"caption_id": "2", "image_id": "11", "text": "caption 2 of 11."},
            {"caption_id": "3", "image_id": "22", "text": "caption 3 of 22."},
        ]
    if split == "test":
        assert data.captions["caption_id"].to_pylist() == ["6", "7", "8"]


def test_coco_karpathy_errors(tmp_path):
    doc = karpathy_coco()
    del doc["images"][3]["sentences"][0]["raw"]
    ann = write_json(tmp_path / "dataset_coco.json", doc)
    with pytest.raises(
        SourceError, match=r"dataset_coco\.json: images\[3\]\.sentences\[0\]\.raw: Field required"
    ):
        read_source("coco-karpathy", annotations=ann, images="/x", split="val")
    with pytest.raises(ValueError, match="split must be one of"):
        read_source("coco-karpathy", annotations=ann, images="/x", split="dev")
    doc = karpathy_coco()
    doc["images"][4]["sentences"][1]["sentid"] = 1
    ann = write_json(tmp_path / "dataset_coco.json", doc)
    with pytest.raises(SourceError, match=r"images\[4\]\.sentences\[1\]: duplicate sentid 1"):
        read_source("coco-karpathy", annotations=ann, images="/x", split="test")


# -- Flickr30k ---------------------------------------------------------------------------------
def test_flickr30k_karpathy_json(tmp_path):
    doc = {
        "dataset": "flickr30k",
        "images": [
            {
                "filename": name,
                "imgid": k,
                "split": split,
                "sentids": [10 * k, 10 * k + 1],
                "sentences": [
                    {"raw": f"{name} a", "sentid": 10 * k, "imgid": k, "tokens": []},
                    {"raw": f"{name} b", "sentid": 10 * k + 1, "imgid": k, "tokens": []},
                ],
            }
            for k, (name, split) in enumerate(
                [("1000092795.jpg", "train"), ("10002456.jpg", "test"), ("1001465944.jpg", "test")]
            )
        ],
    }
    ann = write_json(tmp_path / "dataset_flickr30k.json", doc)
    data = read_source("flickr30k", annotations=ann, images="/f30k/images", split="test")
    check_contract(data)
    assert data.images["image_id"].to_pylist() == ["10002456", "1001465944"]
    assert data.images["path"].to_pylist()[0] == "/f30k/images/10002456.jpg"
    assert data.captions["caption_id"].to_pylist() == ["10", "11", "20", "21"]
    assert data.captions["text"].to_pylist()[0] == "10002456.jpg a"
    assert data.description["format"] == "karpathy-json"


FLICKR_CSV = """image_name| comment_number| comment
1000092795.jpg| 0| Two young guys with shaggy hair look at their hands while hanging out .
1000092795.jpg| 1| Two young , White males are outside near many bushes .
10002456.jpg| 0| Several men in hard hats are operating a giant pulley system .
2199200615.jpg| 4   A dog runs across the grass .
10002456.jpg| 1|
"""


def test_flickr30k_results_csv(tmp_path):
    ann = tmp_path / "results.csv"
    ann.write_text(FLICKR_CSV)
    data = read_source("flickr30k", annotations=str(ann), images="/f30k", split="all")
    check_contract(data)
    assert rows(data.images.select(["image_id", "path"])) == [
        {"image_id": "1000092795", "path": "/f30k/1000092795.jpg"},
        {"image_id": "10002456", "path": "/f30k/10002456.jpg"},
        {"image_id": "2199200615", "path": "/f30k/2199200615.jpg"},
    ]
    assert rows(data.captions) == [
        {
            "caption_id": "1000092795#0",
            "image_id": "1000092795",
            "text": "Two young guys with shaggy hair look at their hands while hanging out .",
        },
        {
            "caption_id": "1000092795#1",
            "image_id": "1000092795",
            "text": "Two young , White males are outside near many bushes .",
        },
        {
            "caption_id": "10002456#0",
            "image_id": "10002456",
            "text": "Several men in hard hats are operating a giant pulley system .",
        },
        {"caption_id": "10002456#1", "image_id": "10002456", "text": ""},
        {
            "caption_id": "2199200615#4",
            "image_id": "2199200615",
            "text": "A dog runs across the grass .",
        },
    ]
    assert data.description["split"] == "all"


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("10002456.jpg A man without separators", r"line 5: expected 'image_name\| comment_number"),
        ("10002456.jpg| x| text", r"line 5: caption number 'x' is not an integer"),
        ("10002456.jpg| 0| again", r"line 5: duplicate caption 10002456#0 \(also line 4\)"),
    ],
)
def test_flickr30k_results_csv_malformed(tmp_path, bad_line, message):
    lines = FLICKR_CSV.splitlines()
    lines.insert(4, bad_line)  # becomes line 5, after 10002456.jpg| 0
    ann = tmp_path / "results.csv"
    ann.write_text("\n".join(lines) + "\n")
    with pytest.raises(SourceError, match=r"results\.csv: " + message):
        read_source("flickr30k", annotations=str(ann), images="/f30k", split="all")


def test_flickr30k_token_and_unknown_extension(tmp_path):
    ann = tmp_path / "results_20130124.token"
    ann.write_text("1000092795.jpg#0\tTwo young guys .\n1000092795.jpg#1\tTwo males .\n")
    data = read_source("flickr30k", annotations=str(ann), images="/f", split="all")
    assert data.captions["caption_id"].to_pylist() == ["1000092795#0", "1000092795#1"]
    with pytest.raises(SourceError, match="cannot tell the format"):
        read_source("flickr30k", annotations=str(tmp_path / "x.xml"), images="/f", split="all")


@pytest.mark.parametrize(
    ("dataset", "name", "text", "message"),
    [
        ("coco", "c.json", '{"images": [\n{"id": 1,}\n]}', r"Invalid JSON: .* line 2 column \d+"),
        ("flickr30k", "r.token", "a.jpg#0\tok\nbroken line\n", r"line 2: expected 'NAME\.jpg#N"),
        ("cc", "gcc.tsv", "ok\ta.jpg\ncap\twith\ttabs.jpg\n", r"line 2: expected 'caption<TAB>pa"),
        (
            "hierarcaps",
            "h.csv",
            "id,captions,image_url\n0,a => b => c => d,http://x/1.jpg\n"
            '1,"a => b\nwith newline => c => d",http://x/2.jpg\n2,a => b => c,http://x/3.jpg\n',
            r"line 5: expected 4 levels",
        ),
    ],
)
def test_malformed_text_names_file_and_line(tmp_path, dataset, name, text, message):
    ann = tmp_path / name
    ann.write_text(text)
    with pytest.raises(SourceError, match=rf"^{ann}: {message}"):
        read_source(dataset, annotations=str(ann), images="/x", split="all")


# -- Conceptual Captions -----------------------------------------------------------------------
def sha16(path: str) -> str:
    return hashlib.sha1(path.encode()).hexdigest()[:16]


def write_cc_tsv(tmp_path: Path, n: int = 40) -> Path:
    lines = [f"caption number {i} \timages/{i:05d}.jpg" for i in range(n)]
    ann = tmp_path / "cc_train.tsv"
    ann.write_text("\n".join(lines) + "\n")
    return ann


def test_cc_tsv(tmp_path):
    ann = tmp_path / "gcc.tsv"
    ann.write_text(
        "a dog on a beach\timages/00000.jpg\n"
        "a cat\t/abs/cat.png\n"
        "\n"
        "another caption of the dog\timages/00000.jpg\n"
        "remote\thttps://example.org/img.jpg\n"
    )
    data = read_source("cc", annotations=str(ann), images=None, split="train")
    check_contract(data)
    dog, cat, remote = (
        sha16("images/00000.jpg"),
        sha16("/abs/cat.png"),
        sha16("https://example.org/img.jpg"),
    )
    paths = dict(
        zip(data.images["image_id"].to_pylist(), data.images["path"].to_pylist(), strict=True)
    )
    assert paths == {
        dog: f"{tmp_path}/images/00000.jpg",
        cat: "/abs/cat.png",
        remote: "https://example.org/img.jpg",
    }
    by_id = {r["caption_id"]: r for r in rows(data.captions)}
    assert by_id[f"{dog}-0"]["text"] == "a dog on a beach"
    assert by_id[f"{dog}-1"]["text"] == "another caption of the dog"
    assert by_id[f"{cat}-0"]["image_id"] == cat
    assert data.description["format"] == "cc-tsv"
    # relative paths resolve against `images` when given
    data = read_source("cc", annotations=str(ann), images="s3://b/cc", split="train")
    assert "s3://b/cc/images/00000.jpg" in data.images["path"].to_pylist()


def test_cc_parquet(tmp_path):
    ann = tmp_path / "cc.parquet"
    pq.write_table(
        pa.table({"caption": [" b ", None, "a"], "url": ["/x/2.jpg", "/x/3.jpg", "/x/1.jpg"]}), ann
    )
    data = read_source("cc", annotations=str(ann), images=None, split="train")
    check_contract(data)
    texts = dict(
        zip(data.captions["image_id"].to_pylist(), data.captions["text"].to_pylist(), strict=True)
    )
    assert texts == {sha16("/x/2.jpg"): "b", sha16("/x/3.jpg"): "", sha16("/x/1.jpg"): "a"}
    pq.write_table(
        pa.table(
            {"key": ["000000002", "000000001"], "caption": ["b", "a"], "path": ["2.jpg", "1.jpg"]}
        ),
        ann,
    )
    data = read_source("cc", annotations=str(ann), images="/imgs", split="train")
    assert rows(data.images.select(["image_id", "path"])) == [
        {"image_id": "000000001", "path": "/imgs/1.jpg"},
        {"image_id": "000000002", "path": "/imgs/2.jpg"},
    ]
    assert data.captions["caption_id"].to_pylist() == ["000000001-0", "000000002-0"]
    pq.write_table(pa.table({"caption": ["a"], "file": ["1.jpg"]}), ann)
    with pytest.raises(SourceError, match=r"cc\.parquet: needs columns 'caption' and 'path'"):
        read_source("cc", annotations=str(ann), images=None, split="train")


def encoded(color, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buffer, format=fmt)
    return buffer.getvalue()


def add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def write_shards(folder: Path) -> dict[str, tuple[bytes, str]]:
    """Two img2dataset-style shards; returns key -> (image bytes, caption)."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = {}
    for shard in range(2):
        with tarfile.open(folder / f"{shard:05d}.tar", "w") as tar:
            for i in range(3):
                key = f"{shard:05d}{i:04d}"
                fmt = "PNG" if i == 1 else "JPEG"
                image = encoded((40 * i, 100 * shard, 7), fmt)
                caption = f" shard {shard} sample {i} "
                add_member(tar, f"{key}.{'png' if fmt == 'PNG' else 'jpg'}", image)
                add_member(tar, f"{key}.txt", caption.encode())
                add_member(tar, f"{key}.json", json.dumps({"key": key}).encode())
                expected[key] = (image, caption.strip())
            # a long file name goes through a GNU long-name header: offsets must still be right
            key = f"{shard:05d}9999_" + "x" * 120
            image = encoded((1, 2, 3), "JPEG")
            add_member(tar, f"{key}.jpg", image)
            add_member(tar, f"{key}.txt", b"long")
            expected[key] = (image, "long")
    (folder / "readme.md").write_text("not a shard")
    return expected


@pytest.mark.parametrize("form", ["folder", "glob", "file"])
def test_cc_webdataset(tmp_path, form):
    expected = write_shards(tmp_path / "shards")
    ann = {
        "folder": str(tmp_path / "shards"),
        "glob": str(tmp_path / "shards" / "*.tar"),
        "file": str(tmp_path / "shards" / "00001.tar"),
    }[form]
    data = read_source("cc", annotations=ann, images=None, split="train")
    check_contract(data)
    if form == "file":
        expected = {k: v for k, v in expected.items() if k.startswith("00001")}
    assert data.images["image_id"].to_pylist() == sorted(expected)
    for row in rows(data.images):
        with open(row["path"], "rb") as f:
            f.seek(row["offset"])
            assert f.read(row["length"]) == expected[row["image_id"]][0]
        assert row["path"].endswith(row["image_id"][:5] + ".tar")
        assert row["data"] is None
    assert data.captions["caption_id"].to_pylist() == [f"{k}-0" for k in sorted(expected)]
    assert data.captions["text"].to_pylist() == [expected[k][1] for k in sorted(expected)]
    assert data.description["shards"] == (1 if form == "file" else 2)


def test_cc_webdataset_errors(tmp_path):
    with tarfile.open(tmp_path / "00000.tar", "w") as tar:
        add_member(tar, "a.jpg", b"x")
        add_member(tar, "a.txt", b"a")
    with tarfile.open(tmp_path / "00001.tar", "w") as tar:
        add_member(tar, "a.jpg", b"y")
    with pytest.raises(SourceError, match=r"00001\.tar: sample key 'a' also in .*00000\.tar"):
        read_source("cc", annotations=str(tmp_path), images=None, split="train")
    with tarfile.open(tmp_path / "00001.tar", "w") as tar:
        add_member(tar, "b.txt", b"caption without image")
    with pytest.raises(SourceError, match=r"00001\.tar: sample 'b' has a caption but no image"):
        read_source("cc", annotations=str(tmp_path), images=None, split="train")
    (tmp_path / "00001.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(SourceError, match=r"00001\.tar: not a readable uncompressed tar"):
        read_source("cc", annotations=str(tmp_path), images=None, split="train")
    with pytest.raises(SourceError, match="no .tar shards"):
        read_source("cc", annotations=str(tmp_path / "empty*.tar"), images=None, split="train")


# -- selection ---------------------------------------------------------------------------------
def test_sampling_is_reproducible(tmp_path):
    ann = str(write_cc_tsv(tmp_path, 40))

    def sample(seed, n=10):
        return read_source("cc", annotations=ann, images=None, split="train", sample=n, seed=seed)

    a, b, c = sample(0), sample(0), sample(1)
    check_contract(a)
    assert a.images.equals(b.images) and a.captions.equals(b.captions)
    ids = a.images["image_id"].to_pylist()
    assert len(ids) == 10 and a.description["sampled_ids"] == ids
    assert set(ids) != set(c.images["image_id"].to_pylist())
    assert a.captions["image_id"].to_pylist() == ids  # one caption per image follows it
    everything = sorted(sha16(f"images/{i:05d}.jpg") for i in range(40))
    picked = np.random.default_rng(0).choice(40, size=10, replace=False)
    assert ids == sorted(everything[i] for i in picked)
    assert a.description["sample"] == 10 and a.description["seed"] == 0
    with pytest.raises(SourceError, match="sample=41 but only 40 ids"):
        sample(0, 41)


def test_id_list(tmp_path):
    ann = str(write_cc_tsv(tmp_path, 20))
    wanted = [sha16(f"images/{i:05d}.jpg") for i in (3, 17, 5)]
    id_list = tmp_path / "cc200k_ids.txt"
    id_list.write_text("\n".join(wanted) + "\n\n")
    data = read_source("cc", annotations=ann, images=None, split="train", id_list=str(id_list))
    check_contract(data)
    assert data.images["image_id"].to_pylist() == sorted(wanted)
    assert data.captions.num_rows == 3
    assert data.description["id_list"] == str(id_list)
    both = read_source(
        "cc", annotations=ann, images=None, split="train", id_list=str(id_list), sample=2, seed=3
    )
    assert set(both.images["image_id"].to_pylist()) < set(wanted)
    id_list.write_text(f"{wanted[0]}\ndeadbeefdeadbeef\n")
    with pytest.raises(
        SourceError, match=r"cc200k_ids\.txt: line 2: unknown id 'deadbeefdeadbeef'"
    ):
        read_source("cc", annotations=ann, images=None, split="train", id_list=str(id_list))


def test_rereads_are_identical(tmp_path):
    write_shards(tmp_path / "shards")
    a = read_source("cc", annotations=str(tmp_path / "shards"), images=None, split="train")
    b = read_source("cc", annotations=str(tmp_path / "shards"), images=None, split="train")
    assert a.images.equals(b.images) and a.captions.equals(b.captions)
    assert a.description == b.description


# -- HierarCaps (real data) --------------------------------------------------------------------
@pytest.mark.skipif(HIERARCAPS is None, reason="no real HierarCaps copy")
def test_hierarcaps_real(tmp_path):
    ann = tmp_path / "hierarcaps_test.csv"
    shutil.copy(HIERARCAPS / "hierarcaps_test.csv", ann)
    folder = str(HIERARCAPS / "images")
    data = read_source("hierarcaps", annotations=str(ann), images=folder, split="test")
    check_contract(data)
    assert data.images.num_rows == 1000 and data.captions.num_rows == 4000
    files = {p.stem for p in (HIERARCAPS / "images").glob("*.jpg")}
    assert set(data.images["image_id"].to_pylist()) == files
    assert all(p.startswith(folder + "/COCO_val2014_") for p in data.images["path"].to_pylist())
    assert Path(data.images["path"][0].as_py()).is_file()
    levels = data.captions["level"].to_pylist()
    assert data.captions.schema.field("level").type == pa.int64()
    assert {lv: levels.count(lv) for lv in set(levels)} == {0: 1000, 1: 1000, 2: 1000, 3: 1000}
    first = [r for r in rows(data.captions) if r["caption_id"].startswith("0-")]
    assert [r["text"] for r in first] == [
        "table",
        "table with plates",
        "table with three plates, with man and woman holding utensil",
        "A table with three plates with food and a man and a woman both holding utensil near "
        "plates.",
    ]
    assert [r["level"] for r in first] == [0, 1, 2, 3]
    assert {r["image_id"] for r in first} == {"COCO_val2014_000000301718"}
    assert data.description["counts"] == {"images": 1000, "captions": 4000}


# -- CIFAR / STL-10 ----------------------------------------------------------------------------
def cifar_rows(rng, n):
    hwc = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    return hwc, hwc.transpose(0, 3, 1, 2).reshape(n, 3072)  # rows are CHW, as the real files


def dump(path: Path, obj, protocol=2, numpy1=False) -> None:
    raw = pickle.dumps(obj, protocol=protocol)
    if numpy1:  # the real (2009, numpy 1) files name numpy.core, not numpy._core
        raw = raw.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
        assert b"numpy.core.multiarray" in raw
    path.write_bytes(raw)


def decode_png(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def test_cifar10(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    names = [b"airplane", b"automobile", b"bird"]
    dump(
        root / "batches.meta", {b"num_cases_per_batch": 3, b"label_names": names, b"num_vis": 3072}
    )
    train_hwc, train_labels = [], []
    for b in range(1, 6):
        hwc, flat = cifar_rows(rng, 3)
        labels = [(b + i) % 3 for i in range(3)]
        dump(
            root / f"data_batch_{b}",
            {
                b"batch_label": f"training batch {b} of 5".encode(),
                b"labels": labels,
                b"data": flat,
                b"filenames": [f"{b}_{i}.png".encode() for i in range(3)],
            },
            protocol=5 if b == 5 else 2,
            numpy1=b == 1,
        )
        train_hwc.append(hwc)
        train_labels += labels
    hwc, flat = cifar_rows(rng, 4)
    dump(
        root / "test_batch",
        {b"batch_label": b"testing batch 1 of 1", b"labels": [2, 1, 0, 2], b"data": flat},
    )

    # the parent folder works too (the archive's top folder is found)
    data = read_source("cifar10", annotations=None, images=str(tmp_path), split="train")
    check_contract(data)
    assert data.images["image_id"].to_pylist() == [f"cifar10-train-{i:05d}" for i in range(15)]
    assert data.images["label"].to_pylist() == train_labels
    assert data.images["path"].null_count == 15
    want = np.concatenate(train_hwc)
    for i, png in enumerate(data.images["data"].to_pylist()):
        np.testing.assert_array_equal(decode_png(png), want[i])
    assert data.captions.num_rows == 0
    assert data.prompts.schema == PROMPT_SCHEMA
    assert data.prompts.num_rows == 3 * 18  # CLIP's 18 CIFAR templates
    assert rows(data.prompts)[len(templates_for("cifar10"))] == {
        "class_index": 1,
        "class_name": "automobile",
        "template": templates_for("cifar10")[0],
        "text": "a photo of a automobile.",
    }
    assert data.description["classes"] == ["airplane", "automobile", "bird"]
    assert data.description["counts"]["prompts"] == 54

    test = read_source(
        "cifar10",
        annotations=str(root),
        images=None,
        split="test",
        templates=["a {}", "art of the {}"],
        sample=2,
        seed=0,
    )
    assert test.images.num_rows == 2
    for row in rows(test.images):
        index = int(row["image_id"].rsplit("-", 1)[1])
        np.testing.assert_array_equal(decode_png(row["data"]), hwc[index])
        assert row["label"] == [2, 1, 0, 2][index]
    assert test.prompts["text"].to_pylist() == [
        "a airplane",
        "art of the airplane",
        "a automobile",
        "art of the automobile",
        "a bird",
        "art of the bird",
    ]

    dump(root / "test_batch", {b"labels": [0, 1, 5, 2], b"data": flat})
    with pytest.raises(SourceError, match=r"test_batch: labels\[2\] = 5 outside 0\.\.2"):
        read_source("cifar10", annotations=None, images=str(root), split="test")
    dump(root / "test_batch", {b"labels": [0, 1, 1, 2]})
    with pytest.raises(SourceError, match=r"test_batch: missing key b'data'"):
        read_source("cifar10", annotations=None, images=str(root), split="test")


def test_pickle_with_code_is_refused(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    dump(root / "batches.meta", {b"label_names": [b"a"], b"x": Evil()})
    with pytest.raises(
        SourceError, match=r"batches\.meta: not a CIFAR pickle .*refusing to load .*print"
    ):
        read_source("cifar10", annotations=None, images=str(root), split="test")


def test_cifar100(tmp_path):
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    rng = np.random.default_rng(1)
    fine = [f"class_{i}".encode() for i in range(5)] + [b"aquarium_fish"]
    dump(root / "meta", {b"fine_label_names": fine, b"coarse_label_names": [b"fish", b"other"]})
    hwc, flat = cifar_rows(rng, 6)
    dump(
        root / "test",
        {
            b"filenames": [b"f.png"] * 6,
            b"batch_label": b"testing batch 1 of 1",
            b"fine_labels": [5, 4, 3, 2, 1, 0],
            b"coarse_labels": [0, 1, 1, 1, 1, 1],
            b"data": flat,
        },
    )
    data = read_source("cifar100", annotations=None, images=str(root), split="test")
    check_contract(data)
    assert data.images["image_id"].to_pylist()[-1] == "cifar100-test-00005"
    assert data.images["label"].to_pylist() == [5, 4, 3, 2, 1, 0]
    np.testing.assert_array_equal(decode_png(data.images["data"][3].as_py()), hwc[3])
    first = rows(data.prompts.filter(pa.compute.equal(data.prompts["class_index"], 5)))[0]
    assert first["class_name"] == "aquarium_fish" and first["text"] == "a photo of a aquarium fish."
    with pytest.raises(ValueError, match="split must be one of"):
        read_source("cifar100", annotations=None, images=str(root), split="val")


def write_stl10(folder: Path, split: str, hwc: np.ndarray, labels: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "class_names.txt").write_text("airplane\nbird\ncar\n")
    # column-major per channel: the (C, W, H) array in C order, as the official reader expects
    (folder / f"{split}_X.bin").write_bytes(hwc.transpose(0, 3, 2, 1).tobytes())
    (folder / f"{split}_y.bin").write_bytes(bytes(labels))


def test_stl10(tmp_path):
    rng = np.random.default_rng(2)
    hwc = rng.integers(0, 256, size=(4, 96, 96, 3), dtype=np.uint8)
    hwc[0, 0, :, 0] = 255  # top row red in the first image: catches an H/W swap
    hwc[0, 1:, :, 0] = 0
    folder = tmp_path / "stl10_binary"
    write_stl10(folder, "test", hwc, [1, 3, 2, 3])
    data = read_source("stl10", annotations=None, images=str(tmp_path), split="test")
    check_contract(data)
    assert data.images["image_id"].to_pylist() == [f"stl10-test-{i:05d}" for i in range(4)]
    assert data.images["label"].to_pylist() == [0, 2, 1, 2]
    for i, png in enumerate(data.images["data"].to_pylist()):
        np.testing.assert_array_equal(decode_png(png), hwc[i])
    assert data.prompts.num_rows == 3 * len(templates_for("stl10"))
    assert data.description["classes"] == ["airplane", "bird", "car"]

    write_stl10(folder, "test", hwc, [1, 3, 4, 3])
    with pytest.raises(SourceError, match=r"test_y\.bin: byte 2: label 4 outside 1\.\.3"):
        read_source("stl10", annotations=None, images=str(folder), split="test")
    (folder / "test_X.bin").write_bytes(b"\0" * 1000)
    with pytest.raises(SourceError, match=r"test_X\.bin: 1000 bytes is not a multiple of 27648"):
        read_source("stl10", annotations=None, images=str(folder), split="test")


# -- ImageNet-style folders --------------------------------------------------------------------
def write_imagenet(root: Path) -> None:
    for wnid, files in {
        "n01440764": ["n01440764_10026.JPEG", "n01440764_2.JPEG"],
        "n01443537": ["ILSVRC2012_val_00000001.JPEG", "sub/deeper.png"],
        "n01484850": [],
    }.items():
        (root / wnid).mkdir(parents=True)
        for name in files:
            (root / wnid / name).parent.mkdir(parents=True, exist_ok=True)
            (root / wnid / name).write_bytes(b"not decoded here")
    (root / "n01440764" / "notes.txt").write_text("skip me")
    (root / "LOC_synset_mapping.txt").write_text("in the root, not a class")


def test_imagenet(tmp_path):
    root = tmp_path / "val"
    write_imagenet(root)
    mapping = tmp_path / "LOC_synset_mapping.txt"
    mapping.write_text(
        "n01440764 tench, Tinca tinca\nn01443537 goldfish, Carassius auratus\n"
        "n01484850 great white shark, white shark\nn01491361 tiger shark\n"
    )
    data = read_source("imagenet", annotations=str(mapping), images=str(root), split="val")
    check_contract(data)
    assert rows(data.images.select(["image_id", "path", "label"])) == [
        {
            "image_id": "n01440764/n01440764_10026.JPEG",
            "path": f"{root}/n01440764/n01440764_10026.JPEG",
            "label": 0,
        },
        {
            "image_id": "n01440764/n01440764_2.JPEG",
            "path": f"{root}/n01440764/n01440764_2.JPEG",
            "label": 0,
        },
        {
            "image_id": "n01443537/ILSVRC2012_val_00000001.JPEG",
            "path": f"{root}/n01443537/ILSVRC2012_val_00000001.JPEG",
            "label": 1,
        },
        {
            "image_id": "n01443537/sub/deeper.png",
            "path": f"{root}/n01443537/sub/deeper.png",
            "label": 1,
        },
    ]
    assert data.description["classes"] == ["tench", "goldfish", "great white shark"]
    assert data.prompts.num_rows == 3 * len(templates_for("imagenet"))
    assert data.prompts["text"][-1].as_py() == "a tattoo of the great white shark."

    keras = write_json(
        tmp_path / "imagenet_class_index.json",
        {
            "0": ["n01440764", "tench"],
            "1": ["n01443537", "goldfish"],
            "2": ["n01484850", "great_white_shark"],
        },
    )
    data = read_source("imagenet", annotations=keras, images=str(root), split="val")
    assert data.prompts["text"][-1].as_py() == "a tattoo of the great white shark."
    plain = read_source("imagenet", annotations=None, images=str(root), split="val")
    assert plain.description["classes"] == ["tench", "goldfish", "great white shark"]  # CLIP's

    mapping.write_text("n01440764 tench\nn01443537\n")
    with pytest.raises(
        SourceError, match=r"LOC_synset_mapping\.txt: line 2: expected 'folder name'"
    ):
        read_source("imagenet", annotations=str(mapping), images=str(root), split="val")
    mapping.write_text("n01440764 tench\nn01443537 goldfish\n")
    with pytest.raises(SourceError, match=r"no class name for folder 'n01484850'"):
        read_source("imagenet", annotations=str(mapping), images=str(root), split="val")


def test_templates_must_hold_a_slot(tmp_path):
    root = tmp_path / "val"
    write_imagenet(root)
    with pytest.raises(ValueError, match="templates must each hold one"):
        read_source("imagenet", annotations=None, images=str(root), split="val", templates=["x"])


def test_csv_field_over_the_csv_limit_names_file_and_line(tmp_path):
    """An unbalanced quote swallows the rest of the file into one field: a SourceError naming
    the line where the record starts, not a bare ``_csv.Error``."""
    ann = tmp_path / "hierarcaps_test.csv"
    rows = [
        "id,captions,image_url",
        "0,a => b => c => d,http://x/COCO_val2014_1.jpg",
        '1,"a => b => c => d,http://x/COCO_val2014_2.jpg',
    ]
    rows += [f"{i},{'word ' * 20} => b => c => d,http://x/{i}.jpg" for i in range(2, 2000)]
    ann.write_text("\n".join(rows) + "\n")
    with pytest.raises(SourceError) as exc:
        read_source("hierarcaps", annotations=str(ann), images=None, split="test")
    message = str(exc.value)
    assert message.startswith(f"{ann}: line 3: malformed CSV (field larger than field limit")
    assert "usually a quote opened on line 3 that is never closed" in message


def test_invalid_utf8_in_a_parquet_annotation_names_row_and_column(tmp_path):
    ann = tmp_path / "cc.parquet"
    captions = pa.array([b"fine", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"caption": captions, "path": ["/x/1.jpg", "/x/2.jpg"]}), ann)
    with pytest.raises(SourceError, match=r"cc\.parquet: row 1: column 'caption' is not UTF-8"):
        read_source("cc", annotations=str(ann), images=None, split="train")


def test_invalid_utf8_in_class_names_is_named(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    dump(root / "batches.meta", {b"label_names": [b"cat", b"d\xf6g"]})
    with pytest.raises(SourceError, match=r"batches\.meta: label_names\[1\]: class name is not"):
        read_source("cifar10", annotations=None, images=str(tmp_path), split="test")


# -- zero-shot templates -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dataset", "count"),
    [("cifar10", 18), ("cifar100", 18), ("stl10", 2), ("imagenet", 80), ("ImageNet1k", 80)],
)
def test_template_counts_per_data_set(dataset: str, count: int) -> None:
    templates = templates_for(dataset)
    assert len(templates) == count == len(set(templates))
    assert templates[0] in ("a photo of a {}.", "a bad photo of a {}.")


def test_templates_have_one_slot_and_others_get_the_generic_ones() -> None:
    assert templates_for("coco") == templates_for("no-such-set") == GENERIC_TEMPLATES
    assert len(GENERIC_TEMPLATES) == 5
    for templates in (*TEMPLATES.values(), GENERIC_TEMPLATES):
        for template in templates:
            assert template.count("{}") == 1 and not re.search(r"\{[^}]", template), template


def test_imagenet_class_names_are_clips_for_ilsvrc_synsets(tmp_path) -> None:
    wnids = list(IMAGENET_CLASSES)
    assert len(wnids) == 1000 and wnids == sorted(wnids)
    assert all(re.fullmatch(r"n\d{8}", w) for w in wnids)
    # CLIP's curated names, not WordNet's first lemma ("cock", "hammerhead", "water ouzel").
    assert imagenet_class_names(["n01514668", "n01494475", "n01601694"]) == [
        "rooster",
        "hammerhead shark",
        "American dipper",
    ]
    assert imagenet_class_names(["n01514668", "cats"]) is None
    assert imagenet_class_names([]) is None
    for folder in ("n01514668", "n15075141"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.JPEG").write_bytes(b"x")
    data = read_source("imagenet", annotations=None, images=str(tmp_path), split="val")
    assert data.description["classes"] == ["rooster", "toilet paper"]
    assert data.prompts["text"][80].as_py() == "a bad photo of a toilet paper."
    (tmp_path / "cats").mkdir()  # not an ImageNet synset: the folder names stay
    data = read_source("imagenet", annotations=None, images=str(tmp_path), split="val")
    assert data.description["classes"] == ["cats", "n01514668", "n15075141"]
