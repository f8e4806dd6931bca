"""One validated configuration for every entry point: unknown keys, types, ranges, ``--set``."""

from __future__ import annotations

import glob
import os
import pickle

import pytest
import torch

from asymvlm import config
from asymvlm.cli import main as cli_main
from asymvlm.errors import ConfigError
from asymvlm_ray import schema
from pipelines import full

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo.yaml")


def _sweep_doc(tmp_path, **extra):
    doc = {"embeddings": str(tmp_path), "methods": ["asymvlm-vmf"], "lr": [1e-3], "seeds": [0]}
    return {**doc, "output": str(tmp_path / "o"), **extra}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hiden_dim", 64, "hiden_dim: unknown key (did you mean 'hidden_dim'?)"),
        ("epoch", 3, "epoch: unknown key (did you mean 'epochs'?)"),  # a key elsewhere
        ("lr", [float("nan")], "lr[0] = nan: Input should be a finite number"),
        ("methods", ["asymvlm-vfm"], "methods[0] = 'asymvlm-vfm': unknown method"),
        ("seeds", [0, 0], "seeds: duplicates: [0, 0]"),
        ("mlflow", {"experimnt": "x"}, "mlflow.experimnt: unknown key (did you mean 'experim"),
        ("method_kwargs", {"probvlm": {}}, "method_kwargs names methods that are not swept"),
        (
            "method_kwargs",
            {"asymvlm-vmf": {"bogus": 1}},
            "method_kwargs.asymvlm-vmf.bogus = 1: unknown key; asymvlm-vmf takes init_temperature, "
            "init_bias, calibrate_input, init, exact_scores",
        ),
        (
            "method_kwargs",
            {"asymvlm-vmf": {"init": "xavier"}},
            "method_kwargs.asymvlm-vmf.init = 'xavier': Input should be 'he' or 'default'",
        ),
    ],
)
def test_sweep_values_are_checked(tmp_path, key, value, message) -> None:
    with pytest.raises(ConfigError) as err:
        schema.sweep_config(_sweep_doc(tmp_path, **{key: value}), source="space.yaml")
    assert str(err.value).startswith("space.yaml: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_sweep_defaults_are_the_papers_protocol(tmp_path) -> None:
    doc = {"embeddings": "x", "methods": ["asymvlm-vmf"], "lr": [1e-2], "seeds": [0]}
    cfg = schema.sweep_config(doc)
    assert cfg.embeddings == os.path.abspath("x")  # trials run in their own directories
    assert (cfg.epochs, cfg.batch_size, cfg.min_lr, cfg.protocol) == (200, 2048, 1e-6, "improved")
    # optimiser and sizes: the protocol's per method, resolved once for each method's trials
    assert cfg.optimizer is None and cfg.hidden_dim is None
    assert cfg.train_config("asymvlm-vmf").optimizer == "sgd"
    run = cfg.run_spec("asymvlm-vmf", 5e-3, 3)
    assert (run.train.lr, run.train.seed, run.train.weight_decay) == (5e-3, 3, 5e-4)
    assert run.embeddings == os.path.abspath("x") and run.checkpoint_every == 5


@pytest.mark.parametrize(
    ("method", "protocol", "expected"),
    [
        ("asymvlm-vmf", "improved", ("sgd", 1e-2, 0.9, 5e-4)),
        ("probvlm", "improved", ("sgd", 1e-2, 0.9, 5e-4)),
        ("asymvlm-ps", "official", ("sgd", 1e-2, 0.9, 5e-4)),
        ("probvlm", "official", ("adamw", 1e-4, 0.9, 5e-4)),
        ("pfe", "official", ("sgd", 1e-3, 0.9, 5e-4)),
        ("pcmepp", "official", ("adamw", 5e-4, 0.9, 1e-4)),
        ("prolip", "official", ("adamw", 5e-4, 0.9, 5e-4)),
        ("elip", "official", ("sgd", 1e-2, 0.9, 5e-4)),
    ],
)
def test_optimizer_defaults_follow_the_protocol(method, protocol, expected) -> None:
    from asymvlm.training import TrainConfig

    cfg = TrainConfig(method=method, protocol=protocol)
    assert (cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay) == expected
    explicit = TrainConfig(method=method, protocol=protocol, optimizer="sgd", lr=0.3)
    assert (explicit.optimizer, explicit.lr) == ("sgd", 0.3)  # what is given wins
    assert cfg.method_args() == {"protocol": protocol}


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "tune_spaces", "*.yaml"))))
def test_shipped_tune_spaces_validate(path, tmp_path) -> None:
    cfg = schema.load_sweep(path, [f"output={tmp_path}", "mlflow.experiment=other"])
    assert cfg.mlflow.experiment == "other" and cfg.mlflow.tracking_uri.startswith("sqlite:///")
    if not path.endswith("cpu-small.yaml"):  # the paper's protocol
        assert cfg.lr == [1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2] and cfg.seeds == [0, 1, 2, 3, 4]
        assert (cfg.epochs, cfg.batch_size, cfg.protocol) == (200, 2048, "official")
        assert cfg.optimizer is None  # the authors' optimiser per method
    # it crosses the Tune boundary as it is (pickled), every method's validated run with it
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg
    for m in cfg.methods:
        assert again.run_spec(m, cfg.lr[-1], 4) == cfg.run_spec(m, cfg.lr[-1], 4)


