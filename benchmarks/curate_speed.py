"""How fast is the curation job (``asymvlm curate`` on Ray Data), beside a plain loop?

    python benchmarks/curate_speed.py [--rows 2000000] [--small-rows 200000]
                                      [--shard-rows 100000] [--actors 2,1]
                                      [--captions 100000] [--vit-captions 2000] [--no-vit]
                                      [--quiet-cores 0.5] [--quiet-wait 120]

Writes a pool in clip-retrieval's format (``text_emb/text_emb_{i}.npy`` and
``img_emb/img_emb_{i}.npy``: float16 unit vectors, d = ``--dim``; ``metadata/metadata_{i}.parquet``
with key, caption (one in 200 null) and url) of ``--rows`` rows in shards of ``--shard-rows``,
a pool of its first ``--small-rows`` rows (the same shard files, hard-linked; 0: none, and no
memory ratio), and an
asymvlm-vmf adapter (the project's defaults: width 1024, depth 3) trained ``--epochs`` on a
small synthetic world of d = ``--dim``. Then, side by side in one run:

* **plain**: a plain pyarrow + numpy + torch loop written here, in a child process (this script
  with ``--plain-job``; torch's default threads): per shard ``np.load`` of both .npy (mmap),
  pyarrow's batches of the metadata (``--rows-per-batch``), the adapter's κ and uncertainty
  (``load_checkpoint``, ``encode_texts``, ``text_uncertainty_from``: what
  ``Scorer.embedding_uncertainty`` computes) and the CLIP score, one parquet per shard with the
  job's columns (``score_schema``: row, key, has_caption, κ, uncertainty, CLIP score); its κ
  are checked against the job's;
* **job**: ``asymvlm curate --pool POOL --checkpoint CK --output OUT --num-actors N`` in a child
  process (a local Ray started by it; ``$RAY_ADDRESS`` and ``$MLFLOW_TRACKING_URI`` unset), for
  each N of ``--actors``, on the large pool and on the small one: its wall time (Ray's start,
  the scoring, the selections and the figure), rows/s over it and the ratio to the plain loop's,
  when the first scoring actor appeared, the actors' own scoring time (curation.json), the
  peak RSS (``VmHWM``) of the driver and of the scoring actors (sampled from /proc every
  ``--sample-seconds`` over the job's process tree), and the peaks' ratio large / small pool;
* **captions**: an img2dataset-style parquet pool (key, caption, url; ``--caption-shards``
  shards) of ``--captions`` captions through the job with a tiny random CLIP text tower and of
  ``--vit-captions`` with a ViT-B/32-shaped random one (``--encoder``; d = ``--dim``),
  ``--caption-actors`` actors: captions/s over the job's wall and over the actors' scoring
  time, beside ``Scorer.caption_uncertainty`` in this process on a sample (2,000 / 300);

Before each timed child process the script waits (at most ``--quiet-wait`` s) until other
processes use fewer than ``--quiet-cores`` cores, and reports the cores the other processes
used during each run (``/proc/stat`` less the child's own CPU time): on a shared 2-core machine
that is the figure that says whether a timing can be trusted.

Prints one JSON object (progress to stderr).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import loadavg, logger, machine

log = logger("curate_speed")
WORDS = (
    "a dog cat red blue small large man woman child car bus tree street field beach "
    "running sitting holding playing with on in near the of frisbee ball"
).split()


# -- inputs --------------------------------------------------------------------------------------
def captions(rng: np.random.Generator, n: int, start: int = 0) -> list[str]:
    """``n`` short captions of 3-12 words (each ends with its number, so all differ)."""
    lengths = rng.integers(2, 11, n)
    words = rng.integers(0, len(WORDS), (n, 11))
    return [" ".join(WORDS[w] for w in words[i, : lengths[i]]) + f" {start + i}" for i in range(n)]


def unit16(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)


def write_clip_retrieval(pool: str, rows: int, shard_rows: int, dim: int) -> list[int]:
    """A clip-retrieval pool of ``rows`` rows in shards of ``shard_rows``; the shard indices."""
    for kind in ("text_emb", "img_emb", "metadata"):
        os.makedirs(f"{pool}/{kind}", exist_ok=True)
    indices = []
    for i, start in enumerate(range(0, rows, shard_rows)):
        n = min(shard_rows, rows - start)
        rng = np.random.default_rng(i)
        text = rng.standard_normal((n, dim), dtype=np.float32)
        image = text + rng.standard_normal((n, dim), dtype=np.float32)  # cosine ~ 0.7
        np.save(f"{pool}/text_emb/text_emb_{i}.npy", unit16(text))
        np.save(f"{pool}/img_emb/img_emb_{i}.npy", unit16(image))
        caps: list[str | None] = list(captions(rng, n, start))
        for j in range(0, n, 200):
            caps[j] = None
        keys = [f"{start + j:09d}" for j in range(n)]
        meta = pa.table(
            {
                "key": keys,
                "caption": pa.array(caps, pa.string()),
                "url": [f"https://example.com/{k}.jpg" for k in keys],
            }
        )
        pq.write_table(meta, f"{pool}/metadata/metadata_{i}.parquet")
        indices.append(i)
    return indices


def link_pool(source: str, pool: str, indices: list[int]) -> None:
    """A pool of some of ``source``'s shards, hard-linked (no copy)."""
    for kind, ext in (("text_emb", "npy"), ("img_emb", "npy"), ("metadata", "parquet")):
        os.makedirs(f"{pool}/{kind}", exist_ok=True)
        for i in indices:
            os.link(f"{source}/{kind}/{kind}_{i}.{ext}", f"{pool}/{kind}/{kind}_{i}.{ext}")


