"""The `asymvlm` command line, end to end on a tiny synthetic world."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asymvlm import tables
from asymvlm.cli import main
from asymvlm.errors import ConfigError
from tests.helpers import save_adapter


def _train(world: str, out: str, method: str = "asymvlm-vmf", *extra: str) -> int:
    flags = "--epochs 2 --lr 1e-3 --optimizer adamw --batch-size 128 --hidden-dim 32 --depth 2"
    args = ["--embeddings", world, "--split", "train", "--method", method, "--seed", "0"]
    return main(["train", *args, *flags.split(), "--output", out, "--quiet", *extra])


@pytest.fixture(scope="module")
def ckpt(small_world, tmp_path_factory) -> str:
    """An asymvlm-vmf checkpoint trained by `asymvlm train` on the small world."""
    out = str(tmp_path_factory.mktemp("cli") / "ckpt")
    assert _train(small_world, out) == 0
    return out


def test_evaluate_prints_the_metrics_and_writes_json_only_with_output(
    small_world, ckpt, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    test = ["--embeddings", f"{small_world}:test", "--checkpoint", ckpt, "--quiet"]
    assert main(["evaluate", *test]) == 0 and os.listdir() == []
    printed = capsys.readouterr().out
    assert main(["evaluate", *test, "--levels", "10", "--output", "metrics.json"]) == 0
    assert capsys.readouterr().out == printed
    result = json.loads(Path("metrics.json").read_text())
    for direction in ("t2i", "i2t"):
        r = result[direction]
        assert {"binned_recall@1", "spearman", "r2"} <= set(r) and len(r["binned_recall@1"]) == 10
        assert 0.0 <= r["recall@1"] <= r["recall@5"] <= r["recall@10"] <= 1.0
        assert f"{direction}: R@1 {r['recall@1']:.4f}  R@5 {r['recall@5']:.4f}" in printed
        assert f"S {r['spearman']:+.3f}  R2 {r['r2']:.3f}" in printed


def test_score_writes_a_row_per_caption_with_its_text_kappa_and_level(small_world, ckpt, tmp_path):
    out = str(tmp_path / "s.parquet")
    argv = ["--embeddings", f"{small_world}:test", "--checkpoint", ckpt, "--quiet"]
    assert main(["score", *argv, "--output", out]) == 0
    table, split = pq.read_table(out), tables.read_split(small_world, "test")
    assert table.column_names[:4] == ["caption_id", "text", "kappa", "uncertainty"]
    assert table.column("caption_id").to_pylist() == split.caption_ids
    assert table.column("text").to_pylist() == list(split.texts)
    kappa = table.column("kappa").to_numpy()
    assert np.all(kappa > 0)
    np.testing.assert_allclose(table.column("uncertainty").to_numpy(), 1.0 / kappa, rtol=1e-5)
    assert table.column("level").to_pylist() == split.extra_text_columns["level"].tolist()


def test_root_colon_split_reads_what_embeddings_and_split_read(small_world, ckpt, tmp_path):
    located = ["--embeddings", f"{small_world}:test", "--checkpoint", ckpt, "--quiet"]
    by_flags = ["--embeddings", small_world, "--split", "test", "--checkpoint", ckpt, "--quiet"]
    for name, argv in (("s", located), ("t", by_flags)):
        assert main(["score", *argv, "--output", str(tmp_path / f"{name}.parquet")]) == 0
    assert pq.read_table(tmp_path / "s.parquet").equals(pq.read_table(tmp_path / "t.parquet"))


def test_a_location_is_root_colon_split_unless_a_folder_has_that_name(
    small_world, tmp_path, capsys
) -> None:
    named = shutil.copytree(small_world, tmp_path / "my:data")  # a folder with a colon
    ckpt = str(tmp_path / "ckpt")
    assert _train(str(named), ckpt, "clip", "--split", "val") == 0
    assert json.loads(Path(ckpt, "config.json").read_text())["split"] == "val"
    capsys.readouterr()
    argv = ["score", "--embeddings", f"{small_world}:test", "--split", "train", "--checkpoint"]
    assert main([*argv, ckpt, "--output", str(tmp_path / "s.parquet")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --embeddings {small_world}:test names split test, --split train\n"


@pytest.mark.parametrize(
    "argv",
    [
        "score --embeddings {world}:test --checkpoint ckpt --output o.parquet",
        "evaluate --embeddings {world}:test --checkpoint ckpt --output o.json",
        "analyze retrieval --data {world}:test --checkpoint ckpt",
        "score-text --checkpoint ckpt dog --output t.parquet",
    ],
)
def test_an_output_file_is_kept_unless_overwrite(small_world, argv, tmp_path, monkeypatch, capsys):
    """As train and export keep a checkpoint: one line, exit 2, the file as it was."""
    monkeypatch.chdir(tmp_path)
    assert _train(small_world, "ckpt", "clip") == 0
    argv = argv.format(world=small_world).split()
    out = argv[argv.index("--output") + 1] if "--output" in argv else "a.json"
    argv += [] if "--output" in argv else ["--output", out]
    Path(out).write_text("earlier")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"error: --output {out} already exists; pass --overwrite to replace it\n"
    assert Path(out).read_text() == "earlier"
    if argv[0] != "score-text":  # a synthetic world has no encoder to score new text with
        assert main([*argv, "--overwrite"]) == 0 and Path(out).read_bytes()[:4] != b"earl"


def test_a_new_users_slips_get_a_line_that_says_what_to_do(
    small_world, tmp_path, monkeypatch, capsys
) -> None:
    """A checkpoint folder that is not there, an encoder neither cached nor to be had, an
    export folder with a space (the hint to publish it must paste), no progress bar off a
    terminal (stderr here is captured)."""
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert main(["score-text", "--checkpoint", "nope", "a dog"]) == 2
    assert capsys.readouterr().err.startswith("error: nope: no such folder (a checkpoint is")
    argv = ["--embeddings", small_world, "--method", "asymvlm-vmf", "--epochs", "1"]
    assert main(["train", *argv, "--hidden-dim", "8", "--output", "ckpt"]) == 0
    assert "it/s" not in capsys.readouterr().err
    meta = json.loads(Path("ckpt/config.json").read_text())
    meta["embedding_model"] = "openai/clip-vit-base-patch32"
    Path("ckpt/config.json").write_text(json.dumps(meta))
    assert main(["score-text", "--checkpoint", "ckpt", "a dog"]) == 2
    err = capsys.readouterr().err
    assert "'openai/clip-vit-base-patch32' is not in the Hugging Face cache" in err
    assert "give its folder as --encoder" in err and err.count("\n") == 1
    assert main(["export", "--checkpoint", "ckpt", "--output", "my adapter"]) == 0
    assert "publish it with: hf upload ORG/REPO 'my adapter'\n" in capsys.readouterr().err


def test_the_python_m_commands_name_themselves_and_explain_every_flag(capsys) -> None:
    from asymvlm import demo
    from asymvlm.synthetic import command_line as cli

    assert all(action.help for action in cli.build_parser()._actions)
    for name, command in (("asymvlm.synthetic", cli.main), ("asymvlm.demo", demo.main)):
        with pytest.raises(SystemExit):
            command(["--help"])
        assert capsys.readouterr().out.startswith(f"usage: python -m {name} [-h]")
        assert command(["--output"]) == 2
        err = capsys.readouterr().err
        assert err == f"error: python -m {name}: argument --output: expected one argument\n"


def test_score_for_a_method_without_uncertainty(small_world, tmp_path) -> None:
    ckpt, out, metrics = str(tmp_path / "clip"), str(tmp_path / "s.parquet"), tmp_path / "m.json"
    assert _train(small_world, ckpt, "clip") == 0
    args = ["--embeddings", small_world, "--checkpoint", ckpt, "--quiet", "--output"]
    assert main(["score", *args, out]) == 0
    table = pq.read_table(out)
    assert table.column("uncertainty").null_count == table.num_rows
    assert main(["evaluate", *args, str(metrics)]) == 0
    r = json.loads(metrics.read_text())["t2i"]
    assert r["binned_recall@1"] is None and r["spearman"] is None


@pytest.mark.parametrize(
    ("method", "arg", "value"),
    [("elip", "gallery_size=50", 50), ("asymvlm-vmf", "calibrate_input=false", False)],
)
def test_method_arguments_reach_the_constructor(small_world, tmp_path, method, arg, value):
    """A ``--method-arg`` string lands in the checkpoint as the type the method declares."""
    assert _train(small_world, str(tmp_path), method, "--method-arg", arg) == 0
    meta = json.loads((tmp_path / "config.json").read_text())
    stored = meta["method_kwargs"][arg.split("=")[0]]
    assert stored == value and type(stored) is type(value)


def test_bad_table_gives_a_clear_error_naming_the_file(small_world, tmp_path, capsys) -> None:
    shutil.copytree(small_world, tmp_path / "broken")
    path = tmp_path / "broken" / "train" / "texts" / "part-00000.parquet"
    table = pq.read_table(path)
    emb = table.column("embedding").combine_chunks()
    values = emb.values.to_numpy().copy()
    values[5 * emb.type.list_size] = np.nan  # row 5
    bad = pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), emb.type.list_size)
    pq.write_table(table.drop_columns("embedding").append_column("embedding", bad), path)
    assert _train(str(tmp_path / "broken"), str(tmp_path / "ckpt")) == 2
    err = capsys.readouterr().err
    assert "part-00000.parquet" in err and "row 5" in err
    assert not os.path.exists(tmp_path / "ckpt" / "model.safetensors")


def test_a_half_written_part_is_one_line_naming_it(small_world, tmp_path, capsys) -> None:
    world = shutil.copytree(small_world, tmp_path / "half")
    part = world / "train" / "texts" / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:500])  # a copy cut short
    for stream in ("never", "always"):
        assert _train(str(world), str(tmp_path / "ckpt"), "asymvlm-vmf", "--stream", stream) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {part.parent}: cannot read (") and str(part) in err
        assert err.count("\n") == 1 and not (tmp_path / "ckpt").exists()


_HELPS = """import contextlib, io, sys
from asymvlm.cli import build_parser, main
build_parser()  # every command's flags, as the docs' reference has them
for argv in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv.split())
        except SystemExit as stop:
            assert stop.code == 0, (argv, stop.code)
    assert argv == "--version" or out.getvalue().startswith("usage: asymvlm"), argv
