"""The embedding stage under bad input and faults: validated config, job identity before the
first shard, one writer at a time (file lock / object-store lease), no credentials in Ray's
runtime_env, and a SIGKILLed ``asymvlm embed`` that resumes to the uninterrupted result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from asymvlm import storage, tables
from asymvlm.data.embed import EmbedConfig
from asymvlm.errors import ConfigError, LockError
from pipelines.embedding import JOB, SUCCESS, run_embed
from tests.helpers import hierarcaps_subset, requires_hierarcaps

REPO = Path(__file__).resolve().parent.parent
BASE = dict(dataset="hierarcaps", split="test")


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> str:
    from asymvlm.data.tiny import save_tiny_clip

    return save_tiny_clip(str(tmp_path_factory.mktemp("tiny-clip")))


def _write_csv(path: Path, n: int) -> str:
    """A HierarCaps-format CSV of ``n`` made-up rows (image files need not exist)."""
    lines = ["id,captions,image_url"]
    for i in range(n):
        lines.append(f"{i},a => a b => a b c => a b c d {i},http://x/img{i:03d}.jpg")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def small(tmp_path) -> dict[str, str]:
    (tmp_path / "images").mkdir()
    (tmp_path / "model").mkdir()
    return {
        "annotations": _write_csv(tmp_path / "hc.csv", 6),
        "images": str(tmp_path / "images"),
        "model": str(tmp_path / "model"),
        "output": str(tmp_path / "out"),
    }


def _source(cfg: EmbedConfig):
    from asymvlm.data.sources import read_source

    return read_source(
        cfg.dataset,
        annotations=cfg.annotations,
        images=cfg.images,
        split=cfg.split,
        sample=cfg.sample,
        seed=cfg.seed,
    )


def _record(cfg: EmbedConfig, name: str, **extra) -> None:
    """Write ``_JOB.json`` / ``_SUCCESS.json`` as job ``cfg`` would have."""
    payload = {"fingerprint": cfg.fingerprint(_source(cfg)), **extra}
    storage.write_json(cfg.output, f"{cfg.split}/{name}", payload)


# -- 1. the configuration ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, value",
    [
        ("batch_size", 0),
        ("num_actors", 0),
        ("shard_size", 0),
        ("shards_per_round", 0),
        ("decode_cpus", 0.0),
        ("actor_cpus", float("nan")),
        ("sample", 0),
        ("seed", -1),
        ("device", "tpu"),
        ("dtype", "fp8"),
        ("decode_in", "gpu"),
        ("dataset", "hierarcapz"),
        ("split", "../test"),
        ("text_perturbation", "typos:9"),
        ("image_perturbation", "blur:1"),
        ("batchsize", 8),
    ],
)
def test_embed_config_is_validated_on_construction(key, value) -> None:
    kwargs = {**BASE, "model": "m", "output": "o", key: value}
    with pytest.raises(ValidationError) as exc:
        EmbedConfig(**kwargs)
    assert exc.value.errors()[0]["loc"] == (key,)


def test_embed_config_keeps_dataclass_tools_and_yaml_jobs(tmp_path) -> None:
    from dataclasses import asdict, fields

    from asymvlm.data.embed import DTYPES
    from asymvlm.data.encoder.base import _DTYPES
    from pipelines.schema import load_embed_jobs as load_jobs

    cfg = EmbedConfig(**BASE, model="m", output="o", dtype="BFloat16", dummy_prompts=["a photo"])
    assert cfg.dtype == "bf16" and cfg.dummy_prompts == ("a photo",)  # one spelling per dtype
    assert "shards_per_round" in {f.name for f in fields(EmbedConfig)}
    assert asdict(cfg)["dummy_prompts"] == ("a photo",)
    assert set(DTYPES) == {"auto", *_DTYPES}  # the names the encoder accepts
    config = tmp_path / "embed.yaml"
    config.write_text("dataset: hierarcaps\nmodel: m\nsplit: test\noutput: o\nbatch_size: 0\n")
    with pytest.raises(ValueError, match="batch_size"):  # pipelines wrap it in a ConfigError
        load_jobs(str(config))


def test_missing_local_inputs_are_named_before_anything_is_written(small, hub_cache) -> None:
    for key in ("annotations", "images", "id_list", "model"):
        cfg = EmbedConfig(**BASE, **{**small, key: small["images"] + "-missing"})
        with pytest.raises(ConfigError, match=rf"^{key} '.*images-missing': no such file"):
            run_embed(cfg)
    assert not os.path.exists(small["output"])
    # URIs are the readers' business; a hub id is not a path; a glob must match something.
    EmbedConfig(**BASE, **{**small, "annotations": "s3://bucket/hc.csv"}).check_inputs()
    hub_cache("openai/clip-vit-base-patch32", "config.json")
    EmbedConfig(**BASE, **{**small, "model": "openai/clip-vit-base-patch32"}).check_inputs()
    shards = {**small, "annotations": small["images"] + "/*.tar"}
    with pytest.raises(ConfigError, match="no file matches"):
        EmbedConfig(**{**BASE, "dataset": "cc"}, **shards).check_inputs()


# -- 2. job identity --------------------------------------------------------------------------
def test_job_record_is_written_before_the_first_shard(small, monkeypatch) -> None:
    from types import SimpleNamespace

    from pipelines.embedding import stage

    def no_ray() -> None:
        raise RuntimeError("stopped where Ray would start")

    monkeypatch.setattr(stage, "_encoder_info", lambda model: {})
    cfg = EmbedConfig(**BASE, **small, text_perturbation="typos:3")
    with pytest.raises(RuntimeError, match="stopped where Ray"):
        run_embed(cfg, SimpleNamespace(require=no_ray))  # the entry point's Ray session
    job = storage.read_json(cfg.output, f"test/{JOB}")
    assert job["fingerprint"] == cfg.fingerprint(_source(cfg))
    assert job["fingerprint"]["text_perturbation"] == "typos:3"
    assert job["fingerprint"]["n_images"] == 6 and len(job["fingerprint"]["source_sha256"]) == 64
    assert sorted(os.listdir(os.path.join(cfg.output, "test"))) == sorted([storage.LOCK_NAME, JOB])


@pytest.mark.parametrize("record", [JOB, SUCCESS])
def test_another_jobs_output_is_refused_naming_what_differs(small, record) -> None:
    theirs = EmbedConfig(**BASE, **small, text_perturbation="typos:3")
    _record(theirs, record, summary={})
    ours = EmbedConfig(**BASE, **small)
    what = "was written by another job" if record == JOB else "holds a finished embedding"
    with pytest.raises(tables.TableError) as exc:
        run_embed(ours)
    message = str(exc.value)
    assert message.startswith(f"{small['output']}/test {what}")
    assert "text_perturbation None here vs 'typos:3' there" in message
    assert message.endswith("choose another --output (or --split)")
    # Edited annotations (same path, same counts) are another job too.
    Path(small["annotations"]).write_text(
        Path(small["annotations"]).read_text().replace("a b c d 5", "a b c e 5")
    )
    with pytest.raises(tables.TableError, match=r"source_sha256 '[0-9a-f]{12}\.\.\.' here"):
        run_embed(theirs)


def test_relative_and_absolute_spellings_are_one_job(small, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = {k: os.path.relpath(v) for k, v in small.items()}
    assert not os.path.isabs(relative["annotations"])
    _record(
        EmbedConfig(**BASE, **{**relative, "model": "./model"}), SUCCESS, summary={"n_images": 6}
    )
    again = run_embed(EmbedConfig(**BASE, **{**small, "images": small["images"] + "/"}))
    assert again == {"n_images": 6, "skipped": True}


def test_manifest_of_the_same_model_in_another_spelling_is_accepted(small, monkeypatch) -> None:
    from pipelines.embedding.shards import check_manifest

    monkeypatch.chdir(Path(small["model"]).parent)
    tables.write_manifest(small["output"], {"dim": 24, "model": "./model"})
    assert check_manifest(EmbedConfig(**BASE, **small), 24)  # absolute spelling, same dir
    with pytest.raises(tables.TableError, match="refusing to add 'openai/clip-vit-base-patch32'"):
        check_manifest(
            EmbedConfig(**BASE, **{**small, "model": "openai/clip-vit-base-patch32"}), 24
        )


def test_parts_without_a_job_record_are_refused(small) -> None:
    cfg = EmbedConfig(**BASE, **small)
    storage.write_json(cfg.output, "test/_parts/part-00000.json", {"images": 3})
    with pytest.raises(tables.TableError, match=r"holds _parts/ markers but no _JOB\.json"):
        run_embed(cfg)


# -- 3. one writer at a time ------------------------------------------------------------------
_HOLDER = """
import sys, time
from asymvlm.storage import OutputLock
OutputLock(sys.argv[1], sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def _hold_in_child(root: str, folder: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, root, folder], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "held"
    return child


def test_local_lock_excludes_other_processes_and_dies_with_its_holder(tmp_path) -> None:
    root = str(tmp_path / "out")
    child = _hold_in_child(root, "test")
    try:
        with pytest.raises(LockError) as exc:
            storage.OutputLock(root, "test").acquire()
        assert str(exc.value).startswith(
            f"{root}/test is being written by another job (pid {child.pid} on "
        )
        assert "wait for it to finish or choose another --output" in str(exc.value)
        with storage.OutputLock(root, "train"):  # other splits are free
            pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    with storage.OutputLock(root, "test"):  # SIGKILL leaves no stale lock
        pass


def test_cli_embed_is_refused_while_another_process_writes_the_output(small, capsys) -> None:
    from asymvlm.cli import main as cli_main

    child = _hold_in_child(small["output"], "test")
    args = ["--dataset", "hierarcaps", "--annotations", small["annotations"], "--images"]
    args += [small["images"], "--model", small["model"], "--split", "test"]
    try:
        code = cli_main(["embed", *args, "--output", small["output"]])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    prefix = f"error: {small['output']}/test is being written by another job (pid {child.pid} on "
    assert err.startswith(prefix) and "\n" not in err
    assert not os.path.exists(os.path.join(small["output"], "test", JOB))


@pytest.fixture
def s3(s3_server):
    """The shared local S3 server (tests/conftest.py), empty, with a bucket; yields its
    environment."""
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server}).mkdir("bucket")
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
    yield {key: os.environ[key] for key in keys}


