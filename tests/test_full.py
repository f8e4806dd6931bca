"""pipelines/full.py: configuration, overrides and resumable stages (no Ray needed here)."""

from __future__ import annotations

import importlib
import os

import pytest

from asymvlm.errors import ConfigError
from asymvlm_ray import schema, stages
from pipelines import full
from tests.helpers import free_port

DEMO = os.path.join(os.path.dirname(__file__), "..", "configs", "demo.yaml")


def test_demo_config_resolves_and_its_finished_stages_are_skipped(
    tmp_path, hierarcaps_standin, caplog
) -> None:
    cfg = schema.load_pipeline(DEMO, [f"output={tmp_path}", "sweeps.0.epochs=3"])
    assert cfg.mlflow.tracking_uri == "sqlite:///" + str(tmp_path / "mlflow.db")
    assert cfg.sweeps[0].epochs == 3 and cfg.sweeps[0].seeds == [0, 1, 2, 3, 4]  # 5 for claims
    # --output moves everything: models, tables, sweeps, evaluations and the report
    assert cfg.prepare.tiny_clip == str(tmp_path / "models" / "tiny-clip")
    assert cfg.report.output == str(tmp_path / "report")
    assert all(str(tmp_path) in job.output for job in cfg.embed.jobs)
    assert cfg.prepare.synthetic.preset == "demo" and cfg.prepare.synthetic.classes is not None
    tables = str(tmp_path / "tables")
    by_sweep = {(e.kind, e.sweep): e for e in cfg.evaluations}
    synthetic = {(kind, "synthetic") for kind in ("hierarcaps", "nota", "zeroshot")}
    tiny = {(kind, "hierarcaps-tiny") for kind in ("hierarcaps", "ood")}
    assert set(by_sweep) == synthetic | tiny
    nota, zero = by_sweep["nota", "synthetic"], by_sweep["zeroshot", "synthetic"]
    assert nota.positives == (f"{tables}/synthetic-positives", "test") and nota.frozen
    assert str(nota.far_negatives) == f"{tables}/synthetic-far-negatives:test"
    assert zero.frozen and zero.fine_tuned_on == "synthetic"
    assert str(zero.sets["zeroshot"]) == f"{tables}/synthetic-zeroshot:test"
    assert all("PLUMBING" in e.note for e in cfg.evaluations if e.sweep == "hierarcaps-tiny")
    # every sweep is resolved with the pipeline: its output, store and storage
    scfg = cfg.sweep("hierarcaps-tiny")
    assert scfg.output == str(tmp_path / "sweeps" / "hierarcaps-tiny") and scfg.mlflow == cfg.mlflow

    for sweep in cfg.sweeps:  # finished sweeps and evaluations are skipped (no Ray here)
        (tmp_path / "sweeps" / sweep.name).mkdir(parents=True)
        (tmp_path / "sweeps" / sweep.name / "sweep.json").write_text("{}")
    (tmp_path / "evaluations").mkdir()
    for i, ev in enumerate(cfg.evaluations):
        (tmp_path / "evaluations" / f"{i:02d}-{ev.kind}.json").write_text("{}")
    (index,) = cfg.indexes  # the HierarCaps adapter's search index, under the output too
    assert (index.output, index.sweep) == (str(tmp_path / "indexes" / "hierarcaps"), scfg.name)
    os.makedirs(index.output)
    open(os.path.join(index.output, "manifest.json"), "w").write("{}")
    caplog.set_level("INFO")
    stages.stage_sweep(cfg)
    stages.stage_index(cfg)
    stages.stage_evaluate(cfg)
    done = len(cfg.sweeps) + len(cfg.indexes) + len(cfg.evaluations)
    assert caplog.text.count("done already") == done


