"""κ for every caption of a pool: the formats read, κ equal to the scorer's, the rules, bad
input, a killed driver, an object store and the MLflow run (asymvlm/curation, `asymvlm curate`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from asymvlm import Scorer, tables
from asymvlm.checkpoints import load_checkpoint
from asymvlm.cli import main as cli_main
from asymvlm.curation import CurateConfig, SelectionRule, curate
from asymvlm.runner import train
from asymvlm.scoring.scorer import GivenEmbeddings
from asymvlm.synthetic import write_world
from tests.helpers import REPO, add_member, sigkill_when, small_world_config

RULES = [
    SelectionRule(name="specific-70", most_specific=0.7),
    SelectionRule(name="clip-30", clip_top=0.3),
    SelectionRule(name="both", most_specific=0.7, clip_min=0.2),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A world in the tiny CLIP's 24 dimensions, an adapter trained on it, its test split."""
    from asymvlm.data.tiny import save_tiny_clip

    base = tmp_path_factory.mktemp("curate")
    root = write_world(str(base / "tables"), small_world_config(dim=24))
    checkpoint = str(base / "adapter")
    cfg = {
        "method": "asymvlm-vmf",
        "epochs": 2,
        "batch_size": 64,
        "optimizer": "adamw",
        "hidden_dim": 64,
    }
    train(root, "train", {**cfg, "lr": 1e-2}, output=checkpoint, progress=False)
    split = tables.read_split(root, "test")
    return {
        "base": base,
        "tables": root,
        "checkpoint": checkpoint,
        "clip": save_tiny_clip(str(base / "tiny-clip")),
        "split": split,
        "texts": [*split.texts[:-2], None, "   "],  # the last two: no caption, a blank one
    }


def clip_retrieval_pool(folder: Path, split, texts: list, shards: int = 2) -> str:
    """``split``'s rows as ``clip inference`` writes them: text_emb/, img_emb/, metadata/."""
    for name in ("text_emb", "img_emb", "metadata"):
        (folder / name).mkdir(parents=True)
    owner = np.asarray(split.text_image_index)
    for i, rows in enumerate(np.array_split(np.arange(len(texts)), shards)):
        np.save(folder / f"text_emb/text_emb_{i}.npy", split.text_embeddings[rows])
        np.save(folder / f"img_emb/img_emb_{i}.npy", split.image_embeddings[owner[rows]])
        meta = {"caption": [texts[r] for r in rows], "key": [f"k{r}" for r in rows]}
        pq.write_table(pa.table(meta), folder / f"metadata/metadata_{i}.parquet")
    return str(folder)


def img2dataset_pool(folder: Path, texts: list, shards: int = 2) -> str:
    """img2dataset's parquet shards: key, caption, url."""
    folder.mkdir(parents=True)
    for i, rows in enumerate(np.array_split(np.arange(len(texts)), shards)):
        table = {"key": [f"{i:05d}{r:04d}" for r in rows], "caption": [texts[r] for r in rows]}
        table["url"] = [f"http://127.0.0.1/{r}.jpg" for r in rows]
        pq.write_table(pa.table(table), folder / f"{i:05d}.parquet")
    return str(folder)


def scores(output: str) -> pa.Table:
    """Every shard's scores, in shard order."""
    files = sorted(Path(output, "scores").glob("*.parquet"))
    return pa.concat_tables(pq.read_table(f) for f in files)


def assert_most_specific(kappa: np.ndarray, kept: np.ndarray, fraction: float) -> None:
    """``kept`` is the top ``fraction`` of ``kappa``: the highest κ, as few as ties allow."""
    assert len(kept) >= fraction * len(kappa)
    assert kept.min() >= np.sort(kappa)[-len(kept)]  # none kept below one dropped
    assert (kappa > kept.min()).sum() < fraction * len(kappa)  # a higher cut keeps too few


def run_job(pool: str, world: dict, output: Path, **options) -> dict:
    cfg = CurateConfig(pool=pool, checkpoint=world["checkpoint"], output=str(output), **options)
    return curate(cfg).model_dump()


