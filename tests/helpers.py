"""Small data makers and stand-ins shared by several test modules (no test module imports
another's helpers)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asymvlm import tables
from asymvlm.methods.asymvlm import AsymVLM, spherical_head
from asymvlm.methods.base import unit
from asymvlm.splits import SplitTensors, load_split
from asymvlm.synthetic import WorldConfig
from asymvlm.training import TrainConfig

#: The repository's root folder.
REPO = str(Path(__file__).resolve().parent.parent)
#: A line a library wrote to the console: a level word, a timestamp, a Ray worker's prefix, a C++
#: log line (ours are bare, or start "warning: " / "error: ").
_LIBRARY_LINE = re.compile(
    r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|^\s*\[?\d{4}[-/]\d\d[-/]\d\d|\(\w*\s?pid=\d+|"
    r"\.(cc|h):\d+\]?:|Traceback|Warning:"
)


def library_lines(console: str) -> list[str]:
    """The lines of ``console`` that a library wrote (which belong in the log file)."""
    return [line for line in console.splitlines() if _LIBRARY_LINE.search(line)]


def post_json(url: str, payload: Any) -> tuple[int, Any]:
    """(HTTP status, parsed JSON body) of POSTing ``payload`` as JSON to ``url``."""
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dead_cluster_ray_tmpdir() -> Iterator[str]:
    """Ray's temp folder (short: its socket paths) naming a cluster that is gone, as a killed
    head leaves it (``ray_current_cluster``); removed afterwards."""
    folder = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    os.makedirs(os.path.join(folder, "ray"))
    with open(os.path.join(folder, "ray", "ray_current_cluster"), "w") as fh:
        fh.write(f"127.0.0.1:{free_port()}")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sigkill_when(
    command: Sequence[str],
    ready: Callable[[], bool],
    env: dict | None = None,
    seconds: float = 180,
    every: float = 0.02,
) -> None:
    """Run ``command`` from the repository in a session of its own and SIGKILL the whole session
    (the driver and the local Ray it started) as soon as ``ready()`` holds; fail if the command
    exits first or nothing is ready in ``seconds`` (asked every ``every`` s)."""
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            text=True,
        )

        def failed(why: str) -> AssertionError:
            stderr.seek(0)
            return AssertionError(f"{why}: {stderr.read()[-3000:]}")

        try:
            deadline = time.monotonic() + seconds
            while not ready():
                if proc.poll() is not None:
                    raise failed("exited before the kill")
                if time.monotonic() > deadline:
                    raise failed(f"not ready in {seconds} s")
                time.sleep(every)
        finally:
            with contextlib.suppress(ProcessLookupError):  # nothing of the session left
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def small_world_config(**overrides) -> WorldConfig:
    """A world small enough for unit tests (seconds on a CPU)."""
    base = dict(dim=16, splits={"train": 300, "val": 60, "test": 60}, captions_per_image=3)
    base.update(overrides)
    return WorldConfig(**base)


def rotated_pairs(
    n: int = 64, d: int = 16, seed: int = 0, noise: float = 0.1, scale: float = 5.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit images and RAW texts: scale * (a fixed rotation of the image + noise)."""
    g = torch.Generator().manual_seed(seed)
    img = unit(torch.randn(n, d, generator=g))
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    txt = img @ q.T + noise * torch.randn(n, d, generator=g)
    return img, scale * txt


def _find_hierarcaps() -> Path | None:
    """The read-only HierarCaps copy (see :func:`asymvlm.data.demo_sets.find_hierarcaps`)."""
    from asymvlm.data.demo_sets import find_hierarcaps

    found = find_hierarcaps()
    return Path(found) if found else None


#: Folder with hierarcaps_test.csv and images/ (None when the shared data is not present).
HIERARCAPS = _find_hierarcaps()
requires_hierarcaps = pytest.mark.skipif(
    HIERARCAPS is None, reason="real HierarCaps data not found (../shared/data/hierarcaps)"
)


def hierarcaps_subset(folder: Path, n: int = 6) -> tuple[str, str]:
    """The first ``n`` HierarCaps hierarchies and their images in ``folder``: (csv, images)."""
    import shutil

    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = (HIERARCAPS / "hierarcaps_test.csv").read_text().splitlines()[: n + 1]
    (folder / "hierarcaps_test.csv").write_text("\n".join(lines) + "\n")
    for line in lines[1:]:
        name = line.rsplit("/", 1)[1]
        shutil.copy(HIERARCAPS / "images" / name, folder / "images" / name)
    return str(folder / "hierarcaps_test.csv"), str(folder / "images")


