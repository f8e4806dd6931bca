"""Streaming training (asymvlm.training.stream): order, pairing, the choice, learning, memory."""

from __future__ import annotations

import numpy as np
import pytest

from asymvlm import tables
from asymvlm.errors import ConfigError
from asymvlm.methods import Method
from asymvlm.runner import RunSpec, TrainingRun, train_and_evaluate
from asymvlm.synthetic import write_world
from asymvlm.training import TrainConfig
from asymvlm.training.stream import CaptionStream, StreamingTrainer, split_bytes, use_streaming
from tests.helpers import captioned_images, small_world_config, write_table


@pytest.fixture(scope="module")
def parted_world(tmp_path_factory) -> str:
    """The small world written in 8 parts of about 40 images (with their captions) each."""
    root = tmp_path_factory.mktemp("stream") / "tables"
    return write_world(str(root), small_world_config(block_images=20), shard_images=40)


def _stream(root: str, rank: int = 0, world_size: int = 1, **kwargs) -> CaptionStream:
    args = dict(batch_size=30, shuffle_buffer=50, seed=0, adapter_input="unit")
    cfg = TrainConfig(**{**args, **kwargs})
    return CaptionStream(root, "train", cfg, rank=rank, world_size=world_size)


def _keys(text: np.ndarray) -> list[bytes]:
    return [row.tobytes() for row in np.ascontiguousarray(text, dtype=np.float32)]


def test_every_caption_once_per_epoch_with_its_own_image(parted_world):
    split = tables.read_split(parted_world, "train")
    owner = dict(zip(_keys(split.text_embeddings), split.text_image_index, strict=True))
    stream = _stream(parted_world)
    assert len(stream.parts) == 8 and stream.n_text == 900 and stream.steps == 30
    for epoch in range(2):
        seen: list[bytes] = []
        for image_rows, text in stream.batches(epoch):
            assert text.shape == (30, 16)
            keys = _keys(text.numpy())
            seen.extend(keys)
            images = stream.image_emb[image_rows].numpy()
            for key, row, image in zip(keys, image_rows.tolist(), images, strict=True):
                assert stream.image_ids[row].as_py() == split.image_ids[owner[key]]
                np.testing.assert_array_equal(image, split.image_embeddings[owner[key]])
        assert sorted(seen) == sorted(owner)  # every caption exactly once


def _order(stream: CaptionStream, epoch: int) -> list[bytes]:
    return [k for _, text in stream.batches(epoch) for k in _keys(text.numpy())]


def test_order_depends_on_seed_and_epoch_only(parted_world):
    a, b = _stream(parted_world), _stream(parted_world)
    assert _order(a, 0) == _order(b, 0)
    assert _order(a, 0) != _order(a, 1)
    assert _order(a, 0) != _order(_stream(parted_world, seed=1), 0)
    assert len({tuple(a.part_order(epoch)) for epoch in range(6)}) > 1


def test_ragged_tail_dropped_and_ranks_disjoint(parted_world):
    single = _stream(parted_world, batch_size=64)
    assert single.steps == 900 // 64 and len(_order(single, 0)) == 64 * (900 // 64)
    ranks = [_stream(parted_world, batch_size=60, rank=r, world_size=2) for r in (0, 1)]
    assert [s.batch_size for s in ranks] == [30, 30] and ranks[0].steps == ranks[1].steps == 15
    rows = [_order(s, 3) for s in ranks]
    assert not set(rows[0]) & set(rows[1]) and len(rows[0]) + len(rows[1]) == 900


def test_auto_streams_above_the_threshold_only(parted_world):
    size = split_bytes(parted_world, "train")
    assert size == (300 + 900) * 16 * 4
    cfg = TrainConfig(method="asymvlm-vmf", epochs=1, device="cpu")
    below, at = (cfg.model_copy(update={"stream_memory_bytes": b}) for b in (size - 1, size))
    assert use_streaming(below, parted_world, "train")
    assert not use_streaming(at, parted_world, "train")
    never = cfg.model_copy(update={"stream": "never", "stream_memory_bytes": 0})
    assert not use_streaming(never, parted_world, "train")
    assert use_streaming(cfg.model_copy(update={"stream": "always"}), parted_world, "train")
    # methods fitted post hoc need the whole split
    clip = TrainConfig(method="clip", stream_memory_bytes=0)
    assert not use_streaming(clip, parted_world, "train")
    with pytest.raises(ConfigError, match="not trained by SGD"):
        use_streaming(clip.model_copy(update={"stream": "always"}), parted_world, "train")
    spec = dict(embeddings=parted_world, val_split=None, test_split=None)
    low = TrainingRun(RunSpec(**spec, train=cfg.model_copy(update={"stream_memory_bytes": 1})))
    high = TrainingRun(RunSpec(**spec, train=cfg))
    assert isinstance(low.trainer, StreamingTrainer)
    assert type(high.trainer).__name__ == "Trainer"
    always = cfg.model_copy(update={"stream": "always"})
    with pytest.raises(ConfigError, match="val_fraction"):  # holding out needs the split
        TrainingRun(RunSpec(embeddings=parted_world, train=always, val_split="-", val_fraction=0.1))