def test_one_set_syntax() -> None:
    doc = {"sweeps": [{"name": "a", "lr": [1]}, {"name": "b"}], "mlflow": None}
    sets = ["sweeps.1.epochs=5", "sweeps.0.lr=[1e-3, 0.5]", "mlflow.experiment=x", "name=null"]
    config.apply_overrides(doc, [*sets, "sweeps.-1.note=a note, with a comma"])
    assert doc["sweeps"][1]["epochs"] == 5 and doc["sweeps"][0]["lr"] == [1e-3, 0.5]
    assert doc["mlflow"] == {"experiment": "x"} and doc["name"] is None
    assert doc["sweeps"][1]["note"] == "a note, with a comma"
    for bad, message in [
        ("sweeps.2.epochs=1", "index 2 is out of range"),
        ("sweeps.x.epochs=1", "indexes a list"),
        ("name.sub=1", "name is not a mapping"),
        ("epochs", "expects key=value"),
        ("a=[1, 2", "not valid YAML"),
    ]:
        with pytest.raises(ConfigError, match=message):
            config.apply_overrides({"sweeps": [{}], "name": "n"}, [bad])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sweeps.1.hiden_dim=3", "sweeps[1].hiden_dim: unknown key (did you mean 'hidden_dim'?)"),
        ("evaluations.3.dat=x", "evaluations[3].dat: unknown key (did you mean 'data'?)"),
        ("evaluations.0.data=nosplit", "expected ROOT:SPLIT"),
        ("prepare.synthetic.dimm=3", "unknown key 'dimm' (did you mean 'dim'?)"),
        ("prepare.synthetic.level_probs=[1, 1, 0, 0]", "level_probs must be >= 0 and sum to 1"),
        ("embed.jobs.1.datset=coco", "embed.jobs[1].datset: unknown key (did you mean 'dataset'?)"),
        ("sweeps.0.embeddings=/nonexistent/tables", "/nonexistent/tables does not exist"),
    ],
)
def test_pipeline_fails_in_seconds_before_ray(
    override, message, capsys, monkeypatch, tmp_path, hierarcaps_standin
) -> None:
    import ray

    from asymvlm_ray.session import RaySession

    never = tmp_path / "never-written"
    # Any start of Ray is recorded (a Ray session of earlier tests may be up in this process).
    started: list[str] = []
    monkeypatch.setattr(RaySession, "require", lambda self: started.append("require"))
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append("ray.init"))
    code = full.main(["--config", DEMO, "--set", override, "--output", str(never)])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert started == [] and not never.exists()


# Wherever a sweep, pipeline, embedding or Serve YAML is run from, its relative paths are relative
# to its folder (model names and URIs stay names); ``--set`` values are relative to the working
# directory, as on the command line.
SWEEP_YAML = "embeddings: ../tables\noutput: out\nmethods: [clip]\nlr: [0.1]\nseeds: [0]\n"