def write_img2dataset(pool: str, n: int, shard_rows: int) -> None:
    os.makedirs(pool, exist_ok=True)
    for i, start in enumerate(range(0, n, shard_rows)):
        m = min(shard_rows, n - start)
        keys = [f"{start + j:09d}" for j in range(m)]
        rows = {"key": keys, "caption": captions(np.random.default_rng(100 + i), m, start)}
        rows["url"] = [f"https://example.com/{k}.jpg" for k in keys]
        pq.write_table(pa.table(rows), f"{pool}/{i:05d}.parquet")


def trained_adapter(folder: str, world: str, dim: int, epochs: int) -> str:
    """An asymvlm-vmf adapter (project defaults: width 1024, depth 3) trained a little on a
    synthetic world of ``dim`` dimensions."""
    import asymvlm
    from asymvlm.synthetic import WorldConfig, write_world

    write_world(world, WorldConfig(dim=dim, splits={"train": 2000, "val": 200, "test": 200}))
    cfg = {"method": "asymvlm-vmf", "epochs": epochs, "optimizer": "adamw", "lr": 1e-3}
    asymvlm.train(world, "train", cfg, output=folder, progress=False)
    return folder


# -- the plain loop (a child process: this script with --plain-job) ---------------------------
def plain_job(pool: str, checkpoint: str, output: str, rows_per_batch: int) -> dict:
    """Read -> adapter -> write, shard by shard, with pyarrow, numpy and torch alone."""
    import pyarrow.compute as pc
    import torch

    from asymvlm.checkpoints import load_checkpoint
    from asymvlm.curation.shard_scores import score_schema

    started = time.perf_counter()
    method, meta = load_checkpoint(checkpoint, "cpu")
    schema = score_schema(int(meta["dim"]), uid=False, mu=False)  # the job's columns
    method.eval()
    os.makedirs(f"{output}/scores", exist_ok=True)
    rows = 0
    for meta in sorted(glob.glob(f"{pool}/metadata/metadata_*.parquet")):
        i = meta.rsplit("_", 1)[1].removesuffix(".parquet")
        text = np.load(f"{pool}/text_emb/text_emb_{i}.npy", mmap_mode="r")
        image = np.load(f"{pool}/img_emb/img_emb_{i}.npy", mmap_mode="r")
        start = 0
        with pq.ParquetWriter(f"{output}/scores/metadata_{i}.parquet", schema) as writer:
            for batch in pq.ParquetFile(meta).iter_batches(
                batch_size=rows_per_batch, columns=["key", "caption"]
            ):
                stop = start + batch.num_rows
                t = np.asarray(text[start:stop], np.float32)
                im = np.asarray(image[start:stop], np.float32)
                blank = pc.equal(pc.utf8_trim_whitespace(batch["caption"]), "")
                keep = ~pc.fill_null(blank, True).to_numpy(zero_copy_only=False)
                with torch.no_grad():
                    encoded = method.encode_texts(torch.from_numpy(t[keep]))
                    uncertainty = method.text_uncertainty_from(encoded)
                clip = np.einsum("nd,nd->n", t, im)
                clip /= np.maximum(np.linalg.norm(t, axis=1) * np.linalg.norm(im, axis=1), 1e-12)
                columns = {"row": pa.array(np.arange(start, stop)), "key": batch["key"]}
                columns["has_caption"] = pa.array(keep)
                for name, values in (("kappa", encoded["kappa"]), ("uncertainty", uncertainty)):
                    full = np.zeros(batch.num_rows, np.float32)
                    full[keep] = values.numpy()
                    columns[name] = pa.array(full, mask=~keep)
                columns["clip_score"] = pa.array(clip, pa.float32(), mask=~keep)
                writer.write_table(pa.table({n: columns[n] for n in schema.names}, schema=schema))
                start = stop
        rows += start
    return {
        "rows": rows,
        "seconds_in_process": round(time.perf_counter() - started, 2),
        "torch_threads": torch.get_num_threads(),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
    }