def _lease(root: str, **kw) -> storage.OutputLock:
    return storage.OutputLock(root, "test", settle=0.05, **kw)


def test_object_store_lease_refuses_a_second_writer_until_released(s3) -> None:
    first = _lease("s3://bucket/out", ttl=60.0).acquire()
    try:
        held = storage.read_json("s3://bucket/out", "test/" + storage.LEASE_NAME)
        assert held["owner"] == first.owner and held["pid"] == os.getpid()
        assert held["expires"] == pytest.approx(time.time() + 60, abs=5)
        with pytest.raises(LockError) as exc:
            _lease("s3://bucket/out").acquire()
        message = str(exc.value)
        assert message.startswith(
            f"s3://bucket/out/test is being written by another job (pid {os.getpid()} on "
        )
        assert f"lease expires at {held['expires_utc']}" in message
    finally:
        first.release()
    assert storage.read_json("s3://bucket/out", "test/" + storage.LEASE_NAME) is None
    with _lease("s3://bucket/out"):
        pass


def test_object_store_lease_is_renewed_taken_over_when_expired_and_lost_loudly(s3) -> None:
    logs: list[str] = []
    first = _lease("s3://bucket/out", ttl=1.0, renew_every=0.2).acquire()
    path = "test/" + storage.LEASE_NAME
    try:
        before = storage.read_json("s3://bucket/out", path)["expires"]
        time.sleep(1.5)  # longer than the ttl: only renewal keeps the lease
        assert storage.read_json("s3://bucket/out", path)["expires"] > before + 1.0
        with pytest.raises(LockError):
            _lease("s3://bucket/out").acquire()
    finally:
        first.release()
    # A holder that died (no renewal) leaves a lease that expires and is then taken over.
    dead = {"owner": "dead", "host": "node-7", "pid": 4242, "expires": time.time() - 5}
    storage.write_json("s3://bucket/out", path, dead)
    second = _lease("s3://bucket/out", ttl=30.0, renew_every=0.2, log=logs.append).acquire()
    try:
        assert logs and logs[0].startswith(
            "taking over the expired lease on s3://bucket/out/test (pid 4242 on node-7"
        )
        second.check()
        # Someone else overwrites the lease: the holder notices at its next renewal and stops.
        storage.write_json("s3://bucket/out", path, {**dead, "expires": time.time() + 60})
        time.sleep(0.6)
        with pytest.raises(LockError, match="this job lost its write lease .*pid 4242 on node-7"):
            second.check()
    finally:
        second.release()
    assert storage.read_json("s3://bucket/out", path)["owner"] == "dead"  # not ours to delete