@pytest.fixture
def configs(tmp_path, monkeypatch):
    """A folder of config files (with models/clip and dist/p-1.whl), run from another folder."""
    folder, here = tmp_path / "configs", tmp_path / "elsewhere"
    (folder / "models" / "clip").mkdir(parents=True)
    (folder / "dist").mkdir()
    (folder / "dist" / "p-1.whl").write_text("")
    here.mkdir()
    monkeypatch.chdir(here)
    return folder


def test_a_sweep_files_paths_and_runtime_env_are_relative_to_its_folder(configs, tmp_path):
    path = configs / "sweep.yaml"
    env = "{working_dir: src, py_modules: [mods], pip: [numpy==2.0, dist/p-1.whl]}"
    path.write_text(SWEEP_YAML + f"ray: {{runtime_env: {env}}}\n")
    cfg = schema.load_sweep(str(path))
    assert (cfg.embeddings, cfg.output) == (str(tmp_path / "tables"), str(configs / "out"))
    assert cfg.mlflow.tracking_uri == f"sqlite:///{configs / 'out' / 'mlflow.db'}"
    runtime = cfg.ray.runtime_env
    assert runtime.working_dir == str(configs / "src") and runtime.py_modules == [f"{configs}/mods"]
    assert runtime.pip == ["numpy==2.0", str(configs / "dist" / "p-1.whl")]  # a name stays


def test_set_values_are_relative_to_the_working_directory(configs, tmp_path):
    (configs / "sweep.yaml").write_text(SWEEP_YAML)
    cfg = schema.load_sweep(str(configs / "sweep.yaml"), ["output=mine", "embeddings=tables"])
    here = tmp_path / "elsewhere"
    assert (cfg.embeddings, cfg.output) == (str(here / "tables"), str(here / "mine"))


def test_a_pipeline_files_paths_are_relative_to_its_folder(configs, tmp_path):
    (configs / "a.json").write_text("{}")
    (configs / "img").mkdir()
    path = configs / "pipeline.yaml"
    sweep = "{name: s, embeddings: t, methods: [clip], lr: [0.1], seeds: [0]}"
    job = "{dataset: coco, annotations: a.json, images: img, split: test, output: t}"
    path.write_text(
        f"name: p\noutput: ../runs/p\nsweeps: [{sweep}]\nreport: {{output: r}}\n"
        f"embed: {{defaults: {{model: models/clip}}, jobs: [{job}]}}\n"
        "evaluations: [{kind: hierarcaps, sweep: s, data: 't:test'}]\n"
    )
    pipeline = schema.load_pipeline(str(path))
    (job,), (evaluation,) = pipeline.embed.jobs, pipeline.evaluations
    assert (pipeline.output, pipeline.report.output) == (f"{tmp_path}/runs/p", f"{configs}/r")
    inputs = [job.annotations, job.images, job.output]
    assert inputs == [f"{configs}/{name}" for name in ("a.json", "img", "t")]
    assert job.model == f"{configs}/models/clip"  # a folder that is there, not a Hub id
    assert pipeline.sweep("s").embeddings == str(evaluation.data.root) == f"{configs}/t"


def test_a_model_name_that_is_no_folder_stays_a_hub_id(configs):
    path = configs / "embed.yaml"
    path.write_text("{dataset: coco, model: org/hub-id, split: test, output: t}")
    (job,) = schema.load_embed_jobs(str(path))
    assert (job.model, job.output) == ("org/hub-id", f"{configs}/t")


@pytest.mark.parametrize(
    ("checkpoint", "resolved"),
    [("models/clip", "{configs}/models/clip"), ("runs:/0123/adapter", "runs:/0123/adapter")],
)
def test_a_serve_files_checkpoint_is_relative_to_it_unless_a_uri(configs, checkpoint, resolved):
    path = configs / "serve.yaml"
    path.write_text(f"checkpoint: {checkpoint}\nencoder: org/hub-id\n")
    assert schema.load_serve(str(path), [], None).checkpoint == resolved.format(configs=configs)