print(*sorted({"torch", "ray", "mlflow", "pipelines"} & set(sys.modules)))
"""


def test_every_help_and_the_version_import_no_torch_ray_mlflow_or_pipelines() -> None:
    """Every --help exits 0 with its usage. The parser is built from light modules, so --help is
    quick (timed in benchmarks/cli_startup.py); a command imports its libraries when it runs
    (what lint-imports cannot see). Without a command only the sub-commands' names and help are
    made, as the whole parser shows them."""
    from asymvlm.cli import build_parser
    from asymvlm.evaluation.specs import SPECS

    assert build_parser("").format_help() == build_parser().format_help()
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    argvs = ["--help", "--version", *(f"{name} --help" for name in sub.choices)]
    argvs += [f"analyze {kind} --help" for kind in SPECS]
    done = subprocess.run([sys.executable, "-c", _HELPS, *argvs], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "\n", done.stderr


def test_methods_lists_the_methods_and_their_arguments(capsys) -> None:
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="asymvlm")
    assert script.value == "asymvlm.cli:main" and main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("asymvlm-vmf", "asymvlm-ps", "probvlm", "elip", "clip"))
    assert "--method-arg" not in out
    assert main(["methods", "asymvlm-vmf"]) == 0
    out = capsys.readouterr().out
    assert "--method-arg calibrate_input: bool (default True, official False)" in out
    assert "--method-arg init: Literal['he', 'default'] (default 'he'" in out
    assert "probvlm" not in out
    assert main(["methods", "--verbose"]) == 0
    assert "--method-arg fisher: Literal['mc', 'type-2'] (default 'mc')" in capsys.readouterr().out
    assert main(["methods", "clip"]) == 0
    assert capsys.readouterr().out.endswith("arguments: none\n")


@pytest.mark.parametrize(
    ("method", "optimizer", "lr", "depth"),
    [("probvlm", "adamw", 1e-4, 2), ("pfe", "sgd", 1e-3, None)],
)
def test_official_protocol_from_the_cli(small_world, tmp_path, method, optimizer, lr, depth):
    """--protocol official: the authors' optimiser and architecture, rebuilt from the checkpoint."""
    from asymvlm.checkpoints import load_checkpoint

    args = ["--method", method, "--protocol", "official", "--epochs", "1", "--hidden-dim", "16"]
    args += ["--batch-size", "128", "--embeddings", small_world, "--quiet"]
    assert main(["train", *args, "--output", str(tmp_path)]) == 0
    model, meta = load_checkpoint(str(tmp_path))
    cfg = meta["train_config"]
    assert (cfg["protocol"], cfg["optimizer"], cfg["lr"]) == ("official", optimizer, lr)
    assert model.protocol == "official" and model.official  # PFE: raw means, no variance floor
    if method == "probvlm":  # the official two-hidden-layer backbone, precision as uncertainty
        assert len(model.text_adapter.backbone) == 2 * depth + 1