# -- the job in a child process, its process tree sampled -------------------------------------
def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def busy_seconds() -> float:
    """CPU seconds the machine has been busy (every core, from /proc/stat)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def children_cpu_seconds() -> float:
    """CPU seconds of this process's ended children and what they waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_quiet(max_busy: float, max_wait: float) -> None:
    """Wait (at most ``max_wait`` s; not at all for 0) until the other processes use under
    ``max_busy`` cores (3 s windows): other work on the 2 cores skews every timing."""
    deadline = time.perf_counter() + max_wait
    while max_wait > 0:
        b0 = busy_seconds()
        time.sleep(3.0)
        used = (busy_seconds() - b0) / 3.0
        if used < max_busy or time.perf_counter() > deadline:
            return
        log(f"waiting for a quiet machine: other processes use {used:.1f} cores")


class Measured:
    """The wall seconds of a child process and the cores other processes used meanwhile."""

    def __init__(self, quiet: tuple[float, float]) -> None:
        self.quiet = quiet

    def __enter__(self) -> Measured:
        wait_quiet(*self.quiet)
        self.load = loadavg()
        self.b0, self.c0, self.t0 = busy_seconds(), children_cpu_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.busy = busy_seconds() - self.b0
        self.ours(children_cpu_seconds() - self.c0)

    def ours(self, cpu_seconds: float) -> None:
        """The child's CPU seconds (a process tree's: as sampled)."""
        self.other_cores = max(0.0, (self.busy - cpu_seconds) / self.wall)
        self.ours_cores = cpu_seconds / self.wall

    def figures(self) -> dict:
        return {
            "loadavg_1min_before": self.load,
            "cores_used_by_it": round(self.ours_cores, 2),
            "cores_used_by_other_processes": round(self.other_cores, 2),
        }