def test_tables_get_the_kappa_of_asymvlm_score(world, tmp_path) -> None:
    summary = run_job(world["tables"], world, tmp_path / "out", split="test", rules=RULES)
    score = ["score", "--embeddings", world["tables"], "--split", "test"]
    score += ["--checkpoint", world["checkpoint"], "--output", str(tmp_path / "s.parquet")]
    assert cli_main([*score, "--quiet"]) == 0
    want = pq.read_table(tmp_path / "s.parquet")
    got = scores(str(tmp_path / "out"))
    assert got["key"].to_pylist() == want["caption_id"].to_pylist()
    np.testing.assert_allclose(got["kappa"].to_numpy(), want["kappa"].to_numpy(), rtol=1e-6)
    assert summary["rows"] == len(want) and summary["null_captions"] == 0
    # the CLIP score: the cosine of the caption's and its image's frozen embeddings
    split = world["split"]
    image = split.image_embeddings[split.text_image_index]
    cosine = np.einsum("nd,nd->n", split.text_embeddings, image)
    np.testing.assert_allclose(got["clip_score"].to_numpy(), cosine, atol=1e-6)


def test_embedded_pools_get_the_scorers_kappa_and_a_null_one_without_caption(
    world, tmp_path
) -> None:
    pool = clip_retrieval_pool(tmp_path / "pool", world["split"], world["texts"])
    summary = run_job(pool, world, tmp_path / "out", write_mu=True, rules=RULES)
    got = scores(str(tmp_path / "out"))
    n = len(world["texts"])
    assert got["row"].to_pylist() == [*range(n // 2), *range(n - n // 2)]
    assert got["key"].to_pylist() == [f"k{r}" for r in range(n)]
    assert summary["rows"] == n and summary["null_captions"] == 2
    assert got["kappa"].null_count == got["clip_score"].null_count == got["mu"].null_count == 2
    unit = np.load(f"{pool}/text_emb/text_emb_0.npy")[:4]  # float16 on disk, as clip-retrieval's
    scorer = Scorer(*load_checkpoint(world["checkpoint"], "cpu"), GivenEmbeddings(24))
    want = scorer.embedding_uncertainty(unit.astype(np.float32))
    np.testing.assert_allclose(got["kappa"].to_numpy()[:4], want.kappa, rtol=1e-6)
    mu = np.stack(got["mu"].to_numpy(zero_copy_only=False)[:4])
    np.testing.assert_allclose(mu, want.mu, atol=1e-6)


def webdataset_pool(folder: Path, texts: list) -> str:
    """A tar of img2dataset's WebDataset output: KEY.jpg, KEY.txt (or only KEY.json)."""
    folder.mkdir(parents=True)
    with tarfile.open(folder / "00000.tar", "w") as tar:
        for i, text in enumerate(texts):
            key = f"{i:09d}"
            add_member(tar, f"{key}.jpg", b"\xff\xd8")
            if text is not None and i % 2:
                add_member(tar, f"{key}.txt", text.encode())
            add_member(tar, f"{key}.json", json.dumps({"key": key, "caption": text}).encode())
    return str(folder)


def test_captions_are_embedded_with_the_encoder_as_the_scorer_embeds_them(world, tmp_path) -> None:
    texts = world["texts"]
    scorer = Scorer.from_checkpoint(world["checkpoint"], encoder=world["clip"], device="cpu")
    want = scorer.caption_uncertainty(texts[:-2]).kappa
    for name, pool in (
        ("img2dataset", img2dataset_pool(tmp_path / "i2d", texts)),
        ("webdataset", webdataset_pool(tmp_path / "wds", texts)),
    ):
        summary = run_job(pool, world, tmp_path / name, encoder=world["clip"], rules=RULES[:1])
        assert summary["format"] == name
        got = scores(str(tmp_path / name))
        assert summary["null_captions"] == 2 and got["kappa"].null_count == 2
        np.testing.assert_allclose(got["kappa"].to_numpy()[:-2], want, rtol=1e-6, err_msg=name)
        kept = pq.read_table(tmp_path / name / "selections" / "specific-70.parquet")
        assert len(kept) == summary["rules"][0]["kept"]
        assert_most_specific(got["kappa"].drop_null().to_numpy(), kept["kappa"].to_numpy(), 0.7)


def test_datacomp_selections_are_sorted_uid_pairs(world, tmp_path) -> None:
    rng = np.random.default_rng(0)
    texts = world["texts"]
    uids = [f"{rng.integers(2**63):016x}{rng.integers(2**63):016x}" for _ in texts]
    (tmp_path / "pool").mkdir()
    pq.write_table(pa.table({"uid": uids, "text": texts}), tmp_path / "pool" / "00000.parquet")
    summary = run_job(
        str(tmp_path / "pool"), world, tmp_path / "out", encoder=world["clip"], rules=RULES[:1]
    )
    kept = pq.read_table(tmp_path / "out" / "selections" / "specific-70.parquet")
    pairs = np.load(tmp_path / "out" / "selections" / "specific-70.npy")
    assert pairs.dtype == np.dtype("u8,u8") and len(pairs) == summary["rules"][0]["kept"]
    want = sorted((int(u[:16], 16), int(u[16:], 16)) for u in kept["uid"].to_pylist())
    assert pairs.tolist() == want


def test_rules_cut_where_they_say(world, tmp_path) -> None:
    pool = clip_retrieval_pool(tmp_path / "pool", world["split"], world["texts"])
    rules = [*RULES, SelectionRule(name="kappa-min", kappa_min=2.0)]
    summary = run_job(pool, world, tmp_path / "out", rules=rules)
    got = scores(str(tmp_path / "out"))
    got = got.filter(pc.is_valid(got["kappa"]))
    kappa, clip = got["kappa"].to_numpy(), got["clip_score"].to_numpy()
    kept = {
        r["name"]: pq.read_table(tmp_path / "out" / "selections" / f"{r['name']}.parquet")
        for r in summary["rules"]
    }
    assert_most_specific(kappa, kept["specific-70"]["kappa"].to_numpy(), 0.7)
    assert_most_specific(clip, kept["clip-30"]["clip_score"].to_numpy(), 0.3)
    both = kept["both"]
    assert both["clip_score"].to_numpy().min() >= 0.2
    assert set(both["key"].to_pylist()) == set(kept["specific-70"]["key"].to_pylist()) & set(
        got.filter(pc.greater_equal(got["clip_score"], 0.2))["key"].to_pylist()
    )
    assert kept["kappa-min"].num_rows == int((kappa >= 2.0).sum())
    figure = tmp_path / "out" / "kappa.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((tmp_path / "out" / "curation.json").read_text())
    assert [r["kept"] for r in written["rules"]] == [len(t) for t in kept.values()]
    assert sum(written["kappa_histogram"]["counts"]) == len(kappa)


def error_line(argv: list[str], capsys) -> str:
    """The one line an ``asymvlm`` command that exits 2 prints."""
    assert cli_main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_bad_input_stops_with_one_line_before_any_work(world, tmp_path, capsys) -> None:
    from tests.helpers import save_adapter

    split, texts = world["split"], world["texts"]
    base, clip = ["curate", "--checkpoint", world["checkpoint"]], world["clip"]
    wide = tmp_path / "wide"
    clip_retrieval_pool(wide, split, texts)
    np.save(wide / "text_emb/text_emb_0.npy", np.ones((90, 32), np.float16))
    short = tmp_path / "short"
    clip_retrieval_pool(short, split, texts)
    np.save(short / "img_emb/img_emb_1.npy", np.ones((89, 24), np.float16))
    captions = img2dataset_pool(tmp_path / "captions", texts)
    save_adapter(tmp_path / "determ", "determ-ft", dim=24)
    cases = {
        "wide": [*base, "--pool", str(wide)],
        "short": [*base, "--pool", str(short)],
        "clip": [*base, "--pool", captions, "--rule", "c:clip_top=0.3", "--encoder", clip],
        "no-encoder": [*base, "--pool", captions],
        "no-kappa": ["curate", "--checkpoint", str(tmp_path / "determ"), "--pool", captions]
        + ["--encoder", clip],
        "rule": [*base, "--pool", captions, "--rule", "specific", "--encoder", clip],
        "fraction": [*base, "--pool", captions, "--rule", "none:most_specific=0"],
    }
    said = {
        name: error_line([*argv, "--output", str(tmp_path / f"out-{name}")], capsys)
        for name, argv in cases.items()
    }
    assert said["wide"] == (
        f"error: {wide}/text_emb/text_emb_0.npy: text embeddings of 32 dimensions, the adapter "
        "(asymvlm-vmf) takes 24"
    )
    assert said["short"] == (
        f"error: {short}/img_emb/img_emb_1.npy has 89 rows, {short}/metadata/metadata_1.parquet "
        "90: the embeddings and the metadata must match row for row"
    )
    assert said["clip"] == (
        "error: rule 'c' keeps nothing: the pool has no image embeddings, hence no CLIP score"
    )
    assert said["no-encoder"] == (
        f"error: {captions}: its captions are to be embedded, and the adapter names no encoder "
        "(it was trained on tables without one): give --encoder"
    )
    assert said["no-kappa"] == "error: rule 'specific-70' keeps nothing: determ-ft has no κ"
    assert said["rule"] == "error: --rule 'specific': write NAME:KEY=VALUE[,KEY=VALUE]"
    assert said["fraction"].startswith("error: ") and "most_specific" in said["fraction"]
    assert not list(tmp_path.glob("out-*")), "nothing is written before the checks pass"


def curate_command(pool: str, world: dict, output: Path) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "asymvlm.cli",
        "curate",
        "--pool",
        pool,
        "--output",
        str(output),
    ]
    return command + ["--checkpoint", world["checkpoint"], "--encoder", world["clip"]]


def written(output: Path) -> dict[str, tuple[int, int]]:
    """Each scores file's (inode, modification time): a rewritten file changes both."""
    files = Path(output, "scores").glob("*.parquet")
    return {f.stem: (f.stat().st_ino, f.stat().st_mtime_ns) for f in files}


@pytest.mark.slow
def test_a_killed_driver_goes_on_and_every_row_is_written_once(world, tmp_path) -> None:
    texts = [t for t in world["texts"] if t and t.strip()]
    pool = img2dataset_pool(tmp_path / "pool", texts * 20, shards=24)
    (tmp_path / "pool" / "00003.parquet").write_bytes(b"PAR1 not a parquet file")
    out = tmp_path / "out"
    command = curate_command(pool, world, out)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}

    def a_shard_written() -> bool:
        return bool(written(out))

    sigkill_when(command, a_shard_written, env=env)
    before = written(out)
    assert 1 <= len(before) < 23, "killed mid-run"
    config = tmp_path / "curate.yaml"  # the same job through the cluster's entry point
    job = {"pool": pool, "output": str(out), "checkpoint": world["checkpoint"]}
    config.write_text(json.dumps({**job, "encoder": world["clip"]}))
    script = [sys.executable, "pipelines/curate.py", "--config", str(config)]
    second = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2, second.stderr[-3000:]
    assert lines[-1].startswith("error: 1 shard(s) left out, run again to retry: 00003 (")
    assert sum("shard 00003 left out: " in line for line in lines) == 1
    after = written(out)
    assert {k: after[k] for k in before} == before, "shards finished before the kill are kept"
    assert sorted(after) == [f"{i:05d}" for i in range(24) if i != 3]
    img2dataset_pool(tmp_path / "fixed", texts * 20, shards=24)
    os.replace(tmp_path / "fixed" / "00003.parquet", tmp_path / "pool" / "00003.parquet")
    third = run_job(pool, world, out, encoder=world["clip"])  # the same job, in this process
    assert {k: v for k, v in written(out).items() if k != "00003"} == after
    assert [s["shard"] for s in third["shards"]] == [f"{i:05d}" for i in range(24)]
    keys = scores(str(out))["key"].to_pylist()
    want = pa.concat_tables(pq.read_table(f) for f in sorted(Path(pool).glob("*.parquet")))
    assert keys == want["key"].to_pylist() and len(set(keys)) == len(keys) == 178 * 20
    assert third["rows"] == 178 * 20 and not third["failed"]