def test_the_demo_without_hierarcaps_runs_its_synthetic_part(tmp_path, monkeypatch, caplog):
    """No HierarCaps and no network: its items are left out with one line; the rest validates."""
    from asymvlm.data import demo_sets, hierarcaps_fetch

    port = free_port()
    monkeypatch.delenv("ASYMVLM_HIERARCAPS", raising=False)
    monkeypatch.setenv("ASYMVLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ASYMVLM_HIERARCAPS_CSV_URL", f"http://127.0.0.1:{port}/h.csv")
    monkeypatch.setenv("ASYMVLM_COCO_IMAGES_URL", f"http://127.0.0.1:{port}/")
    monkeypatch.setattr(demo_sets, "_REPO", str(tmp_path / "nowhere" / "repo"))
    monkeypatch.setattr(hierarcaps_fetch, "RETRIES", 1)
    cfg = schema.load_pipeline(DEMO, [f"output={tmp_path / 'out'}"])
    assert [s.name for s in cfg.sweeps] == ["synthetic"]
    assert [(e.kind, e.sweep) for e in cfg.evaluations] == [
        (kind, "synthetic") for kind in ("hierarcaps", "nota", "zeroshot")
    ]
    assert cfg.embed.jobs == [] and not cfg.prepare.hierarcaps_cifar and cfg.indexes == []
    assert cfg.prepare.synthetic.output == str(tmp_path / "out" / "tables" / "synthetic")
    left_out = [r.getMessage() for r in caplog.records if "are left out" in r.getMessage()]
    assert len(left_out) == 1 and "sweeps[hierarcaps-tiny]" in left_out[0]
    how = [r.getMessage() for r in caplog.records if "ASYMVLM_HIERARCAPS" in r.getMessage()]
    assert len(how) == 1  # one line on how to get it