def test_a_sweep_refused_for_its_config_writes_nothing(configs, tmp_path, capsys) -> None:
    """No tables there: one line, exit 2, and no output folder (no logs/sweep.log) made."""
    from pipelines import sweep as sweep_script

    (configs / "sweep.yaml").write_text(SWEEP_YAML)
    assert sweep_script.main(["--config", str(configs / "sweep.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(tmp_path / "tables") in err
    assert not (configs / "out").exists()


TRAIN = "train --embeddings {world} --method asymvlm-vmf --quiet --output {tmp}/"
EVALUATE = "evaluate --embeddings {world} --checkpoint {tmp} --output {tmp}/out "


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (TRAIN + "out --epochs 0", "--epochs = 0: Input should be greater than or equal to 1"),
        (TRAIN + "out --lr nan", "--lr = nan: Input should be a finite number"),
        (TRAIN + "file.txt --epochs 1", "file.txt"),
        (
            TRAIN + "out --method-arg bogus=1",
            "method_kwargs.bogus = '1': unknown key; asymvlm-vmf takes init_temperature, init_bias",
        ),
        (
            TRAIN + "out --method-arg calibrate_input=maybe",
            "method_kwargs.calibrate_input = 'maybe': Input should be a valid boolean",
        ),
        (TRAIN + "out --method-arg calibrate_input", "--method-arg expects key=value"),
        (EVALUATE + "--levels 0", "--levels"),
        (EVALUATE + "--chunk-size 0", "--chunk-size"),
    ],
)
def test_cli_values(small_world, tmp_path, capsys, argv, message) -> None:
    """Flags are named as flags; one ``error:`` line, exit 2, nothing written."""
    (tmp_path / "file.txt").write_text("keep me")
    code = cli_main(argv.format(world=small_world, tmp=tmp_path).split())
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == err.strip().splitlines()
    assert not (tmp_path / "out").exists() and (tmp_path / "file.txt").read_text() == "keep me"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_device_without_cuda(small_world, tmp_path, capsys) -> None:
    argv = ["train", "--embeddings", small_world, "--method", "clip", "--device", "cuda"]
    assert cli_main([*argv, "--output", str(tmp_path / "c")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


# -- prepare.synthetic: presets, knobs, classification sets --------------------------------------
def _synthetic(**keys) -> schema.SyntheticPrepare:
    return config.validate(schema.SyntheticPrepare, {"output": "w", **keys}, "c.yaml")


def test_synthetic_prepare_presets_overrides_and_classes() -> None:
    from asymvlm.synthetic import PRESETS, ClassificationSpec, WorldConfig

    assert set(PRESETS) == {"demo", "coco"}  # the schema's choices
    assert _synthetic().world_config() == WorldConfig()
    plain = _synthetic(dim=16, test_images=50).world_config()
    assert plain.dim == 16 and plain.splits == {"train": 8000, "val": 1000, "test": 50}
    # a preset, with the keys given beside it overriding it (sizes and knobs alike)
    small = _synthetic(preset="demo", train_images=200, seed=3, level_probs=None).world_config()
    assert small.splits == {"train": 200, "val": 300, "test": 300}
    assert (small.seed, small.level_probs, small.finetune_roots) == (3, None, 4)
    assert _synthetic(preset="demo", classes=False).class_set_roots() == {}
    spec = _synthetic(preset="demo", classes=True)
    assert spec.classification_spec() == ClassificationSpec()
    roles = ("positives", "negatives", "zeroshot", "far-negatives")
    assert spec.class_set_roots() == {role: os.path.abspath(f"w-{role}") for role in roles}
    custom = _synthetic(preset="demo", classes={"positives": 300, "level": 2, "n_classes": 5})
    got = custom.classification_spec()
    assert (got.positives, got.negatives, got.level, got.n_classes) == (300, 1000, 2, 5)
    # one domain (no preset): no zero-shot set; every root holds a positive class: no far set
    assert set(_synthetic(classes=True).class_set_roots()) == {"positives", "negatives"}
