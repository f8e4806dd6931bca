"""Methods from installed packages (the ``asymvlm.methods`` entry points): discovered by the
registry, trained, evaluated, exported and swept like a built-in one; a checkpoint whose plugin is
missing names the package to install; a config's Ray ``runtime_env`` reaches ``ray.init``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest
import yaml

from asymvlm import tracking
from asymvlm.errors import ConfigError
from asymvlm.methods import base
from asymvlm.methods.asymvlm import AsymVLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "vmf-const")


class _Plugged(AsymVLM):
    """A method a fake entry point provides."""


def _entry_point(name: str, obj: object) -> SimpleNamespace:
    load = obj if callable(obj) and not isinstance(obj, type) else lambda: obj
    dist = SimpleNamespace(name="pkg-x", version="1.2")
    return SimpleNamespace(name=name, value=f"pkg_x:{name}", dist=dist, load=load)


def _registry(monkeypatch, *eps: SimpleNamespace) -> base._Registry:
    """A registry with ``clip`` built in and ``eps`` installed."""
    clip = base.METHODS["clip"]  # the real registry discovers the real entry points first
    monkeypatch.setattr(base, "entry_points", lambda group: list(eps) if group else [])
    reg = base._Registry()
    reg.add("clip", clip)
    return reg


def test_an_entry_point_is_a_method_by_its_name_with_its_distribution(monkeypatch) -> None:
    reg = _registry(monkeypatch, _entry_point("plugged", _Plugged))
    assert sorted(reg) == ["clip", "plugged"]
    assert reg["plugged"] is _Plugged and _Plugged.name == "plugged"
    assert reg.dists == {"plugged": {"name": "pkg-x", "version": "1.2"}}


def _fails() -> None:
    raise ImportError("No module named 'pkg_x'")


@pytest.mark.parametrize(
    ("name", "obj", "why"),
    [
        ("clip", _Plugged, "'clip' is already a method"),
        ("broken", _fails, "does not load: ImportError: No module named 'pkg_x'"),
        ("odd", dict, "not a subclass of asymvlm.methods.Method"),
    ],
)
def test_a_bad_entry_point_is_one_line_naming_it_and_its_package(
    monkeypatch, name: str, obj: object, why: str
) -> None:
    reg = _registry(monkeypatch, _entry_point(name, obj))
    for _ in range(2):  # every read, not the first only
        with pytest.raises(
            ConfigError, match=f"entry point {name} = 'pkg_x:{name}' of pkg-x 1.2"
        ) as e:
            list(reg)
        assert why in str(e.value) and "\n" not in str(e.value)


def test_the_command_lines_show_a_broken_plugin_in_one_line(monkeypatch, capsys) -> None:
    """Its name is listed (entry points are named without loading them); using any method
    loads the registry, and that is one line naming the entry point."""
    from asymvlm import cli
    from pipelines import train

    monkeypatch.setattr(base, "METHODS", _registry(monkeypatch, _entry_point("x", _fails)))
    for main, argv in (
        (cli.main, ["methods"]),
        (cli.main, ["train", "--embeddings", "t", "--method", "clip", "--output", "o"]),
        (train.main, ["--embeddings", "t", "--method", "clip"]),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "entry point x = 'pkg_x:x' of pkg-x 1.2 does not load" in err, argv
        assert err.startswith("error: ") and err.count("\n") == 1


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """The example plugin installed into a throwaway folder, and an environment that sees it."""
    site = str(tmp_path_factory.mktemp("site"))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", site, EXAMPLE], check=True, capture_output=True)
    path = os.pathsep.join(p for p in (site, REPO, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


_CLI = """import sys
from asymvlm.cli import main
for argv in sys.argv[1:]:
    print(f"exit {main(argv.split())}", flush=True)
"""


def _cli(*commands: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The CLI's ``commands`` in one process (its imports once), each followed by its exit."""
    run = [sys.executable, "-c", _CLI, *commands]
    return subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)