def tiny_encoders(folder: Path) -> dict[str, str]:
    """Tiny random CLIP, SigLIP and open_clip models under ``folder``: family -> model name."""
    from asymvlm.data.tiny import save_tiny_clip, save_tiny_open_clip, save_tiny_siglip

    return {
        "clip": save_tiny_clip(str(folder / "clip")),
        "siglip": save_tiny_siglip(str(folder / "siglip")),
        "open_clip": save_tiny_open_clip(str(folder / "open_clip")),
    }


# -- retrieval: a hand example and toy training data ---------------------------------------------

# 3 images, 6 captions; captions 0,1 -> image 0; 2,3 -> image 1; 4,5 -> image 2.
#
#            img0  img1  img2     t2i ranking         paired  rank  hit@1 hit@2
# c0       [ 0.9,  0.1,  0.0 ]   0, 1, 2              0       0     1     1
# c1       [ 0.2,  0.8,  0.1 ]   1, 0, 2              0       1     0     1
# c2       [ 0.1,  0.7,  0.3 ]   1, 2, 0              1       0     1     1
# c3       [ 0.6,  0.2,  0.5 ]   0, 2, 1              1       2     0     0
# c4       [ 0.0,  0.3,  0.4 ]   2, 1, 0              2       0     1     1
# c5       [ 0.5,  0.4,  0.7 ]   2, 0, 1              2       0     1     1
# t2i: R@1 = 4/6, R@2 = 5/6, R@5 = 6/6.
#
# i2t (columns):
# img0: c0 .9, c3 .6, c5 .5, c1 .2, ...   top1 c0 (img0)            -> rank 0
# img1: c1 .8, c2 .7, c5 .4, ...          top1 c1 (img0), c2 (img1) -> rank 1
# img2: c5 .7, c3 .5, c4 .4, ...          top1 c5 = second caption  -> rank 0
# i2t: R@1 = 2/3, R@2 = 3/3, R@5 = 3/3.
SCORES = torch.tensor(
    [0.9, 0.1, 0, 0.2, 0.8, 0.1, 0.1, 0.7, 0.3, 0.6, 0.2, 0.5, 0, 0.3, 0.4, 0.5, 0.4, 0.7]
).view(6, 3)
PAIRS = torch.tensor([0, 0, 1, 1, 2, 2])


def retrieval(scores: torch.Tensor = SCORES, pairs: torch.Tensor = PAIRS, **kw) -> dict:
    """``retrieval_metrics`` of a whole score matrix (the hand example by default; ks 1, 2, 5)."""
    from asymvlm.metrics import retrieval_metrics

    kw.setdefault("ks", (1, 2, 5))
    n_text, n_image = scores.shape
    return retrieval_metrics(lambda a, b: scores[a:b], n_text, n_image, pairs, **kw)


def toy_split(n_image: int = 40, n_text: int = 100, dim: int = 8, seed: int = 0) -> SplitTensors:
    """Unit images and their captions: 5 x (the image + noise), paired at random."""
    g = torch.Generator().manual_seed(seed)
    images = torch.nn.functional.normalize(torch.randn(n_image, dim, generator=g), dim=-1)
    t2i = torch.randint(0, n_image, (n_text,), generator=g)
    texts = 5.0 * (images[t2i] + 0.3 * torch.randn(n_text, dim, generator=g))
    return SplitTensors(image_emb=images, text_emb=texts, text_to_image=t2i, split=None)


def toy_config(**kw) -> TrainConfig:
    """4 epochs of SGD at lr 0.01 in batches of 32; adapters 16 wide and 2 deep."""
    base = dict(epochs=4, lr=1e-2, batch_size=32, hidden_dim=16, depth=2, optimizer="sgd")
    return TrainConfig(**{**base, **kw})


def nan_losses_from(monkeypatch, epoch: int) -> None:
    """Every training loss from (0-based) ``epoch`` on is NaN: the run diverges there."""
    from asymvlm.distributed import GlobalBatchLoss

    original = GlobalBatchLoss.forward

    def forward(self, image_emb, text_emb, e=0):
        loss = original(self, image_emb, text_emb, e)
        return loss * float("nan") if e >= epoch else loss

    monkeypatch.setattr(GlobalBatchLoss, "forward", forward)


def save_adapter(folder, method: str = "symvlm", dim: int = 8, seed: int = 0, **kw) -> None:
    """An untrained ``method`` adapter (8 wide, 1 deep) saved as a checkpoint folder."""
    from asymvlm.checkpoints import save_checkpoint
    from asymvlm.methods import build_method

    base = dict(epochs=4, lr=1e-3, optimizer="adamw", batch_size=128, seed=seed)
    cfg = TrainConfig(method=method, hidden_dim=8, depth=1, **base)
    save_checkpoint(str(folder), build_method(method, dim, **cfg.method_args()), cfg, dim, **kw)