class TreeSampler(threading.Thread):
    """Every ``every`` s: the peak RSS (``VmHWM``) of ``pid`` and of each of its descendants
    whose command line names a scoring actor; when the first such actor appeared."""

    ACTOR_MARKS = ("MapWorker", "_ScoreShards", "ScoreShards")

    def __init__(self, pid: int, every: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.started_at = time.perf_counter()
        self.driver_kib = 0
        self.actors: dict[int, int] = {}
        self.workers: dict[int, int] = {}
        self.first_actor_s: float | None = None
        self.cpu: dict[int, float] = {}  # CPU seconds of each process of the tree, last seen
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self.done.is_set():
            self.driver_kib = max(self.driver_kib, _status_kib(self.pid, "VmHWM") or 0)
            try:
                children = root.children(recursive=True)
            except psutil.Error:
                children = []
            for proc in (root, *children):
                try:
                    times = proc.cpu_times()
                    self.cpu[proc.pid] = times.user + times.system
                except psutil.Error:
                    pass
            for child in children:
                try:
                    cmd = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                if "ray::" not in cmd:
                    continue
                peak = _status_kib(child.pid, "VmHWM") or 0
                self.workers[child.pid] = max(self.workers.get(child.pid, 0), peak)
                if any(mark in cmd for mark in self.ACTOR_MARKS):
                    self.actors[child.pid] = max(self.actors.get(child.pid, 0), peak)
                    if self.first_actor_s is None:
                        self.first_actor_s = time.perf_counter() - self.started_at
            self.done.wait(self.every)

    def stop(self) -> dict:
        self.done.set()
        self.join()
        gib = lambda kib: round(kib / 2**20, 3)  # noqa: E731
        return {
            "driver_peak_rss_gib": gib(self.driver_kib),
            "actor_peak_rss_gib": gib(max(self.actors.values(), default=0)),
            "actors_seen": len(self.actors),
            "ray_worker_peak_rss_gib": gib(max(self.workers.values(), default=0)),
            "first_actor_seconds": None
            if self.first_actor_s is None
            else round(self.first_actor_s, 1),
        }


def child_env() -> dict[str, str]:
    drop = {"RAY_ADDRESS", "MLFLOW_TRACKING_URI"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def run_job(
    pool: str,
    checkpoint: str,
    output: str,
    actors: int,
    every: float,
    quiet: tuple[float, float],
    extra: Sequence[str] = (),
) -> dict:
    """``asymvlm curate`` in a child process: wall, rows/s, phases, peak RSS."""
    args = ["curate", "--pool", pool, "--checkpoint", checkpoint, "--output", output]
    args += ["--num-actors", str(actors), *extra]
    command = [sys.executable, "-m", "asymvlm.cli", *args]
    with open(f"{output}.log", "w") as err, Measured(quiet) as measured:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=child_env())
        sampler = TreeSampler(child.pid, every)
        sampler.started_at = measured.t0
        sampler.start()
        try:
            child.communicate()
        finally:  # this script stopped (timeout's SIGTERM): the job stops too, Ray with it
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
                try:
                    child.wait(60)
                except subprocess.TimeoutExpired:
                    child.kill()
    wall = measured.wall
    memory = sampler.stop()
    measured.ours(sum(sampler.cpu.values()))  # the driver, Ray's processes and its workers
    if child.returncode:
        tail = open(f"{output}.log").read()[-3000:]
        raise SystemExit(f"asymvlm curate failed ({child.returncode}):\n{tail}")
    summary = json.load(open(f"{output}/curation.json"))
    shard_seconds = sum(s["seconds"] for s in summary["shards"])
    scores = sorted(glob.glob(f"{output}/scores/*.parquet"), key=os.path.getmtime)
    selections = os.path.getmtime(f"{output}/curation.json") - os.path.getmtime(scores[-1])
    rows = summary["rows"]
    return {
        "actors": actors,
        "rows": rows,
        "shards": len(summary["shards"]),
        "wall_seconds": round(wall, 1),
        "rows_per_second": round(rows / wall),
        "curate_seconds": summary["seconds"],
        "actor_scoring_seconds": round(shard_seconds, 1),
        "rows_per_second_per_actor_scoring": round(rows / max(shard_seconds, 1e-9)),
        "after_last_shard_seconds": round(selections, 1),
        **memory,
        **measured.figures(),
    }


# -- captions to embed -----------------------------------------------------------------------
def in_process_captions(checkpoint: str, encoder: str, texts: list[str]) -> dict:
    """``Scorer.caption_uncertainty`` on ``texts`` in this process (torch's default threads)."""
    import torch

    from asymvlm.scoring import Scorer

    scorer = Scorer.from_checkpoint(checkpoint, encoder=encoder, device="cpu")
    scorer.caption_uncertainty(texts[:8])  # loaded and warm
    t = time.perf_counter()
    for start in range(0, len(texts), 8192):
        scorer.caption_uncertainty(texts[start : start + 8192])
    seconds = time.perf_counter() - t
    return {
        "captions": len(texts),
        "captions_per_second": round(len(texts) / seconds, 1),
        "torch_threads": torch.get_num_threads(),
    }


def code_measured() -> dict:
    """Which asymvlm was measured (its folder) and the repository's commit."""
    import asymvlm

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    git = ["git", "-C", here, "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip() or None
    return {"asymvlm": os.path.dirname(asymvlm.__file__), "commit": commit}


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def beside_plain(figures: dict, plain: dict) -> None:
    """Add to a large (and a small) pool's job runs their speed over the plain loop's (and
    their peak memory's growth from the small pool to the large)."""
    large, small = figures["large"], figures.get("small")
    figures["ratio_rows_per_second_job_over_plain"] = ratio(
        large["rows_per_second"], plain["rows_per_second"]
    )
    if small:
        figures["peak_rss_large_over_small"] = {
            "driver": ratio(large["driver_peak_rss_gib"], small["driver_peak_rss_gib"]),
            "actor": ratio(large["actor_peak_rss_gib"], small["actor_peak_rss_gib"]),
        }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--plain-job"]:
        pool, checkpoint, output, rows_per_batch = argv[1:5]
        print(json.dumps(plain_job(pool, checkpoint, output, int(rows_per_batch))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--small-rows", type=int, default=200_000)
    parser.add_argument("--shard-rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--actors", default="2,1", help="--num-actors of the job, each run")
    parser.add_argument("--rows-per-batch", type=int, default=8192, help="the plain loop's")
    parser.add_argument("--captions", type=int, default=100_000)
    parser.add_argument("--vit-captions", type=int, default=2_000)
    parser.add_argument("--caption-shards", type=int, default=8, help="shards of each caption pool")
    parser.add_argument("--caption-actors", type=int, default=2)
    parser.add_argument("--no-vit", action="store_true", help="the tiny text tower only")
    parser.add_argument("--sample-seconds", type=float, default=0.5)
    parser.add_argument(
        "--quiet-cores",
        type=float,
        default=0.5,
        help="before each run, wait until the other "
        "processes use fewer cores than this (other work skews every timing)",
    )
    parser.add_argument("--quiet-wait", type=float, default=120.0, help="... at most this long")
    parser.add_argument("--workdir", default=None, help="where the pools go (default: a temp)")
    args = parser.parse_args(argv)
    if args.small_rows % args.shard_rows or args.rows % args.shard_rows:
        parser.error("--rows and --small-rows must be multiples of --shard-rows")
    # timeout's SIGTERM: unwind, so that the job in flight and the temporary pools go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load = loadavg()
    started = time.perf_counter()
    actor_counts = [int(a) for a in args.actors.split(",")]
    quiet = (args.quiet_cores, args.quiet_wait)
    out: dict[str, Any] = {"config": vars(args)}
    from asymvlm.data.tiny import VIT_B32_TEXT, save_tiny_clip

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        t = time.perf_counter()
        adapter = trained_adapter(f"{tmp}/adapter", f"{tmp}/world", args.dim, args.epochs)
        out["train_adapter_seconds"] = round(time.perf_counter() - t, 1)
        log(f"adapter trained in {out['train_adapter_seconds']} s; writing the pools")
        t = time.perf_counter()
        indices = write_clip_retrieval(f"{tmp}/pool-large", args.rows, args.shard_rows, args.dim)
        sizes = ("large", "small") if args.small_rows else ("large",)
        if args.small_rows:
            small = indices[: args.small_rows // args.shard_rows]
            link_pool(f"{tmp}/pool-large", f"{tmp}/pool-small", small)
        out["write_pool_seconds"] = round(time.perf_counter() - t, 1)
        out["pools"] = {
            "format": "clip-retrieval",
            "dim": args.dim,
            "large": {"rows": args.rows, "shards": len(indices)},
            "small": {"rows": args.small_rows, "shards": args.small_rows // args.shard_rows},
            "shard_rows": args.shard_rows,
            "bytes_large": sum(
                os.path.getsize(p) for p in glob.glob(f"{tmp}/pool-large/*/*") if os.path.isfile(p)
            ),
        }
        log(f"pools written in {out['write_pool_seconds']} s: {out['pools']}")

        # 1. the plain loop on the large pool
        log("plain loop, large pool")
        command = [sys.executable, os.path.abspath(__file__), "--plain-job", f"{tmp}/pool-large"]
        command += [adapter, f"{tmp}/plain", str(args.rows_per_batch)]
        with Measured(quiet) as measured:
            done = subprocess.run(command, capture_output=True, text=True, env=child_env())
        if done.returncode:
            raise SystemExit(f"the plain loop failed:\n{done.stderr[-3000:]}")
        plain = json.loads(done.stdout.strip().splitlines()[-1])
        wall = measured.wall
        plain |= {"wall_seconds": round(wall, 1), "rows_per_second": round(plain["rows"] / wall)}
        plain |= measured.figures()
        out["plain"] = plain
        log(f"plain: {plain}")

        # 2. the job, each actor count: the large pool (right after the plain loop), then the
        # small one
        out["job"] = {f"actors_{n}": {} for n in actor_counts}
        for size in sizes:
            for n in actor_counts:
                log(f"asymvlm curate --num-actors {n}, {size} pool")
                result = run_job(
                    f"{tmp}/pool-{size}",
                    adapter,
                    f"{tmp}/job-{n}-{size}",
                    n,
                    args.sample_seconds,
                    quiet,
                )
                out["job"][f"actors_{n}"][size] = result
                log(f"{size}: {result}")
        for figures in out["job"].values():
            beside_plain(figures, plain)
        # the job's κ are the plain loop's
        first = os.path.basename(sorted(glob.glob(f"{tmp}/plain/scores/*.parquet"))[0])
        ours = pq.read_table(f"{tmp}/plain/scores/{first}")
        theirs = pq.read_table(f"{tmp}/job-{actor_counts[0]}-large/scores/{first}")
        assert (
            ours["key"].equals(theirs["key"])
            and ours["kappa"].null_count == theirs["kappa"].null_count
        )
        a = ours["kappa"].to_numpy(zero_copy_only=False)
        b = theirs["kappa"].to_numpy(zero_copy_only=False)
        keep = ~np.isnan(a)
        out["plain_vs_job_max_rel_kappa_diff"] = float(
            np.max(np.abs(a[keep] - b[keep]) / np.abs(b[keep]))
        )

        # 3. captions to embed
        towers = {"tiny": (save_tiny_clip(f"{tmp}/tiny", projection_dim=args.dim), args.captions)}
        if not args.no_vit:
            vit = save_tiny_clip(f"{tmp}/vit", projection_dim=args.dim, text_tower=VIT_B32_TEXT)
            towers["vit-b32"] = (vit, args.vit_captions)
        out["captions"] = {}
        for name, (tower, n) in towers.items():
            pool = f"{tmp}/captions-{name}"
            write_img2dataset(pool, n, -(-n // args.caption_shards))
            log(f"asymvlm curate, {n} captions to embed, {name} text tower")
            result = run_job(
                pool,
                adapter,
                f"{tmp}/job-captions-{name}",
                args.caption_actors,
                args.sample_seconds,
                quiet,
                extra=["--encoder", tower],
            )
            result["captions_per_second"] = result.pop("rows_per_second")
            result["captions_per_second_per_actor_scoring"] = result.pop(
                "rows_per_second_per_actor_scoring"
            )
            texts = captions(np.random.default_rng(7), min(n, 2000 if name == "tiny" else 300))
            result["in_process_scorer"] = in_process_captions(adapter, tower, texts)
            out["captions"][name] = result
            log(f"{name}: {result}")
    out["benchmark_seconds"] = round(time.perf_counter() - started, 1)
    out["code"] = code_measured()
    out["machine"] = machine(load)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