def test_run_embed_holds_the_output_for_the_whole_job(small) -> None:
    cfg = EmbedConfig(**BASE, **small)
    with storage.OutputLock(cfg.output, "test"):
        with pytest.raises(LockError, match="is being written by another job"):
            run_embed(cfg)
    assert not os.path.exists(os.path.join(cfg.output, "test", JOB))


# -- 4. no credentials in Ray's runtime_env ---------------------------------------------------
def test_ray_stage_arguments_carry_no_environment(small, monkeypatch) -> None:
    import ray

    from pipelines.embedding import ray_data

    secret = "wJalrXUtnFEMI-not-a-real-key"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", "hf_" + secret)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    cfg = EmbedConfig(**BASE, **small)
    for kwargs in (ray_data._map_kwargs(cfg), ray_data._decode_kwargs(cfg)):
        assert "runtime_env" not in kwargs
        assert secret not in repr(kwargs)


# -- 6. real signals: the CLI, SIGKILLed between shards, and s3:// ----------------------------
def _embed_command(csv: str, images: str, model: str, output: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "asymvlm.cli",
        "embed",
        "--dataset",
        "hierarcaps",
        "--annotations",
        csv,
        "--images",
        images,
        "--model",
        model,
        "--split",
        "test",
        "--output",
        output,
        "--batch-size",
        "4",
        "--shard-size",
        "2",
        "--shards-per-round",
        "1",
    ]


