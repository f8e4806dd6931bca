"""Readers of asymvlm.data.sources on small files written in each data set's real format."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from asymvlm.data.demo_sets import write_hierarcaps_cifar
from asymvlm.data.sources import CAPTION_SCHEMA, IMAGE_SCHEMA, READERS, SourceError, read_source
from asymvlm.data.templates import GENERIC_TEMPLATES, TEMPLATES, imagenet_class_names
from asymvlm.data.templates import templates_for as tf
from asymvlm.storage import StorageError
from tests.helpers import HIERARCAPS, add_member, cifar_rows, dump, hierarcaps_subset, write_shards


def read(dataset, annotations=None, images=None, split="test", **kw):
    data = read_source(dataset, annotations=annotations, images=images, split=split, **kw)
    assert data.images.schema == IMAGE_SCHEMA
    assert data.captions.schema.names[:3] == CAPTION_SCHEMA.names
    ids = data.images["image_id"].to_pylist()
    assert ids == sorted(set(ids))
    keys = data.captions.select(["image_id", "caption_id"]).to_pylist()
    assert keys == sorted(keys, key=lambda k: tuple(k.values()))
    assert {k["image_id"] for k in keys} <= set(ids)
    assert json.loads(json.dumps(data.description))["counts"]["images"] == len(ids)
    return data


def write(path: Path, content) -> str:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def column(data, name, table="images"):
    return getattr(data, table)[name].to_pylist()


def sha16(path: str) -> str:
    return hashlib.sha1(path.encode()).hexdigest()[:16]


def test_registry_and_bad_requests(tmp_path):
    assert len(READERS) == 9 and "coco-karpathy" in READERS
    with pytest.raises(ValueError, match="unknown data set 'nope'"):
        read("nope")
    with pytest.raises(ValueError, match="templates must each hold one"):
        read("imagenet", images=str(tmp_path), templates=["x"])
    with pytest.raises(ValueError, match="coco: needs images="):
        read("coco", annotations=str(tmp_path))
    for dataset in ("coco-karpathy", "cifar100", "stl10"):
        with pytest.raises(ValueError, match="split must be one of"):
            read(dataset, str(tmp_path), str(tmp_path), split="dev")
    with pytest.raises(SourceError, match=rf"^{tmp_path}/x.csv: no such file"):
        read("hierarcaps", annotations=str(tmp_path / "x.csv"))
    with pytest.raises(StorageError, match=rf"^{tmp_path}: .*Is a directory"):
        read("hierarcaps", annotations=str(tmp_path))


def coco_doc(mutate=lambda doc: None) -> dict:
    doc = {
        "images": [
            {"id": 397133, "file_name": "000000397133.jpg", "height": 427},
            {"id": 37777, "file_name": "000000037777.jpg"},
        ],
        "annotations": [
            {"image_id": 397133, "id": 370509, "caption": "A man making pizzas."},
            {"image_id": 37777, "id": 9, "caption": "  The dining table \n"},
            {"image_id": 397133, "id": 375000, "caption": "   "},
        ],
    }
    mutate(doc)
    return doc


def test_coco(tmp_path):
    ann = write(tmp_path / "captions_val2017.json", coco_doc())
    data = read("coco", ann, "s3://bucket/val2017/", split="val")
    names = ("000000037777.jpg", "000000397133.jpg")
    assert column(data, "path") == [f"s3://bucket/val2017/{name}" for name in names]
    assert data.captions.to_pylist() == [
        {"caption_id": "9", "image_id": "37777", "text": "The dining table"},
        {"caption_id": "370509", "image_id": "397133", "text": "A man making pizzas."},
        {"caption_id": "375000", "image_id": "397133", "text": ""},  # empty kept
    ]
    assert data.description["counts"] == {"images": 2, "captions": 3}


def karpathy(**image) -> dict:
    def item(cocoid, split, sentids, folder="val2014"):
        sentences = [{"raw": f" caption {s} of {cocoid}.", "sentid": s} for s in sentids]
        name = f"COCO_{folder}_{cocoid:012d}.jpg"
        meta = {"split": split, "cocoid": cocoid, "sentences": sentences}
        return {"filepath": folder, "filename": name, **meta}

    images = [item(11, "train", [1, 2], "train2014"), item(22, "restval", [3])]
    images += [item(33, "val", [4, 5]), item(44, "test", [6]), item(55, "test", [7, 8])]
    images[3].update(image)
    return {"dataset": "coco", "images": images}


def test_karpathy_json_splits(tmp_path):
    ann = write(tmp_path / "dataset_coco.json", karpathy())
    for split, ids in [("train", ["11", "22"]), ("restval", ["22"]), ("test", ["44", "55"])]:
        assert column(read("coco-karpathy", ann, "/data/coco", split=split), "image_id") == ids
    data = read("coco-karpathy", ann, "/data/coco", split="train")
    assert column(data, "path") == [
        "/data/coco/train2014/COCO_train2014_000000000011.jpg",
        "/data/coco/val2014/COCO_val2014_000000000022.jpg",
    ]
    assert list(data.captions.to_pylist()[2].values()) == ["3", "22", "caption 3 of 22."]
    images = [
        {"filename": name, "split": split, "sentences": [{"raw": f"{name} a", "sentid": k}]}
        for k, (name, split) in enumerate([("1000.jpg", "train"), ("20.jpg", "test")])
    ]
    ann = write(tmp_path / "dataset_flickr30k.json", {"images": images})
    data = read("flickr30k", ann, "/f30k/images")
    assert column(data, "path") == ["/f30k/images/20.jpg"]
    assert column(data, "caption_id", "captions") == ["1"]


FILES = {"coco": "c.json", "coco-karpathy": "k.json", "cc": "gcc.tsv", "hierarcaps": "h.csv"}
HC = "id,captions,image_url\n"


@pytest.mark.parametrize(
    ("dataset", "text", "message"),
    [
        ("coco", '{"images": [\n{"id": 1,}\n]}', r"Invalid JSON: .* line 2 column \d+"),
        *[
            ("coco", json.dumps(coco_doc(mutate)), message)
            for mutate, message in [
                (lambda d: d["annotations"][1].pop("caption"), r"annotations\[1\]\.caption: Field"),
                (lambda d: d["annotations"][0].update(image_id=5), r"annotations\[0\]: image_id 5"),
                (lambda d: d["images"].append(d["images"][0]), r"duplicate image_id '397133'"),
                (lambda d: d["annotations"][1].update(id=370509), r"duplicate caption_id '370509'"),
            ]
        ],
        (
            "coco-karpathy",
            json.dumps(karpathy(sentences=[{"sentid": 6}])),
            r"images\[3\]\.sentences\[0\]\.raw: Field required",
        ),
        ("coco-karpathy", json.dumps(karpathy(cocoid=None)), r"images\[3\]: missing 'cocoid'"),
        ("cc", "ok\ta.jpg\ncap\twith\ttabs.jpg\n", r"line 2: expected 'caption<TAB>pa"),
        ("cc", "ok\tb\xe9.jpg\n".encode("latin-1"), r"line 1: not UTF-8"),
        (
            "hierarcaps",
            HC + "0,a => b => c => d,http://x/1.jpg\n"
            '1,"a => b\nwith newline => c => d",http://x/2.jpg\n2,a => b => c,http://x/3.jpg\n',
            r"row 3: expected 4 levels",
        ),
        ("hierarcaps", HC + "0,a=>b=>c=>d,\n", r"row 1: empty id or"),
        ("hierarcaps", "id,image_url\n", r"no column\(s\) \['captions'\]"),
        ("hierarcaps", HC + "1,a=>b=>c=>d,x/1\n1,a=>b=>c=>d,x/2\n", r"duplicate caption_id '1-0'"),
        ("hierarcaps", HC + '1,"a=>b=>c=>d,x/1\n2,a,x/2\n', r"malformed CSV .*EOF inside string"),
    ],
)
def test_malformed_text_names_file_and_line(tmp_path, dataset, text, message):
    ann = tmp_path / FILES[dataset]
    ann.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SourceError, match=rf"^{ann}: {message}"):
        read(dataset, str(ann), "/x")


def test_cc_tsv(tmp_path):
    ann = tmp_path / "gcc.tsv"
    ann.write_text("a dog\timages/0.jpg\na cat\t/abs/cat.png\n\nthe dog again\timages/0.jpg\n")
    data = read("cc", str(ann), split="train")
    dog, cat = sha16("images/0.jpg"), sha16("/abs/cat.png")
    paths = dict(zip(column(data, "image_id"), column(data, "path"), strict=True))
    assert paths == {dog: f"{tmp_path}/images/0.jpg", cat: "/abs/cat.png"}
    texts = dict(zip(*(column(data, c, "captions") for c in ("caption_id", "text")), strict=True))
    assert texts == {f"{dog}-0": "a dog", f"{dog}-1": "the dog again", f"{cat}-0": "a cat"}
    # relative paths resolve against `images` when given
    data = read("cc", str(ann), "s3://b/cc", split="train")
    assert "s3://b/cc/images/0.jpg" in column(data, "path")


@pytest.mark.parametrize("form", ["shards", "shards/*.tar", "shards/00001.tar"])
def test_cc_webdataset(tmp_path, form):
    expected = write_shards(tmp_path / "shards")
    data = read("cc", str(tmp_path / form), split="train")
    if form.endswith("00001.tar"):
        expected = {k: v for k, v in expected.items() if k.startswith("00001")}
    assert column(data, "image_id") == sorted(expected)
    for row in data.images.to_pylist():
        with open(row["path"], "rb") as f:
            f.seek(row["offset"])
            assert f.read(row["length"]) == expected[row["image_id"]][0]
        assert row["path"].endswith(row["image_id"][:5] + ".tar")
    assert column(data, "text", "captions") == [expected[k][1] for k in sorted(expected)]
    assert column(data, "caption_id", "captions")[0] == f"{sorted(expected)[0]}-0"


def test_cc_webdataset_errors(tmp_path):
    def shard(name, **members):
        with tarfile.open(tmp_path / name, "w") as tar:
            for member, payload in members.items():
                add_member(tar, member.replace("_", "."), payload)

    shard("00000.tar", a_jpg=b"x", a_txt=b"a", d_json=b"{}", _h_jpg=b"hidden")
    for members, message in [
        ({"a_jpg": b"y"}, rf"^{tmp_path}: duplicate image_id 'a'"),
        ({"b_txt": b"caption"}, r"00001\.tar: sample 'b' has a caption but no image"),
        ({"c_jpg": b"y", "c_txt": b"\xff"}, r"00001\.tar: c\.txt: caption is not UTF-8"),
    ]:
        shard("00001.tar", **members)
        with pytest.raises(SourceError, match=message):
            read("cc", str(tmp_path), split="train")
    (tmp_path / "00001.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(SourceError, match=r"00001\.tar: not a readable uncompressed tar"):
        read("cc", str(tmp_path), split="train")
    with pytest.raises(SourceError, match="no .tar shards"):
        read("cc", str(tmp_path / "empty*.tar"), split="train")


def test_sample_and_id_list(tmp_path):
    ann = write(tmp_path / "cc.tsv", "".join(f"c{i}\timages/{i}.jpg\n" for i in range(40)))
    a, b, c = (read("cc", ann, sample=10, seed=seed) for seed in (0, 0, 1))
    assert a.images.equals(b.images) and a.captions.equals(b.captions)
    ids = column(a, "image_id")
    assert a.description["sampled_ids"] == ids == column(a, "image_id", "captions")
    assert set(ids) != set(column(c, "image_id"))
    everything = sorted(sha16(f"images/{i}.jpg") for i in range(40))
    assert ids == sorted(everything[i] for i in np.random.default_rng(0).choice(40, 10, False))
    with pytest.raises(SourceError, match="sample=41 but only 40 ids"):
        read("cc", ann, sample=41)
    wanted = [sha16(f"images/{i}.jpg") for i in (3, 17, 5)]
    id_list = write(tmp_path / "ids.txt", "\n".join(wanted) + "\n\n")
    assert column(read("cc", ann, id_list=id_list), "image_id") == sorted(wanted)
    both = read("cc", ann, id_list=id_list, sample=2, seed=3)
    assert set(column(both, "image_id")) < set(wanted)
    write(tmp_path / "ids.txt", f"{wanted[0]}\ndeadbeef\n")
    with pytest.raises(SourceError, match=r"ids\.txt: line 2: unknown id 'deadbeef'"):
        read("cc", ann, id_list=id_list)


@pytest.mark.skipif(HIERARCAPS is None, reason="no real HierarCaps copy")
def test_hierarcaps_real_and_its_cifar_stand_ins(tmp_path):
    data = read("hierarcaps", str(HIERARCAPS / "hierarcaps_test.csv"), str(HIERARCAPS / "images"))
    assert data.description["counts"] == {"images": 1000, "captions": 4000}
    assert set(column(data, "image_id")) == {p.stem for p in (HIERARCAPS / "images").glob("*")}
    assert Path(data.images["path"][0].as_py()).is_file()
    levels = data.captions["level"].value_counts().to_pylist()
    assert sorted((c["values"], c["counts"]) for c in levels) == [(k, 1000) for k in range(4)]
    first = [r for r in data.captions.to_pylist() if r["caption_id"].startswith("0-")]
    assert [(r["text"], r["level"]) for r in first[:2]] == [("table", 0), ("table with plates", 1)]
    assert {r["image_id"] for r in first} == {"COCO_val2014_000000301718"}
    url = read("hierarcaps", str(HIERARCAPS / "hierarcaps_test.csv"))
    assert column(url, "path")[0].startswith("http")
    hierarcaps_subset(tmp_path / "hc", n=40)  # the demo's CIFAR-format stand-ins
    roots = write_hierarcaps_cifar(str(tmp_path / "hc"), str(tmp_path / "out"), n_classes=2)
    pos, neg = (read(d, images=roots[d]).description["classes"] for d in ("cifar10", "cifar100"))
    assert len(pos) == len(neg) == 2 and not set(pos) & set(neg)


def pixels(data) -> list[np.ndarray]:
    return [np.asarray(Image.open(io.BytesIO(png))) for png in column(data, "data")]


@pytest.fixture
def cifar10(tmp_path):
    """CIFAR-10: 5 train batches of 2 (numpy 1's pickle, protocol 5 last), a test batch of 4."""
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    dump(root / "batches.meta", {b"label_names": [b"airplane", b"automobile", b"bird"]})
    train_hwc, train_labels = [], []
    for b in range(1, 6):
        hwc, flat = cifar_rows(rng, 2)
        labels = [(b + i) % 3 for i in range(2)]
        batch = {b"batch_label": b"x", b"labels": labels, b"data": flat}
        dump(root / f"data_batch_{b}", batch, protocol=5 if b == 5 else 2, numpy1=b == 1)
        train_hwc.append(hwc)
        train_labels += labels
    hwc, flat = cifar_rows(rng, 4)
    dump(root / "test_batch", {b"labels": [2, 1, 0, 2], b"data": flat})
    return root, np.concatenate(train_hwc), train_labels, hwc


def test_cifar10_train_images_labels_and_class_prompts(cifar10, tmp_path):
    _, train_hwc, train_labels, _ = cifar10
    data = read("cifar10", images=str(tmp_path), split="train")  # the parent folder works too
    assert column(data, "image_id") == [f"cifar10-train-{i:05d}" for i in range(10)]
    assert column(data, "label") == train_labels
    np.testing.assert_array_equal(pixels(data), train_hwc)
    assert data.captions.num_rows == 0 and data.prompts.num_rows == 3 * 18
    assert data.prompts.to_pylist()[18] == {
        "class_index": 1,
        "class_name": "automobile",
        "template": tf("cifar10")[0],
        "text": "a photo of a automobile.",
    }


def test_a_cifar10_test_sample_with_its_own_templates(cifar10):
    root, _, _, hwc = cifar10
    test = read("cifar10", str(root), split="test", templates=["a {}", "{} art"], sample=2)
    index = [int(i.rsplit("-", 1)[1]) for i in column(test, "image_id")]
    np.testing.assert_array_equal(pixels(test), hwc[index])
    assert column(test, "text", "prompts")[:3] == ["a airplane", "airplane art", "a automobile"]


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


FLAT = np.zeros((4, 3072), dtype=np.uint8)  # the rows of four images


@pytest.mark.parametrize(
    ("name", "obj", "message"),
    [
        ("test_batch", {b"labels": [0, 1, 5, 2], b"data": FLAT}, r"labels\[2\] = 5 outside 0\.\.2"),
        ("test_batch", {b"labels": [0, 1], b"data": FLAT}, "2 labels for 4 images"),
        ("test_batch", {b"labels": [0], b"data": FLAT[:, :10]}, "b'data': expected uint8"),
        ("test_batch", {b"labels": [0, 1, 1, 2]}, "missing key b'data'"),
        ("test_batch", [1], "expected a pickled dict, got list"),
        ("batches.meta", {b"label_names": [b"cat", b"d\xf6g"]}, "label_names: .*can't decode"),
        ("batches.meta", {b"label_names": []}, "label_names: not a list of class names"),
        ("batches.meta", {b"label_names": [b"a"], b"x": Evil()}, "refusing to load .*print"),
    ],
)
def test_a_bad_cifar_file_is_named_with_what_is_wrong(cifar10, name, obj, message):
    dump(cifar10[0] / name, obj)
    with pytest.raises(SourceError, match=rf"{name}: .*{message}"):
        read("cifar10", images=str(cifar10[0]))


def test_cifar100_fine_labels_and_class_names(tmp_path):
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    dump(root / "meta", {b"fine_label_names": [b"class_0", b"aquarium_fish"]})
    hwc, flat = cifar_rows(np.random.default_rng(1), 2)
    dump(root / "test", {b"fine_labels": [1, 0], b"coarse_labels": [0, 0], b"data": flat})
    data = read("cifar100", images=str(root))
    assert column(data, "label") == [1, 0] and column(data, "image_id")[-1] == "cifar100-test-00001"
    assert column(data, "text", "prompts")[18] == "a photo of a aquarium fish."


@pytest.fixture
def stl10(tmp_path):
    """STL-10 binaries of 3 test images (labels 1..3 on disk); (their folder, HWC pixels)."""
    folder = tmp_path / "stl10_binary"
    folder.mkdir()
    hwc = np.random.default_rng(2).integers(0, 256, size=(3, 96, 96, 3), dtype=np.uint8)
    hwc[0, 0, :, 0], hwc[0, 1:, :, 0] = 255, 0  # top row red in the first image: an H/W swap
    (folder / "class_names.txt").write_text("airplane\nbird\ncar\n")
    (folder / "test_X.bin").write_bytes(hwc.transpose(0, 3, 2, 1).tobytes())  # (C, W, H) order
    (folder / "test_y.bin").write_bytes(bytes([1, 3, 2]))
    return folder, hwc


def test_stl10_images_in_their_column_major_order_and_labels_from_0(stl10, tmp_path):
    data = read("stl10", images=str(tmp_path))
    assert column(data, "label") == [0, 2, 1] and data.description["classes"][1] == "bird"
    np.testing.assert_array_equal(pixels(data), stl10[1])


def test_stl10_unlabeled_images_have_no_label(stl10):
    folder, hwc = stl10
    (folder / "unlabeled_X.bin").write_bytes(hwc.transpose(0, 3, 2, 1).tobytes())
    assert column(read("stl10", str(folder), split="unlabeled"), "label") == [None] * 3


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("test_y.bin", bytes([1, 3, 4]), r"test_y\.bin: byte\[2\] = 4 outside 1\.\.3"),
        ("test_X.bin", b"\0" * 1000, r"test_X\.bin: 1000 bytes is not a multiple of 27648"),
    ],
)
def test_a_bad_stl10_file_is_named_with_what_is_wrong(stl10, name, content, message):
    (stl10[0] / name).write_bytes(content)
    with pytest.raises(SourceError, match=message):
        read("stl10", images=str(stl10[0]))