@pytest.fixture(scope="module")
def bare_world(small_world, tmp_path_factory) -> str:
    """The small world without the `norm` column of its train texts."""
    world = shutil.copytree(small_world, tmp_path_factory.mktemp("bare") / "tables")
    for path in (world / "train" / "texts").glob("*.parquet"):
        pq.write_table(pq.read_table(path).drop_columns(["norm"]), path)
    return str(world)


def test_raw_adapter_input_without_norm_exits_2_and_makes_nothing(bare_world, tmp_path, capsys):
    assert _train(bare_world, str(tmp_path / "raw"), "asymvlm-vmf", "--adapter-input", "raw") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "texts: no `norm` column" in err and "\n" not in err
    assert not (tmp_path / "raw").exists()


def test_a_table_without_norm_trains_as_unit_said_at_warning(bare_world, tmp_path, capsys):
    assert _train(bare_world, str(tmp_path / "ckpt")) == 0
    meta = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert meta["adapter_input"] == meta["train_config"]["adapter_input"] == "unit"
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned == [
        f"warning: {bare_world}/train/texts has no `norm` column: training on unit text "
        "embeddings (adapter_input unit, recorded in the checkpoint)"
    ]


def test_another_error_comes_without_the_no_norm_warning_first(bare_world, tmp_path, capsys):
    save_adapter(tmp_path / "ckpt", dim=16)
    assert _train(bare_world, str(tmp_path / "ckpt")) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'ckpt'} already holds")