def _run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    run = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        start_new_session=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _rows(root: str) -> dict[str, dict[str, np.ndarray]]:
    split = tables.read_split(root, "test")  # validates: no duplicate ids, unit norms ...
    return {
        "images": dict(zip(split.image_ids, split.image_embeddings, strict=True)),
        "texts": dict(zip(split.caption_ids, split.text_embeddings, strict=True)),
    }


@pytest.mark.slow
@requires_hierarcaps
def test_sigkilled_embed_resumes_to_the_uninterrupted_result(tiny_clip, tmp_path) -> None:
    csv, images = hierarcaps_subset(tmp_path / "hc", 6)  # 3 shards of 2 images
    reference = str(tmp_path / "reference")
    _run(_embed_command(csv, images, tiny_clip, reference))

    out = str(tmp_path / "out")
    command = _embed_command(csv, images, tiny_clip, out)
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    markers = Path(out) / "test" / "_parts"
    try:
        deadline = time.monotonic() + 180
        while not list(markers.glob("part-*.json")):
            assert proc.poll() is None, "embed exited before writing its first shard"
            assert time.monotonic() < deadline, "no shard written in 180 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started
        proc.wait()
    assert not (Path(out) / "test" / SUCCESS).exists(), "the job finished before the kill"
    written = len(list(markers.glob("part-*.json")))
    assert 1 <= written < 3

    rerun = _run(command)
    assert f"({written} already written)" in rerun.stderr
    assert json.loads(rerun.stdout)["n_images"] == 6
    assert (Path(out) / "test" / SUCCESS).exists()
    got, want = _rows(out), _rows(reference)
    for kind in ("images", "texts"):
        assert sorted(got[kind]) == sorted(want[kind])
        for key, value in want[kind].items():
            np.testing.assert_allclose(got[kind][key], value, atol=1e-6)
    assert len(got["texts"]) == 24


@pytest.mark.slow
@requires_hierarcaps
def test_cli_embed_to_s3_takes_credentials_from_the_environment(tiny_clip, tmp_path, s3):
    """The workers of the local Ray that ``asymvlm embed`` starts read the images from s3 with
    the credentials of the environment (none travel in runtime_env); the lease is released."""
    import s3fs

    csv, images = hierarcaps_subset(tmp_path / "hc", 4)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3["AWS_ENDPOINT_URL"]})
    fs.put(str(tmp_path / "hc") + "/", "bucket/hc/", recursive=True)
    command = _embed_command(
        "s3://bucket/hc/hierarcaps_test.csv",
        "s3://bucket/hc/images",
        tiny_clip,
        "s3://bucket/tables",
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = _run(command, env=env)
    assert json.loads(run.stdout)["n_images"] == 4
    fs.invalidate_cache()
    assert fs.exists("bucket/tables/test/_JOB.json")
    assert not fs.exists("bucket/tables/test/_LEASE.json")
    assert not fs.exists("bucket/tables/_LEASE.manifest.json")
    split = tables.read_split("s3://bucket/tables", "test")
    assert split.n_images == 4 and split.n_texts == 16