class IdentityVMF(AsymVLM):
    """AsymVLM whose adapter is the identity: eta = the prompt feature (kappa = its norm)."""

    def encode_texts(self, text_emb: torch.Tensor):
        return spherical_head(text_emb)


# -- data set files in their real formats -------------------------------------------------------


def encoded(color, fmt: str) -> bytes:
    """An 8x6 image of one ``color`` encoded as ``fmt`` (JPEG, PNG)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buffer, format=fmt)
    return buffer.getvalue()


def add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def write_shards(folder: Path) -> dict[str, tuple[bytes, str]]:
    """Two img2dataset-style shards; returns key -> (image bytes, caption)."""
    import json

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


def cifar_rows(rng, n):
    """``n`` random 32x32 images: (HWC pixels, the CHW rows of the real files)."""
    hwc = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    return hwc, hwc.transpose(0, 3, 1, 2).reshape(n, 3072)


def dump(path: Path, obj, protocol=2, numpy1=False) -> None:
    """``obj`` pickled as the CIFAR files are (``numpy1``: naming numpy.core, as the 2009 ones)."""
    raw = pickle.dumps(obj, protocol=protocol)
    if numpy1:
        raw = raw.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
        assert b"numpy.core.multiarray" in raw, "the pickle names numpy.core as numpy 1's did"
    path.write_bytes(raw)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row of ``x`` divided by its norm."""
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def captioned_images(rng, n_images: int, per_image: int, dim: int, noise: float, dtype=np.float64):
    """Unit images, ``per_image`` captions of each (its image + ``noise`` x Gaussian noise, not
    normalised) and the image row of each caption."""
    images = unit_rows(rng.standard_normal((n_images, dim), dtype=dtype))
    owner = np.repeat(np.arange(n_images), per_image)
    texts = images[owner] + noise * rng.standard_normal((len(owner), dim), dtype=dtype)
    return images, texts, owner


def write_table(root, image_emb, text_emb, owner, split="test", *, part="", norms=None, **columns):
    """A manifest and a split (or a ``part`` of it, whose ids start with its name) of the unit rows
    of ``image_emb`` and of ``text_emb``, caption j of image ``owner[j]``: raw norms ``norms``
    (default the rows' own), text "caption j" unless ``columns`` give ``texts``."""
    ids = [f"{part}i{i}" for i in range(len(image_emb))]
    tables.write_manifest(root, {"dim": image_emb.shape[1], "model": "hand-built"})
    columns.setdefault("texts", [f"caption {j}" for j in range(len(text_emb))])
    columns["caption_ids"] = [f"{part}c{j}" for j in range(len(text_emb))]
    columns["caption_image_ids"] = [ids[i] for i in owner]
    columns["text_norms"] = np.linalg.norm(text_emb, axis=1) if norms is None else norms
    images = {"image_ids": ids, "image_embeddings": unit_rows(image_emb)}
    texts = {"text_embeddings": unit_rows(text_emb), **columns}
    tables.write_split(root, split, part=part or "part-00000", **images, **texts)


def write_hierarchies(root: str, kappas: np.ndarray, dim: int = 8) -> None:
    """One image per row of ``kappas``; caption (image i, level l) points at image i with
    concentration kappas[i, l] and has l + 1 words."""
    rng = np.random.default_rng(0)
    images, texts, owner = captioned_images(rng, len(kappas), 4, dim, noise=0.05)
    levels = np.tile(np.arange(4), len(kappas))
    words = [" ".join(["word"] * (level + 1)) for level in levels]
    extra = {"texts": words, "extra_text_columns": {"level": levels}}
    write_table(root, images, texts, owner, norms=kappas.ravel(), **extra)


def write_perturbed_pair(
    folder: Path, noise: float, kappa_scale: float = 1.0
) -> tuple[SplitTensors, SplitTensors]:
    """Tables ``clean`` and a caption-perturbed copy ``typos`` (noisier directions, kappa scaled
    by ``kappa_scale``) in ``folder``, and their test splits."""
    rng = np.random.default_rng(0)
    images, clean, owner = captioned_images(rng, 40, 1, 16, noise=0.05)
    typos = images + noise * rng.standard_normal(images.shape)
    write_table(str(folder / "clean"), images, clean, owner, norms=np.full(40, 20.0))
    write_table(str(folder / "typos"), images, typos, owner, norms=np.full(40, 20.0 * kappa_scale))
    return load_split(str(folder / "clean"), "test"), load_split(str(folder / "typos"), "test")