def test_a_checkpoint_of_another_dim_is_refused_naming_both(bare_world, tmp_path, capsys):
    narrow, scores = tmp_path / "c8", str(tmp_path / "s.parquet")
    save_adapter(narrow, "clip", dim=8)
    args = ["--embeddings", bare_world, "--split", "train", "--adapter-input", "raw"]
    assert main(["score", *args, "--checkpoint", str(narrow), "--output", scores]) == 2
    want = f"error: checkpoint {narrow} expects dim 8, but {bare_world}/train has dim 16\n"
    assert capsys.readouterr().err == want


def test_the_pipelines_runs_take_unit_input_without_norm_as_train_does(bare_world, tmp_path):
    from asymvlm_ray.schema.load import sweep_config

    doc = {"embeddings": bare_world, "methods": ["clip"], "lr": [0.1], "seeds": [0]}
    doc["output"] = str(tmp_path / "sweep")
    spec = sweep_config(doc).run_spec("clip", 0.1, 0).with_table_input()
    assert spec.train.adapter_input == "unit"
    with pytest.raises(ConfigError, match="texts: no `norm` column"):
        sweep_config({**doc, "adapter_input": "raw"}).run_spec("clip", 0.1, 0).with_table_input()


def test_mlflow_uris_without_a_store_are_refused_before_anything_is_made(
    small_world, tmp_path, monkeypatch, capsys
) -> None:
    """runs:/ and models:/ with no store: one line, exit 2, no mlflow.db; a store is named."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    data, out, run = ["--embeddings", small_world], ["--output", "o.parquet"], "runs:/abc/adapter"
    none = "no tracking store configured; give --tracking-uri or set MLFLOW_TRACKING_URI\n"
    for argv in (
        ["score", *data, "--checkpoint", run, *out],
        ["evaluate", *data, "--checkpoint", run, *out],
        ["score-text", "--checkpoint", "models:/m/1", "a dog"],
        ["export", "--checkpoint", run, *out],
        ["analyze", "retrieval", "--data", f"{small_world}:test", "--checkpoint", run],
        ["report", "--experiment", "e", *out],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.endswith(none) and err.count("\n") == 1, argv
    assert os.listdir(tmp_path) == []
    score = ["score", *data, *out, "--tracking-uri"]
    missing = f"sqlite:///{tmp_path}/none/mlflow.db"
    assert main([*score, missing, "--checkpoint", run]) == 2
    assert capsys.readouterr().err == f"error: no MLflow store at {missing} (no such file)\n"
    assert os.listdir(tmp_path) == []
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(store).create_experiment("e")
    capsys.readouterr()
    assert main([*score, store, "--checkpoint", run]) == 2
    want = f"error: {run}: cannot download the model from {store}: Run with id=abc not found\n"
    assert capsys.readouterr().err == want and not os.path.exists("o.parquet")


def test_a_bad_table_root_is_one_message_whichever_command(small_world, tmp_path, capsys):
    """No such folder, no manifest, no such split: the same line from train, evaluate, score,
    analyze and the sweep's check; a sweep without its val split is told of val_fraction."""
    from asymvlm_ray.schema.load import sweep_config
    from asymvlm_ray.tuning.sweep_driver import check_tables

    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    assert main(["train", "--embeddings", small_world, "--method", "clip", "--output", ckpt]) == 0
    capsys.readouterr()
    bare = shutil.copytree(small_world, tmp_path / "bare")
    os.remove(bare / "manifest.json")
    for root, split, message in (
        (f"{tmp_path}/no", "train", f"{tmp_path}/no: no such folder"),
        (str(bare), "train", f"{bare}/manifest.json: manifest not found"),
        (small_world, "nope", f"{small_world}: no split 'nope' (splits there: test, train, val)"),
    ):
        where = ["--embeddings", root, "--split", split]
        for argv in (
            ["train", *where, "--method", "clip", "--output", out],
            ["evaluate", *where, "--checkpoint", ckpt, "--output", f"{out}.json"],
            ["score", *where, "--checkpoint", ckpt, "--output", f"{out}.parquet"],
            ["analyze", "retrieval", "--data", f"{root}:{split}", "--checkpoint", ckpt],
        ):
            assert main(argv) == 2
            assert capsys.readouterr().err == f"error: {message}\n", argv
        doc = {"embeddings": root, "train_split": split, "methods": ["clip"], "lr": [0.1]}
        with pytest.raises(tables.TableError) as refused:
            check_tables(sweep_config({**doc, "seeds": [0], "output": out}))
        assert str(refused.value) == message
    assert sorted(os.listdir(tmp_path)) == ["bare", "ckpt"]
    no_val = shutil.copytree(small_world, tmp_path / "no-val", ignore=shutil.ignore_patterns("val"))
    doc = {"embeddings": str(no_val), "methods": ["clip"], "lr": [0.1, 0.2], "seeds": [0]}
    with pytest.raises(tables.TableError, match=r"no split 'val' \(splits there: test, train\): "):
        check_tables(sweep_config({**doc, "output": out}))
    with pytest.raises(tables.TableError, match="set val_fraction to hold out that share"):
        check_tables(sweep_config({**doc, "output": out}))
    check_tables(sweep_config({**doc, "output": out, "val_fraction": 0.1}))


def test_wrong_names_are_one_line_each_and_nothing_is_written(small_world, tmp_path, capsys):
    """A split of the frozen model's, a method, flag or output that cannot be: one line naming
    it, exit 2 (the rest: test_a_bad_table_root_is_one_message_whichever_command)."""
    out = str(tmp_path / "out")
    data = ["--embeddings", small_world, "--output", out]
    for argv, message in (
        (["analyze", "retrieval", "--data", f"{small_world}:nosuch", "--output", out], "no split"),
        (["train", *data, "--method", "nosuch"], "asymvlm train: argument --method: invalid"),
        (["score", *data, "--checkpoint", out, "--no-such-flag"], "unrecognized arguments"),
        (["score", *data, "--checkpoint", small_world], "--output " + out + ": write a .parquet"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, argv
    assert os.listdir(tmp_path) == []