def test_a_pool_on_s3_is_scored_to_s3_as_here_and_logged_to_mlflow(world, tmp_path, bucket):
    import mlflow

    from asymvlm.tracking import json_artifact

    local = clip_retrieval_pool(tmp_path / "pool", world["split"], world["texts"])
    bucket.put(local + "/", "bucket/pool/", recursive=True)
    here = run_job(local, world, tmp_path / "here", rules=RULES)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    there = run_job("s3://bucket/pool", world, "s3://bucket/out", rules=RULES, tracking_uri=uri)
    assert [r["kept"] for r in there["rules"]] == [r["kept"] for r in here["rules"]]
    for shard in ("metadata_0", "metadata_1"):
        with bucket.open(f"bucket/out/scores/{shard}.parquet", "rb") as f:
            remote = pq.read_table(f)
        assert remote.equals(pq.read_table(tmp_path / "here" / "scores" / f"{shard}.parquet"))
    assert bucket.exists("bucket/out/selections/clip-30.parquet")
    assert bucket.exists("bucket/out/kappa.png") and bucket.exists("bucket/out/curation.json")
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("curate").experiment_id])
    assert run.data.metrics["rows"] == 180 and run.data.metrics["null_captions"] == 2
    assert run.data.metrics["kept_fraction.clip-30"] == there["rules"][1]["fraction"]
    shards = json_artifact(uri, run.info.run_id, "shards.json")
    assert [(s["shard"], s["rows"]) for s in shards] == [("metadata_0", 90), ("metadata_1", 90)]
    histogram = json_artifact(uri, run.info.run_id, "kappa_histogram.json")
    assert sum(histogram["counts"]) == 178
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "kappa.png" in names and run.info.status == "FINISHED"


