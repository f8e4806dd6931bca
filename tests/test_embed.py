"""The embedding stage (Ray Data) end to end: tables, job identity, locks, resume, s3://."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from asymvlm import output_lock, storage, tables
from asymvlm.cli import main as cli_main
from asymvlm.embedding.embed_config import DUMMY_PROMPTS, EmbedConfig
from asymvlm.embedding.encoders import files_sha256, load_encoder
from asymvlm.errors import ConfigError, LockError
from asymvlm_ray.embedding import JOB, SUCCESS, run_embed
from tests.helpers import (
    REPO,
    hierarcaps_subset,
    library_lines,
    requires_hierarcaps,
    sigkill_when,
    tiny_encoders,
)

BASE = dict(dataset="hierarcaps", split="test")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    return tiny_encoders(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def hc(tmp_path_factory) -> dict[str, str]:
    """12 real HierarCaps hierarchies and their images, one image truncated, one deleted."""
    csv, images = hierarcaps_subset(tmp_path_factory.mktemp("hc"), n=12)
    names = sorted(os.listdir(images))
    truncated, deleted = names[3], names[7]
    data = (Path(images) / truncated).read_bytes()
    (Path(images) / truncated).write_bytes(data[: len(data) // 3])
    os.remove(Path(images) / deleted)
    return {"annotations": csv, "images": images, "truncated": truncated, "deleted": deleted}


def _args(job: dict[str, str], model: str, output: str, *extra: str) -> list[str]:
    args = ["--dataset", "hierarcaps", "--annotations", job["annotations"], "--images"]
    return [*args, job["images"], "--model", model, "--split", "test", "--output", output, *extra]


@pytest.fixture(scope="module")
def embedded(ray_session, models, hc, tmp_path_factory) -> str:
    """``asymvlm embed`` of ``hc`` with the tiny CLIP and its pre-projection features."""
    out = str(tmp_path_factory.mktemp("embedded") / "tables")
    extra = ("--batch-size", "4", "--shard-size", "4", "--pre-projection")
    assert cli_main(["embed", *_args(hc, models["clip"], out, *extra)]) == 0
    return out


def _cfg(hc, models, output: str, **kw) -> EmbedConfig:
    paths = {k: hc[k] for k in ("annotations", "images")}
    return EmbedConfig(**BASE, **paths, model=models["clip"], output=output, **kw)


def _snapshot(root: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in Path(root).rglob("*") if p.is_file()}


@requires_hierarcaps
def test_tables_hold_the_encoders_rows_and_the_errors(embedded, models, hc) -> None:
    from PIL import Image

    from asymvlm.splits import load_split

    split = tables.read_split(embedded, "test")  # validates ids, norms, dims
    assert split.n_images == 10 and split.n_texts == 40
    assert np.bincount(split.extra_text_columns["level"]).tolist() == [10] * 4
    manifest = tables.read_manifest(embedded)
    assert (manifest.model, manifest.dim) == (models["clip"], 24)
    errors = tables.read_parts(embedded, "test", "errors").to_pylist()
    reasons = {os.path.basename(e["path"]): e["reason"] for e in errors if e["kind"] == "image"}
    assert set(reasons) == {hc["truncated"], hc["deleted"]}
    assert "truncated" in reasons[hc["truncated"]].lower()
    assert "FileNotFoundError" in reasons[hc["deleted"]]
    caption_errors = [e for e in errors if e["kind"] == "caption"]
    assert len(caption_errors) == 8 and all("failed" in e["reason"] for e in caption_errors)
    # every row is what the frozen encoder gives for that very image / caption
    encoder = load_encoder(models["clip"], device="cpu")
    files = [os.path.join(hc["images"], f"{i}.jpg") for i in split.image_ids]
    pixels = encoder.preprocess_images([Image.open(f).convert("RGB") for f in files])
    unit, norm, image_pre = encoder.encode_pixels(pixels, pre=True)
    np.testing.assert_allclose(split.image_embeddings, unit, atol=1e-5)
    np.testing.assert_allclose(split.image_norms, norm, rtol=1e-5)
    np.testing.assert_allclose(split.image_features_pre, image_pre, atol=1e-5)
    unit, norm, text_pre = encoder.encode_texts(split.texts, pre=True)
    np.testing.assert_allclose(split.text_embeddings, unit, atol=1e-5)
    np.testing.assert_allclose(split.text_norms, norm, rtol=1e-5)
    np.testing.assert_allclose(split.text_features_pre, text_pre, atol=1e-5)
    # pre-projection: the manifest records the widths, W @ pre is the raw projection
    assert manifest.pre_dim == {"image": 32, "text": 32}
    projection = tables.read_projection(embedded)
    raw = split.text_embeddings * split.text_norms[:, None]
    np.testing.assert_allclose(split.text_features_pre @ projection["text"].T, raw, atol=1e-5)
    data = load_split(embedded, "test")
    np.testing.assert_array_equal(data.image_pre.numpy(), split.image_features_pre)
    np.testing.assert_array_equal(data.image_projection.numpy(), projection["image"])


@requires_hierarcaps
def test_finished_job_is_skipped_and_a_lost_shard_restored(embedded, models, hc, tmp_path, capsys):
    out = str(tmp_path / "copy")
    shutil.copytree(embedded, out)
    before = _snapshot(out)
    # the same job from a pipeline YAML file finds it finished: nothing is embedded again
    from pipelines.embed import main as pipeline_main

    config = tmp_path / "embed.yaml"
    config.write_text(
        f"defaults: {{model: {models['clip']}, batch_size: 4, pre_projection: true}}\n"
        f"jobs:\n  - {{dataset: hierarcaps, annotations: {hc['annotations']}, "
        f"images: {hc['images']}, split: test, output: {out}, shard_size: 4}}\n"
    )
    assert pipeline_main(["--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["skipped"] is True
    assert _snapshot(out) == before
    # losing shard 1 (its marker and texts part): the re-run restores exactly that shard
    for name in ("_parts/part-00001.json", "texts/part-00001.parquet", SUCCESS):
        os.remove(os.path.join(out, "test", name))
    summary = run_embed(_cfg(hc, models, out, batch_size=4, shard_size=4, pre_projection=True))
    assert "skipped" not in summary
    after = _snapshot(out)
    assert after["test/images/part-00000.parquet"] == before["test/images/part-00000.parquet"]
    resumed, complete = tables.read_split(out, "test"), tables.read_split(embedded, "test")
    assert resumed.caption_ids == complete.caption_ids
    np.testing.assert_allclose(resumed.text_embeddings, complete.text_embeddings, atol=1e-6)


def test_webdataset_shards_embedded_with_siglip(ray_session, models, tmp_path) -> None:
    from tests.helpers import write_shards

    expected, out = write_shards(tmp_path / "shards"), str(tmp_path / "cc")
    paths = {"annotations": str(tmp_path / "shards"), "output": out}
    cfg = EmbedConfig(dataset="cc", model=models["siglip"], split="train", batch_size=4, **paths)
    assert run_embed(cfg)["n_images"] == 8
    split, manifest = tables.read_split(out, "train"), tables.read_manifest(out)
    assert sorted(split.image_ids) == sorted(expected)
    assert sorted(split.texts) == sorted(caption for _, caption in expected.values())
    assert manifest.dim == 32 and manifest.extra["family"] == "siglip"


def test_cifar_embedded_with_a_prompt_per_class_and_template(ray_session, models, tmp_path):
    from asymvlm.data.templates import templates_for
    from tests.helpers import cifar_rows, dump

    root = tmp_path / "cifar" / "cifar-10-batches-py"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    dump(root / "batches.meta", {b"label_names": [b"cat", b"dog", b"ship"]})
    for b in range(1, 6):
        dump(root / f"data_batch_{b}", {b"labels": [0, 1], b"data": cifar_rows(rng, 2)[1]})
    dump(root / "test_batch", {b"labels": [0, 1, 2, 2, 1, 0], b"data": cifar_rows(rng, 6)[1]})
    out, cifar = str(tmp_path / "tables"), templates_for("cifar10")
    paths = {"images": str(tmp_path / "cifar"), "output": out}
    run_embed(EmbedConfig(dataset="cifar10", model=models["clip"], split="test", **paths))
    assert tables.read_parts(out, "test", "images")["label"].to_pylist() == [0, 1, 2, 2, 1, 0]
    prompts = tables.read_parts(out, "test", "prompts")
    want = [t.format(name) for name in ("cat", "dog", "ship") for t in cifar] + list(DUMMY_PROMPTS)
    assert prompts["text"].to_pylist() == want
    assert prompts["class_index"].to_pylist() == [c for c in range(3) for _ in cifar] + [-1] * 3
    encoder = load_encoder(models["clip"], device="cpu")
    emb = tables.column_matrix(prompts["embedding"])
    np.testing.assert_allclose(emb, encoder.encode_texts(want)[0], atol=1e-5)


@requires_hierarcaps
@pytest.mark.slow
def test_open_clip_tables_and_the_scorer_that_reloads_the_model(
    ray_session, models, hc, tmp_path, capsys
) -> None:
    import mlflow
    import pyarrow.parquet as pq

    from asymvlm import Scorer, tracking
    from asymvlm.embedding.encoders.names import parse_name
    from asymvlm.scoring.models import log_adapter_models

    name, out = models["open_clip"], str(tmp_path / "tables")
    assert cli_main(["embed", *_args(hc, name, out, "--batch-size", "8")]) == 0
    split, manifest = tables.read_split(out, "test"), tables.read_manifest(out).to_dict()
    unit, _ = load_encoder(name, device="cpu").encode_texts(split.texts)
    np.testing.assert_allclose(split.text_embeddings, unit, atol=1e-5)
    assert (manifest["model"], manifest["family"], manifest["dim"]) == (name, "open_clip", 24)
    assert manifest["files_sha256"] == files_sha256(parse_name(name).local)
    # pre-projection features are transformers-CLIP only: exit 2 before anything runs
    assert cli_main(["embed", *_args(hc, name, out, "--pre-projection")]) == 2
    assert "CLIP models only" in capsys.readouterr().err
    checkpoint, scores = str(tmp_path / "adapter"), str(tmp_path / "scores.parquet")
    train = ["train", "--embeddings", out, "--split", "test", "--method", "asymvlm-vmf"]
    assert cli_main([*train, "--epochs", "2", "--output", checkpoint, "--quiet"]) == 0
    meta = json.loads(Path(checkpoint, "config.json").read_text())
    assert meta["encoder"]["model"] == name and meta["encoder"]["family"] == "open_clip"
    score = ["score", "--embeddings", out, "--split", "test", "--checkpoint", checkpoint]
    assert cli_main([*score, "--output", scores, "--quiet"]) == 0
    got = Scorer.from_checkpoint(checkpoint, device="cpu").caption_uncertainty(split.texts)
    np.testing.assert_allclose(got.kappa, pq.read_table(scores)["kappa"].to_numpy(), rtol=2e-5)
    run = tracking.open_run(tracking.default_tracking_uri(str(tmp_path)), "e", "t", kind="trial")
    log_adapter_models(run, checkpoint)  # the MLflow text model requires open_clip
    run.end()
    with tracking.global_tracking_uri(tracking.default_tracking_uri(str(tmp_path))):
        requirements = mlflow.pyfunc.get_model_dependencies(f"runs:/{run.id}/text-adapter")
    assert "open_clip_torch" in Path(requirements).read_text()


# -- the configuration and job identity -------------------------------------------------------
@pytest.fixture
def small(tmp_path) -> dict[str, str]:
    """Six made-up HierarCaps rows (their image files need not exist) and an empty model."""
    lines = ["id,captions,image_url"]
    lines += [f"{i},a => a b => a b c => a b c d {i},http://x/img{i:03d}.jpg" for i in range(6)]
    (tmp_path / "hc.csv").write_text("\n".join(lines) + "\n")
    for folder in ("images", "model"):
        (tmp_path / folder).mkdir()
    names = {"annotations": "hc.csv", "images": "images", "model": "model", "output": "out"}
    return {key: str(tmp_path / name) for key, name in names.items()}


def _record(cfg: EmbedConfig, name: str, **extra) -> None:
    from asymvlm.data.sources import read_source

    source = read_source(cfg.dataset, annotations=cfg.annotations, images=cfg.images, split="test")
    payload = {"fingerprint": cfg.fingerprint(source), **extra}
    storage.write_json(cfg.output, f"{cfg.split}/{name}", payload)


BAD = dict(batch_size=0, actor_cpus=float("nan"), device="tpu", dataset="hierarcapz")
BAD |= dict(split="../test", text_perturbation="typos:9", batchsize=8)


@pytest.mark.parametrize(("key", "value"), BAD.items())
def test_embed_config_is_validated_on_construction(key, value) -> None:
    with pytest.raises(ValidationError) as exc:
        EmbedConfig(**{**BASE, "model": "m", "output": "o", key: value})
    assert exc.value.errors()[0]["loc"] == (key,)


def test_missing_local_inputs_are_named_before_anything_is_written(small, hub_cache) -> None:
    from asymvlm_ray.schema import load_embed_jobs

    for key in ("annotations", "images", "id_list", "model"):
        cfg = EmbedConfig(**BASE, **{**small, key: small["images"] + "-missing"})
        with pytest.raises(ConfigError, match=rf"^{key} '.*images-missing': no such file"):
            run_embed(cfg)
    assert not os.path.exists(small["output"])
    # URIs are the readers' business; a hub id is not a path; a glob must match something
    EmbedConfig(**BASE, **{**small, "annotations": "s3://bucket/hc.csv"}).check_inputs()
    hub_cache("openai/clip-vit-base-patch32", "config.json")
    EmbedConfig(**BASE, **{**small, "model": "openai/clip-vit-base-patch32"}).check_inputs()
    shards = {**small, "annotations": small["images"] + "/*.tar"}
    with pytest.raises(ConfigError, match="no file matches"):
        EmbedConfig(**{**BASE, "dataset": "cc"}, **shards).check_inputs()
    bad = Path(small["images"]).parent / "bad.yaml"
    bad.write_text("dataset: hierarcaps\nmodel: x\nsplit: t\noutput: o\nbatchsize: 3\n")
    with pytest.raises(ValueError, match="bad.yaml: batchsize: unknown key .*'batch_size'"):
        load_embed_jobs(str(bad))


def test_job_record_comes_first_and_another_jobs_output_is_refused(small) -> None:
    from types import SimpleNamespace

    def no_ray() -> None:
        raise RuntimeError("stopped where Ray would start")

    theirs = EmbedConfig(**BASE, **small, text_perturbation="typos:3")
    with pytest.raises(RuntimeError, match="stopped where Ray"):
        run_embed(theirs, SimpleNamespace(require=no_ray))  # the entry point's Ray session
    fingerprint = storage.read_json(theirs.output, f"test/{JOB}")["fingerprint"]
    assert fingerprint["text_perturbation"] == "typos:3" and fingerprint["n_images"] == 6
    assert sorted(os.listdir(os.path.join(theirs.output, "test"))) == [JOB, output_lock.LOCK_NAME]
    for what in ("was written by another job", "holds a finished embedding"):
        with pytest.raises(tables.TableError) as exc:
            run_embed(EmbedConfig(**BASE, **small))
        assert str(exc.value) == (
            f"{small['output']}/test {what}{' of another job' * ('finished' in what)}: "
            "text_perturbation None here vs 'typos:3' there; choose another --output (or --split)"
        )
        _record(theirs, SUCCESS, summary={})
    # edited annotations (same path, same counts) are another job too
    path = Path(small["annotations"])
    path.write_text(path.read_text().replace("a b c d 5", "a b c e 5"))
    with pytest.raises(tables.TableError, match=r"source_sha256 '[0-9a-f]{12}\.\.\.' here"):
        run_embed(theirs)
    os.remove(os.path.join(small["output"], "test", JOB))
    os.remove(os.path.join(small["output"], "test", SUCCESS))
    storage.write_json(theirs.output, "test/_parts/part-00000.json", {"images": 3})
    with pytest.raises(tables.TableError, match=r"holds _parts/ markers but no _JOB\.json"):
        run_embed(theirs)


def test_spellings_of_one_location_are_one_job(small, tmp_path, monkeypatch) -> None:
    from asymvlm_ray.embedding.shards import check_manifest

    monkeypatch.chdir(tmp_path)
    relative = {k: os.path.relpath(v) for k, v in small.items()}
    _record(EmbedConfig(**BASE, **{**relative, "model": "./model"}), SUCCESS, summary={"n": 6})
    again = run_embed(EmbedConfig(**BASE, **{**small, "images": small["images"] + "/"}))
    assert again == {"n": 6, "skipped": True}
    tables.write_manifest(small["output"], {"dim": 24, "model": "./model"})
    assert check_manifest(EmbedConfig(**BASE, **small), 24)  # absolute spelling, same folder
    hub = EmbedConfig(**BASE, **{**small, "model": "openai/clip-vit-base-patch32"})
    with pytest.raises(tables.TableError, match="refusing to add 'openai/clip-vit-base-patch32'"):
        check_manifest(hub, 24)


# -- one writer at a time ---------------------------------------------------------------------
_HOLDER = """
import sys, time
from asymvlm.output_lock import OutputLock
OutputLock(sys.argv[1], sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_local_lock_excludes_other_processes_and_dies_with_its_holder(small, capsys) -> None:
    root = small["output"]
    command = [sys.executable, "-c", _HOLDER, root, "test"]
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(LockError) as exc:
            output_lock.OutputLock(root, "test").acquire()
        assert str(exc.value).startswith(
            f"{root}/test is being written by another job (pid {child.pid} on "
        )
        assert "wait for it to finish or choose another --output" in str(exc.value)
        with output_lock.OutputLock(root, "train"):  # other splits are free
            pass
        assert cli_main(["embed", *_args(small, small["model"], root)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {root}/test is being written by another job")
        assert "\n" not in err
        assert not os.path.exists(os.path.join(root, "test", JOB))
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    with output_lock.OutputLock(root, "test"):  # SIGKILL leaves no stale lock
        pass


def _lease(**kw) -> output_lock.OutputLock:
    return output_lock.OutputLock("s3://bucket/out", "test", settle=0.05, **kw)


def test_object_store_lease_refuses_renews_expires_and_is_lost_loudly(bucket) -> None:
    path, logs = "test/" + output_lock.LEASE_NAME, []
    first = _lease(ttl=1.0, renew_every=0.2).acquire()
    try:
        held = storage.read_json("s3://bucket/out", path)
        assert held["owner"] == first.owner and held["pid"] == os.getpid()
        with pytest.raises(LockError) as exc:
            _lease().acquire()
        assert str(exc.value).startswith(
            f"s3://bucket/out/test is being written by another job (pid {os.getpid()} on "
        )
        assert f"lease expires at {held['expires_utc']}" in str(exc.value)
        time.sleep(1.5)  # longer than the ttl: only renewal keeps the lease
        assert storage.read_json("s3://bucket/out", path)["expires"] > held["expires"] + 1.0
    finally:
        first.release()
    assert storage.read_json("s3://bucket/out", path) is None
    # a holder that died (no renewal) leaves a lease that expires and is then taken over
    dead = {"owner": "dead", "host": "node-7", "pid": 4242, "expires": time.time() - 5}
    storage.write_json("s3://bucket/out", path, dead)
    second = _lease(ttl=30.0, renew_every=0.2, log=logs.append).acquire()
    try:
        assert logs[0].startswith(
            "taking over the expired lease on s3://bucket/out/test (pid 4242 on node-7"
        )
        second.check()
        # someone else overwrites the lease: the holder notices at its next renewal and stops
        storage.write_json("s3://bucket/out", path, {**dead, "expires": time.time() + 60})
        time.sleep(0.6)
        with pytest.raises(LockError, match="this job lost its write lease .*pid 4242 on node-7"):
            second.check()
    finally:
        second.release()
    assert storage.read_json("s3://bucket/out", path)["owner"] == "dead"  # not ours to delete


# -- real signals and storage: the CLI in a subprocess ----------------------------------------
def _embed_command(job: dict[str, str], model: str, output: str) -> list[str]:
    extra = ("--batch-size", "4", "--shard-size", "6", "--shards-per-round", "1")
    return [sys.executable, "-m", "asymvlm.cli", "embed", *_args(job, model, output, *extra)]


def _run(command: list[str], **kw) -> subprocess.CompletedProcess:
    run = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=300, start_new_session=True, **kw
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert not library_lines(run.stderr), run.stderr  # Ray Data's and Ray's lines: the log file
    return run


@requires_hierarcaps
@pytest.mark.slow
def test_sigkilled_embed_resumes_to_the_uninterrupted_result(embedded, models, hc, tmp_path):
    out = str(tmp_path / "out")
    command = _embed_command(hc, models["clip"], out)
    markers = Path(out) / "test" / "_parts"

    def a_part_written() -> bool:
        return any(markers.glob("part-*.json"))

    sigkill_when(command, a_part_written)
    assert not (Path(out) / "test" / SUCCESS).exists(), "the job finished before the kill"
    assert len(list(markers.glob("part-*.json"))) == 1  # of 2
    assert "(1 already written)" in _run(command).stderr
    got, want = tables.read_split(out, "test"), tables.read_split(embedded, "test")
    assert got.image_ids == want.image_ids and got.caption_ids == want.caption_ids
    np.testing.assert_allclose(got.image_embeddings, want.image_embeddings, atol=1e-6)
    np.testing.assert_allclose(got.text_embeddings, want.text_embeddings, atol=1e-6)


@requires_hierarcaps
@pytest.mark.slow
def test_cli_embed_to_s3_takes_credentials_from_the_environment(models, tmp_path, bucket) -> None:
    """Ray workers read s3 with the environment's credentials; the lease is released."""
    hierarcaps_subset(tmp_path / "hc", 4)
    bucket.put(str(tmp_path / "hc") + "/", "bucket/hc/", recursive=True)
    job = {"annotations": "s3://bucket/hc/hierarcaps_test.csv", "images": "s3://bucket/hc/images"}
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = _run(_embed_command(job, models["clip"], "s3://bucket/tables"), env=env)
    assert json.loads(run.stdout)["n_images"] == 4
    bucket.invalidate_cache()
    assert bucket.exists("bucket/tables/test/_JOB.json")
    assert not bucket.exists("bucket/tables/test/_LEASE.json")
    assert not bucket.exists("bucket/tables/_LEASE.manifest.json")
    split = tables.read_split("s3://bucket/tables", "test")
    assert split.n_images == 4 and split.n_texts == 16
