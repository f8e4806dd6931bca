"""Throughput of the Ray Data embedding stage against a plain single-process transformers loop.

Both sides embed the same HierarCaps images *and* their captions (4 per image) with the same
local CLIP checkpoint and the same batch size, and write the embeddings to a fresh temporary
folder:

* **stage** -- ``asymvlm_ray.embedding.run_embed`` (one Ray Data pass: decode/preprocess ->
  encoder actor pool that embeds each batch's images and their captions -> sharded parquet);
* **plain** -- one process: ``read_source`` (the same image/caption list), ``load_encoder(model)``,
  then per batch ``PIL.Image.open`` + ``Encoder.preprocess_images`` + ``Encoder.encode_pixels``,
  then the captions through ``Encoder.encode_texts`` in batches of the same size, and one parquet
  file each for images and texts.

Each side is the command a user would run, in a fresh process timed from launch to exit (Python
start-up, imports, source read, model load, images, captions, writing): the stage is
``python -m asymvlm.cli embed ...`` against an already running Ray cluster (as ``ray job
submit`` finds one; this script starts it with ``ray.init(num_cpus=..., include_dashboard=False)``
before any timing and reports ``ray_init_seconds`` apart), the plain loop is this script
re-invoked with ``--plain-job``. ``images/s`` is ``n_images / wall seconds``. The repeats are
interleaved (stage, plain, stage, plain, ...) so machine noise hits both. The image files are
read once before timing so that neither side pays for a cold page cache.

The model is a local directory (no network): by default a tiny random CLIP
(:func:`asymvlm.data.tiny.save_tiny_clip`, 64 px, hidden 32); with ``--hidden-size`` a random
CLIP of that vision width is written to a temporary folder instead, e.g. the ViT-B/32 shape::

    .venv/bin/python benchmarks/embed_throughput.py                       # tiny CLIP, 1000 images
    .venv/bin/python benchmarks/embed_throughput.py --hidden-size 768 --image-size 224 \\
        --patch-size 32 --layers 12 --n-images 300                         # ViT-B/32-shaped

The plain loop is timed with 1 torch thread and with torch's default (= cores); the faster is
the baseline of each repeat (``--threads``). The stage runs as ``run_embed`` configures itself
(images decoded in CPU tasks streaming into the encoder actor pool).

``ratio`` compares with that plain loop (what a user would write). The stage also batches
captions by token length; ``plain_sorted`` runs the plain loop with that same batching, so
``plain_sorted.ratio_stage_over_this`` is the cost of Ray alone.

One JSON object goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import cpu_model, loadavg, logger  # noqa: E402

from asymvlm.data.demo_sets import find_hierarcaps  # noqa: E402

log = logger("embed_throughput")

DEFAULT_DATA = find_hierarcaps()  # $ASYMVLM_HIERARCAPS or ../shared/data/hierarcaps


# -- models -------------------------------------------------------------------------------------
def build_model(args: argparse.Namespace, root: str) -> tuple[str, dict[str, Any]]:
    """A local model directory: ``--model``, the tiny CLIP, or a random CLIP of a given shape."""
    if args.model:
        return os.path.abspath(args.model), {"kind": "given"}
    from asymvlm.data.tiny import save_tiny_clip

    directory = save_tiny_clip(os.path.join(root, "clip"))
    if args.hidden_size is None:
        return directory, {"kind": "tiny-random-clip", "image_size": 64, "hidden": 32, "layers": 2}

    # A bigger random CLIP: the tiny checkpoint's tokenizer, a new model and image processor.
    import torch
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor

    tiny = CLIPProcessor.from_pretrained(directory)
    tok = tiny.tokenizer
    hidden, size = args.hidden_size, args.image_size
    vision = dict(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, hidden // 64),
        image_size=size,
        patch_size=args.patch_size,
    )
    text = dict(
        hidden_size=args.text_hidden_size,
        intermediate_size=4 * args.text_hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.text_hidden_size // 64),
        max_position_embeddings=77,
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=args.projection_dim)
    torch.manual_seed(0)
    model = CLIPModel(config).eval()
    shutil.rmtree(directory)
    model.save_pretrained(directory)
    image_processor = type(tiny.image_processor)(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tok).save_pretrained(directory)
    n_params = sum(p.numel() for p in model.parameters())
    info = {
        "kind": "random-clip",
        "image_size": size,
        "patch_size": args.patch_size,
        "hidden": hidden,
        "text_hidden": args.text_hidden_size,
        "layers": args.layers,
        "projection_dim": args.projection_dim,
        "parameters": n_params,
    }
    return directory, info


# -- the two contenders -------------------------------------------------------------------------
def run_stage(args: argparse.Namespace, model: str, out: str, ray_address: str) -> dict[str, Any]:
    """``asymvlm embed`` as a user runs it: a fresh process, against the running cluster."""
    cmd = [
        sys.executable,
        "-m",
        "asymvlm.cli",
        "embed",
        "--dataset",
        "hierarcaps",
        "--annotations",
        args.csv,
        "--images",
        args.images,
        "--model",
        model,
        "--split",
        "test",
        "--output",
        out,
        "--batch-size",
        str(args.batch_size),
        "--num-actors",
        str(args.num_actors),
        "--device",
        "cpu",
        "--dtype",
        "fp32",
    ]
    if args.sample:
        cmd += ["--sample", str(args.sample)]
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"stage failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"seconds": seconds, "summary": json.loads(proc.stdout)}


def run_plain_process(
    args: argparse.Namespace, model: str, out: str, threads: int, sort_captions: bool
) -> dict[str, Any]:
    """The plain loop as a user runs it: a fresh ``python`` process (imports included)."""
    job = {
        "model": model,
        "out": out,
        "threads": threads,
        "sort_captions": sort_captions,
        "csv": args.csv,
        "images": args.images,
        "sample": args.sample,
        "batch_size": args.batch_size,
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--plain-job", json.dumps(job)],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"plain loop failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)
    result["phases"] = {
        "start_and_imports": round(seconds - result["seconds"], 3),
        **result["phases"],
    }
    return {**result, "seconds": seconds}


def plain_job(job: dict[str, Any]) -> None:
    """Entry point of the plain process: imports are timed by the caller."""
    import torch

    torch.set_num_threads(job["threads"])
    args = argparse.Namespace(**job)
    os.makedirs(job["out"], exist_ok=True)
    print(json.dumps(run_plain(args, job["model"], job["out"], job["sort_captions"])))


def run_plain(
    args: argparse.Namespace, model: str, out: str, sort_captions: bool = False
) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from asymvlm.data.sources import read_source
    from asymvlm.embedding.encoders import load_encoder

    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    source = read_source(
        "hierarcaps", annotations=args.csv, images=args.images, split="test", sample=args.sample
    )
    ids = source.images.column("image_id").to_pylist()
    paths = source.images.column("path").to_pylist()
    texts = source.captions.column("text").to_pylist()
    t1 = time.perf_counter()
    enc = load_encoder(model, device="cpu", dtype="fp32")
    t2 = time.perf_counter()
    phases["source"], phases["load_model"] = t1 - t0, t2 - t1
    decode = encode = 0.0
    img_emb, img_norm = [], []
    bs = args.batch_size
    for start in range(0, len(paths), bs):
        ta = time.perf_counter()
        batch = []
        for p in paths[start : start + bs]:
            with Image.open(p) as im:
                batch.append(im.convert("RGB"))
        pixels = enc.preprocess_images(batch)
        tb = time.perf_counter()
        emb, norm = enc.encode_pixels(pixels)
        tc = time.perf_counter()
        decode, encode = decode + (tb - ta), encode + (tc - tb)
        img_emb.append(emb)
        img_norm.append(norm)
    phases["decode_preprocess"], phases["encode_images"] = decode, encode
    t3 = time.perf_counter()
    txt_emb, txt_norm = [], []
    if sort_captions:  # the stage's own caption batching: length-sorted chunks
        from asymvlm.embedding.encoding import encode_texts_by_length

        emb, norm = encode_texts_by_length(enc, texts, bs)
        txt_emb.append(emb)
        txt_norm.append(norm)
    else:
        for start in range(0, len(texts), bs):
            emb, norm = enc.encode_texts(texts[start : start + bs])
            txt_emb.append(emb)
            txt_norm.append(norm)
    t4 = time.perf_counter()
    phases["encode_texts"] = t4 - t3

    def table(keys: list[str], embs: list, norms: list) -> pa.Table:
        e = np.concatenate(embs)
        return pa.table(
            {
                "id": pa.array(keys, pa.string()),
                "embedding": pa.FixedSizeListArray.from_arrays(pa.array(e.ravel()), e.shape[1]),
                "norm": np.concatenate(norms),
            }
        )

    pq.write_table(table(ids, img_emb, img_norm), os.path.join(out, "images.parquet"))
    cap_ids = source.captions.column("caption_id").to_pylist()
    pq.write_table(table(cap_ids, txt_emb, txt_norm), os.path.join(out, "texts.parquet"))
    t5 = time.perf_counter()
    phases["write"] = t5 - t4
    return {
        "seconds": t5 - t0,
        "n_images": len(ids),
        "n_captions": len(texts),
        "phases": {k: round(v, 3) for k, v in phases.items()},
    }


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="local CLIP/SigLIP dir (default: build one)")
    p.add_argument(
        "--hidden-size",
        type=int,
        default=None,
        help="build a random CLIP with this vision width (e.g. 768)",
    )
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=32)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--text-hidden-size", type=int, default=512)
    p.add_argument("--projection-dim", type=int, default=512)
    p.add_argument("--data", default=DEFAULT_DATA, help="HierarCaps folder (read only)")
    p.add_argument("--n-images", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-actors", type=int, default=1)
    p.add_argument("--decode-cpus", type=float, default=1.0)
    p.add_argument("--actor-cpus", type=float, default=1.0)
    p.add_argument("--num-cpus", type=int, default=2, help="ray.init(num_cpus=...)")
    p.add_argument(
        "--threads",
        type=lambda v: sorted({int(x) for x in v.split(",")}),
        default=None,
        help="torch thread counts to time the plain loop with, e.g. 1,2 (default: 1 and "
        "torch's own = cores); the fastest is the baseline",
    )
    p.add_argument(
        "--no-sorted",
        action="store_true",
        help="skip the plain loop with the stage's length-sorted caption batches",
    )
    p.add_argument("--tmp", default=None, help="parent folder for temporary files")
    args = p.parse_args(argv)
    args.csv = os.path.join(args.data, "hierarcaps_test.csv")
    args.images = os.path.join(args.data, "images")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--plain-job":
        plain_job(json.loads(sys.argv[2]))
        return None
    args = parse_args(argv)
    import ray
    import torch
    import transformers

    threads = args.threads or sorted({1, torch.get_num_threads()})
    n_total = len(glob.glob(os.path.join(args.images, "*")))
    args.sample = None if args.n_images >= n_total else args.n_images
    root = tempfile.mkdtemp(prefix="embed_throughput-", dir=args.tmp)
    try:
        log("building the model directory")
        model, model_info = build_model(args, root)

        # Warm the page cache: both sides then read the images from memory.
        for path in glob.glob(os.path.join(args.images, "*")):
            with open(path, "rb") as fh:
                fh.read()

        t0 = time.perf_counter()
        context = ray.init(
            address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False
        )
        ray_init_s = time.perf_counter() - t0
        address = context.address_info["gcs_address"]
        log(f"ray.init: {ray_init_s:.2f}s (cluster at {address})")
        load_before = loadavg()

        stage: list[dict[str, Any]] = []
        plain: dict[int, list[dict[str, Any]]] = {t: [] for t in threads}
        plain_sorted: list[dict[str, Any]] = []
        for r in range(args.repeats):
            out = os.path.join(root, f"stage-{r}")
            log(f"repeat {r + 1}/{args.repeats}: stage")
            st = run_stage(args, model, out, address)
            stage.append(st)
            log(f"  stage {st['seconds']:.2f}s")
            shutil.rmtree(out, ignore_errors=True)

            variants = [(t, False) for t in threads]
            if not args.no_sorted:
                variants.append((max(threads), True))
            for t, sort in variants:
                out = os.path.join(root, f"plain-{r}-{t}-{int(sort)}")
                what = "length-sorted captions" if sort else "captions in order"
                log(f"repeat {r + 1}/{args.repeats}: plain, {t} torch thread(s), {what}")
                q = run_plain_process(args, model, out, t, sort)
                (plain_sorted if sort else plain[t]).append(q)
                log(f"  plain {q['seconds']:.2f}s {q['phases']}")
                shutil.rmtree(out, ignore_errors=True)
        load_after = loadavg()
        ray.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    n_img = stage[0]["summary"]["n_images"]
    s_secs = [s["seconds"] for s in stage]
    # The plain baseline of a repeat is its fastest thread setting (the strongest plain loop).
    p_secs = [min(plain[t][r]["seconds"] for t in threads) for r in range(args.repeats)]
    ratios = [p / s for s, p in zip(s_secs, p_secs, strict=True)]  # = stage ips / plain ips
    by_threads = {}
    for t in threads:
        secs = [q["seconds"] for q in plain[t]]
        best = plain[t][secs.index(min(secs))]
        by_threads[str(t)] = {
            "images_per_s": round(n_img / min(secs), 2),
            "seconds": [round(x, 2) for x in secs],
            "ratio_stage_over_this": round(
                statistics.median(q["seconds"] / s for q, s in zip(plain[t], s_secs, strict=True)),
                3,
            ),
            "phases_seconds_best": best["phases"],
        }
    summary = stage[-1]["summary"]
    result = {
        "benchmark": "embed_throughput",
        "work": (
            "images + their captions (4 per image) on both sides; images/s = n_images / wall "
            "seconds of the whole job (source read, model load, encode, write)"
        ),
        "stage_images_per_s": round(n_img / min(s_secs), 2),
        "plain_images_per_s": round(n_img / min(p_secs), 2),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_note": "stage / plain images/s, median over repeats; plain = best thread setting",
        "ratio_best": round(min(p_secs) / min(s_secs), 3),
        "ratios_per_repeat": [round(x, 3) for x in ratios],
        "stage_seconds": [round(x, 2) for x in s_secs],
        "plain_seconds": [round(x, 2) for x in p_secs],
        "stage_images_per_s_median": round(n_img / statistics.median(s_secs), 2),
        "plain_images_per_s_median": round(n_img / statistics.median(p_secs), 2),
        "plain_by_torch_threads": by_threads,
        "plain_sorted": (
            {
                "note": "the plain loop with the stage's caption batching (chunks of --batch-size "
                "captions of similar length), torch threads = max(--threads)",
                "images_per_s": round(n_img / min(q["seconds"] for q in plain_sorted), 2),
                "seconds": [round(q["seconds"], 2) for q in plain_sorted],
                "ratio_stage_over_this": round(
                    statistics.median(
                        q["seconds"] / s for q, s in zip(plain_sorted, s_secs, strict=True)
                    ),
                    3,
                ),
                "phases_seconds_best": min(plain_sorted, key=lambda q: q["seconds"])["phases"],
            }
            if plain_sorted
            else None
        ),
        "ray_init_seconds": round(ray_init_s, 2),
        "config": {
            "model": model if args.model else "(temporary) " + model_info["kind"],
            "model_info": model_info,
            "batch_size": args.batch_size,
            "n_images": n_img,
            "n_captions": summary.get("n_captions"),
            "num_actors": args.num_actors,
            "decode_cpus": args.decode_cpus,
            "actor_cpus": args.actor_cpus,
            "ray_num_cpus": args.num_cpus,
            "plain_torch_threads": threads,
            "repeats": args.repeats,
            "data": args.data,
        },
        "stage_summary": {
            k: summary.get(k)
            for k in ("n_images", "n_captions", "n_image_errors", "n_caption_errors")
        },
        "loadavg_1min_before_after": [load_before, load_after],
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "ray": ray.__version__,
            "transformers": transformers.__version__,
        },
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