def test_an_installed_plugin_trains_evaluates_and_exports(plugin_env, small_world, tmp_path):
    """``vmf-const`` from the example package through the CLI; without the package its
    checkpoint is one line naming the package to install, exit 2."""
    ckpt, out, model = (tmp_path / n for n in ("ckpt", "metrics.json", "model"))
    data = f"--embeddings {small_world} --quiet"
    evaluate = f"evaluate {data} --split test --checkpoint"
    done = _cli(
        "methods",
        f"train {data} --method vmf-const --epochs 2 --output {ckpt}",
        f"{evaluate} {ckpt} --output {out}",
        f"export --checkpoint {ckpt} --output {model}",
        env=plugin_env,
    )
    assert done.stdout.count("exit 0") == 4, done.stdout + done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines() if line[:1].strip()}
    assert {"vmf-const", "vmf-linear", "asymvlm-vmf"} <= listed
    metrics = json.loads(out.read_text())
    assert metrics["t2i"]["spearman"] is None and metrics["t2i"]["recall@10"] > 0
    config = json.loads((model / "config.json").read_text())
    package = {"name": "asymvlm-vmf-const", "version": "0.1.0"}
    assert config["method"] == "vmf-const" and config["method_package"] == package
    card = (model / "README.md").read_text()  # the model card says what to install beside asymvlm
    assert "pip install asymvlm asymvlm-vmf-const==0.1.0\n" in card
    assert "`vmf-const` (from the package `asymvlm-vmf-const==0.1.0`)" in card

    bare = {k: v for k, v in plugin_env.items() if k != "PYTHONPATH"}
    done = _cli(f"{evaluate} {model}", env={**bare, "PYTHONPATH": REPO})
    assert done.stdout == "exit 2\n" and done.stderr.count("\n") == 1, done.stderr
    assert "method 'vmf-const' is not installed" in done.stderr
    assert "pip install asymvlm-vmf-const==0.1.0" in done.stderr


def test_a_config_runtime_env_reaches_ray_init(monkeypatch, tmp_path) -> None:
    import ray

    from asymvlm_ray import session
    from asymvlm_ray.schema import PipelineConfig

    calls: list[dict] = []
    monkeypatch.setattr(session, "keep_credentials_on_nodes", lambda: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    for key in ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "RAY_AIR_NEW_OUTPUT"):
        monkeypatch.setenv(key, os.environ.get(key, "1"))
    env = {"pip": ["asymvlm-vmf-const==0.1.0"], "env_vars": {"A": "1"}}
    doc = {"name": "p", "output": str(tmp_path), "ray": {"runtime_env": env}}
    cfg = PipelineConfig.model_validate(doc)
    with session.RaySession(eager=True, init=cfg.ray.init_kwargs()):
        pass
    assert [c["runtime_env"] for c in calls] == [env]
    with pytest.raises(ValueError, match="conda"):
        PipelineConfig.model_validate({**doc, "ray": {"runtime_env": {"conda": "x"}}})


@pytest.mark.slow
def test_a_sweep_ships_the_plugin_to_its_workers_by_runtime_env(plugin_env, small_world, tmp_path):
    """``pipelines/sweep.py`` with ``vmf-const`` and ``asymvlm-vmf``, the plugin's wheel named in
    the config's ``ray.runtime_env.pip``: the driver alone has the plugin on its path, Ray
    installs it for the trials' workers; each trial's MLflow run finishes."""
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "-w", str(tmp_path), EXAMPLE], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("asymvlm_vmf_const-*.whl")
    output = str(tmp_path / "out")
    doc = {
        **{"methods": ["vmf-const", "asymvlm-vmf"], "lr": [1e-2], "seeds": [0], "epochs": 1},
        **{"batch_size": 128, "hidden_dim": 32, "embeddings": small_world, "output": output},
        "mlflow": {"experiment": "plug"},
        # the workers' path without the driver's copy of the plugin: they install the wheel
        "ray": {"runtime_env": {"pip": [str(wheel)], "env_vars": {"PYTHONPATH": REPO}}},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    command = [sys.executable, "pipelines/sweep.py", "--config", str(path)]
    env = dict(plugin_env)
    with tempfile.TemporaryDirectory(prefix="ray") as ray_tmp:  # Ray's copy of the venv: ~2 GB
        env["RAY_TMPDIR"] = ray_tmp
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    _, runs = tracking.experiment_runs(tracking.default_tracking_uri(output), "plug")
    trials = [r for r in runs if r.data.tags.get("kind") == "trial"]
    assert sorted(r.data.tags["method"] for r in trials) == ["asymvlm-vmf", "vmf-const"]
    assert {r.info.status for r in trials} == {"FINISHED"}


@pytest.mark.parametrize(
    ("package", "line"),
    [
        ({}, "not installed here"),
        ({"name": "p", "version": "2"}, "not installed here; `pip install p==2`"),
    ],
)
def test_a_checkpoint_of_a_missing_method_says_what_to_install(tmp_path, package, line) -> None:
    from asymvlm.checkpoints.folder import load_checkpoint
    from asymvlm.errors import CheckpointError

    config = {"method": "gone", "dim": 4, "complete": True, "method_package": package}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"method 'gone' is {line}$"):
        load_checkpoint(str(tmp_path))