def _run(root: str, stream: str) -> dict:
    cfg = dict(batch_size=60, hidden_dim=64, depth=2, device="cpu", shuffle_buffer=60)
    out = train_and_evaluate(
        RunSpec(embeddings=root, train=TrainConfig(epochs=20, stream=stream, **cfg))
    )
    assert "diverged" not in out, out.get("diverged")
    return out


def test_streaming_run_learns_like_the_in_memory_run(parted_world, one_thread):
    streamed, in_memory = _run(parted_world, "always"), _run(parted_world, "never")
    history = streamed["history"]
    assert len(history) == 20 and history[-1]["train_loss"] < 0.6 * history[0]["train_loss"]
    for direction in ("i2t", "t2i"):
        ours = streamed["test"][direction]["recall@1"]
        theirs = in_memory["test"][direction]["recall@1"]
        assert ours > 5 / 60  # well above chance (1/60 images, 1/180 captions)
        assert abs(ours - theirs) < 0.15  # close, not bit-identical (docs/streaming.md)


def _write_big(root: str, parts: int = 50, images: int = 200, per_image: int = 10) -> None:
    """About 920 MB of float32 (100,000 captions and 10,000 images at d = 2048) in 50 parts."""
    rng, norms = np.random.default_rng(0), np.full(images * per_image, 8.0, np.float32)
    for k in range(parts):
        captioned = captioned_images(rng, images, per_image, 2048, 1 / 64, np.float32)
        write_table(root, *captioned, "train", part=f"p{k}", norms=norms)


#: The hard cap (RLIMIT_DATA) of the memory test: the process baseline (imports) is about
#: 260 MB of data, the table about 920 MB of float32 (in memory it needs its size once).
CAP_BYTES = 1_300_000_000


@pytest.mark.slow
def test_streaming_trains_a_table_larger_than_the_memory_cap(tmp_path):
    import os
    import resource
    import subprocess
    import sys

    root = str(tmp_path / "big")
    _write_big(root)
    assert split_bytes(root, "train") > 900e6

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (CAP_BYTES, CAP_BYTES))

    # one OpenMP thread: under the cap a thread's stack can be what fails to allocate first
    # ("libgomp: Thread creation failed"), which hides the allocation error looked for below
    env = dict(os.environ, ARROW_DEFAULT_MEMORY_POOL="system", MALLOC_ARENA_MAX="1")
    env["OMP_NUM_THREADS"] = "1"
    codes = {}
    for mode, threshold in (("auto", "100000000"), ("never", "0")):
        args = (
            f"train --embeddings {root} --method determ-ft --epochs 1 --batch-size 1024 --depth 1"
        )
        args += f" --hidden-dim 64 --device cpu --quiet --stream {mode} --shuffle-buffer 4096"
        args += f" --stream-memory-bytes {threshold} --output {tmp_path}/{mode}"
        args = [sys.executable, "-m", "asymvlm.cli", *args.split()]
        done = subprocess.run(args, preexec_fn=cap, env=env, capture_output=True, text=True)
        codes[mode] = (done.returncode, done.stderr[-400:])
    assert codes["auto"][0] == 0, codes["auto"][1]  # streamed: fits under the cap
    assert codes["never"][0] != 0 and "memory" in codes["never"][1].lower()  # in memory: not


def test_a_method_reading_per_caption_inputs_is_refused_in_one_line(parted_world):
    class Captioned(Method):
        name = "captioned"

        def split_inputs(self, data):
            return super().split_inputs(data)

    with pytest.raises(ConfigError, match="^captioned reads per-caption inputs .*stream='never'"):
        StreamingTrainer(Captioned(16), TrainConfig(), _stream(parted_world))