def test_tables_without_norms_are_scored_on_their_unit_vectors(tmp_path) -> None:
    rng = np.random.default_rng(0)
    unit = rng.standard_normal((64, 8))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    root = str(tmp_path / "tables")
    tables.write_manifest(root, {"dim": 8, "model": "toy", "dtype": "float32"})
    ids = [f"i{k}" for k in range(64)]
    texts = dict(caption_ids=[f"c{k}" for k in range(64)], caption_image_ids=ids)
    tables.write_split(
        root,
        "train",
        image_ids=ids,
        image_embeddings=unit,
        texts=["a"] * 64,
        text_embeddings=unit[::-1],
        **texts,
    )
    checkpoint = str(tmp_path / "adapter")
    cfg = {"method": "asymvlm-vmf", "epochs": 1, "batch_size": 32, "hidden_dim": 16}
    train(root, "train", cfg, output=checkpoint, progress=False)
    out = CurateConfig(pool=root, checkpoint=checkpoint, output=str(tmp_path / "out"))
    summary = curate(out)
    assert summary.rows == 64 and not summary.failed
    want = Scorer(*load_checkpoint(checkpoint, "cpu"), GivenEmbeddings(8))
    kappa = want.embedding_uncertainty(unit[::-1].astype(np.float32)).kappa
    np.testing.assert_allclose(scores(str(tmp_path / "out"))["kappa"].to_numpy(), kappa, rtol=1e-6)


def test_a_fraction_of_one_keeps_every_caption_however_small_its_kappa() -> None:
    from asymvlm.curation.selection import LOG_KAPPA_EDGES, Histogram, thresholds

    kappa = Histogram(LOG_KAPPA_EDGES)
    kappa.add(np.log([1e-30, 1e-6, 1.0, 2.0]))
    rule = SelectionRule(name="all", most_specific=1.0)
    assert thresholds(rule, kappa, Histogram(LOG_KAPPA_EDGES))[0] == 0.0  # κ >= 0: all kept
    half = SelectionRule(name="half", most_specific=0.5)
    assert 1e-6 < thresholds(half, kappa, Histogram(LOG_KAPPA_EDGES))[0] <= 1.0