def test_bad_configs_fail_naming_the_problem(tmp_path, capsys) -> None:
    path = tmp_path / "c.yaml"
    sweep = f"{{embeddings: {tmp_path}, methods: [clip], lr: [0.1], seeds: [0]"
    path.write_text(f"sweeps: [{sweep}, name: a}}, {sweep}, name: a}}]\n")
    with pytest.raises(ValueError, match="unique name; repeated: \\['a'\\]"):
        schema.load_pipeline(str(path))
    path.write_text(
        f"sweeps: [{sweep}, name: a}}]\n"
        f"evaluations: [{{kind: hierarcaps, sweep: b, data: '{tmp_path}:test'}}]\n"
    )
    with pytest.raises(ValueError, match="unknown sweep 'b'"):
        schema.load_pipeline(str(path))
    index = f"{{name: i, data: '{tmp_path}:test', sweep: a"
    for item, problem in (
        (f"{index}, method: pfe}}", "sweep 'a' trains no 'pfe'"),
        (f"{index[:-1]}b}}", "unknown sweep 'b'"),
    ):
        path.write_text(f"sweeps: [{sweep}, name: a}}]\nindexes: [{item}]\n")
        with pytest.raises(
            ValueError, match=f"indexes\\[0\\]: {problem}|indexes\\[0\\] names {problem}"
        ):
            schema.load_pipeline(str(path))
    path.write_text("evaluations: [{kind: tables}]\n")
    with pytest.raises(ValueError, match="evaluations\\[0\\].kind = 'tables': must be one of"):
        schema.load_pipeline(str(path))
    path.write_text("prepare: {synthetic: {output: x, requires: [coco]}}\n")
    with pytest.raises(ValueError, match=r"prepare.synthetic.requires: expected a list of"):
        schema.load_pipeline(str(path))
    assert full.main(["--config", DEMO, "--stages", "embed,dance"]) == 2
    assert "unknown stages ['dance']" in capsys.readouterr().err
    assert full.main(["--config", DEMO, "--stages", " ,"]) == 2
    assert "--stages: no stage given; choose from" in capsys.readouterr().err
    for entry in ("full", "embed", "serve", "search", "sweep", "train"):  # a misspelt flag
        assert importlib.import_module(f"pipelines.{entry}").main(["--confg", "c.yaml"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, entry


@pytest.mark.parametrize("name", ["coco", "flickr30k", "cc200k", "paper", "synthetic-full"])
def test_shipped_pipeline_configs_resolve(name, tmp_path, hierarcaps_standin, hub_cache) -> None:
    """The paper's protocol and synthetic-full (every registered method) resolve."""
    from asymvlm.methods import METHODS

    for repo in ("openai/clip-vit-base-patch32", "google/siglip-base-patch16-224"):
        hub_cache(repo, "config.json")  # downloaded (the check asks the cache, then the Hub)
    path = os.path.join(os.path.dirname(DEMO), f"{name}.yaml")
    cfg = schema.load_pipeline(path, [f"output={tmp_path}"])
    if name == "synthetic-full":
        (scfg,) = cfg.sweeps
        assert scfg.methods == list(METHODS)  # `methods: all`, in registry order
        assert (scfg.seeds, scfg.lr, scfg.epochs) == ([0, 1], [2e-3], 12)
        world = cfg.prepare.synthetic.world_config()
        assert (world.pre_dim, world.dim, world.splits["train"]) == (64, 32, 1500)
        return
    assert cfg.embed.jobs and all(job.model for job in cfg.embed.jobs)
    for scfg in cfg.sweeps:
        assert scfg.methods and scfg.epochs == 200 and scfg.batch_size == 2048
        assert scfg.lr == [1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2] and len(scfg.seeds) == 5
    if name == "paper":
        models = {job.model for job in cfg.embed.jobs}
        assert models == {"openai/clip-vit-base-patch32", "google/siglip-base-patch16-224"}
        assert len(cfg.sweeps) == 6  # 3 data sets x 2 backbones


def _prepare_config(tmp_path, synthetic: str, evaluations: str = "[]") -> str:
    path = tmp_path / "p.yaml"
    path.write_text(
        f"output: {tmp_path / 'out'}\n"
        f"prepare: {{synthetic: {{output: '${{output}}/w', {synthetic}}}}}\n"
        f"evaluations: {evaluations}\n"
    )
    return str(path)


def test_prepare_writes_the_preset_world_and_its_classification_sets(tmp_path, caplog) -> None:
    """The preset world and its classification sets; a second run writes nothing."""
    from asymvlm.evaluation.suite import load_classification
    from asymvlm.synthetic import WorldConfig

    evals = (
        "[{kind: nota, frozen: true, dim: 32, positives: '${output}/w-positives:test', "
        "negatives: '${output}/w-negatives:test'}, {kind: zeroshot, frozen: true, dim: 32, "
        "sets: {z: '${output}/w-zeroshot:test'}}]"
    )
    sizes = "train_images: 120, val_images: 20, test_images: 40, seed: 2"
    classes = "classes: {positives: 60, negatives: 50, zeroshot: 30}"
    path = _prepare_config(tmp_path, f"preset: demo, {sizes}, {classes}", evals)
    cfg = schema.load_pipeline(path)
    caplog.set_level("INFO", logger="pipelines.full")
    stages.stage_prepare(cfg)
    out = tmp_path / "out"
    world = WorldConfig.from_manifest(str(out / "w"))
    assert world.splits == {"train": 120, "val": 20, "test": 40} and world.seed == 2
    assert world.finetune_roots == 4  # the preset's
    for role, n in (("positives", 60), ("negatives", 50), ("zeroshot", 30)):
        assert load_classification(str(out / f"w-{role}"), "test").labels.shape == (n,)
    assert sum("prepare: the synthetic" in r.getMessage() for r in caplog.records) == 2
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    caplog.clear()
    stages.stage_prepare(cfg)  # resumed: everything is there
    assert not any("prepare:" in r.getMessage() for r in caplog.records)
    assert stamps == {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    # the same output with other knobs: refused naming them (the old world was used silently)
    stages.check_reruns(cfg)
    again = schema.load_pipeline(path, ["prepare.synthetic.seed=3"])
    with pytest.raises(ConfigError, match=r"other knobs: seed 2 \(then\) vs 3 \(now\)\. Run"):
        stages.check_reruns(again)


def test_prepare_without_classes_or_domains_writes_no_sets(tmp_path) -> None:
    """Evaluations naming sets that no stage writes fail at load time, naming the key."""
    evals = "[{kind: zeroshot, frozen: true, dim: 8, sets: {z: '${output}/w-zeroshot:test'}}]"
    with pytest.raises(ValueError, match=r"evaluations\[0\] \(zeroshot\).*no stage"):
        schema.load_pipeline(_prepare_config(tmp_path, "dim: 8, classes: true", evals))
    sizes = "dim: 8, train_images: 30, val_images: 5, test_images: 5"
    cfg = schema.load_pipeline(_prepare_config(tmp_path, sizes))
    stages.stage_prepare(cfg)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["w"]