def test_imagenet(tmp_path):
    root = tmp_path / "val"
    for rel in ["n01440764/b.JPEG", "n01440764/a.JPEG", "n01443537/sub/c.png", "n01440764/n.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"not decoded here")
    (root / "n01484850").mkdir()
    (root / "LOC_synset_mapping.txt").write_text("in the root, not a class")
    data = read("imagenet", images=str(root), split="val")
    assert data.images.select(["image_id", "path", "label"]).to_pylist()[1:] == [
        {"image_id": "n01440764/b.JPEG", "path": f"{root}/n01440764/b.JPEG", "label": 0},
        {"image_id": "n01443537/sub/c.png", "path": f"{root}/n01443537/sub/c.png", "label": 1},
    ]
    # CLIP's curated names for ILSVRC synsets
    assert data.description["classes"] == ["tench", "goldfish", "great white shark"]
    assert data.prompts.num_rows == 3 * 80
    assert column(data, "text", "prompts")[-1] == "a tattoo of the great white shark."
    (root / "cats").mkdir()  # not an ImageNet synset: the folder names stay
    assert read("imagenet", images=str(root)).description["classes"][0] == "cats"
    with pytest.raises(SourceError, match="no class folders"):
        read("imagenet", images=str(root / "n01484850"))


def test_templates():
    counts = {"cifar10": 18, "cifar100": 18, "stl10": 2, "imagenet": 80, "ImageNet1k": 80}
    assert {d: len(set(tf(d))) for d in counts} == counts
    assert tf("coco") == tf("no-such-set") == GENERIC_TEMPLATES and len(GENERIC_TEMPLATES) == 5
    for template in [t for ts in (*TEMPLATES.values(), GENERIC_TEMPLATES) for t in ts]:
        assert template.count("{}") == 1 and not re.search(r"\{[^}]", template), template
    # CLIP's curated names, not WordNet's first lemma ("cock", "hammerhead", "water ouzel").
    names = imagenet_class_names(["n01514668", "n01494475", "n01601694"])
    assert names == ["rooster", "hammerhead shark", "American dipper"]
    assert imagenet_class_names(["n01514668", "cats"]) is None
