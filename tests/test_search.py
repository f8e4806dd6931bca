"""The kappa-aware search (asymvlm.indexing): exact search through the index ranks as ``asymvlm
evaluate`` does, the approximate kinds meet their recall target, the decisions keep their risk,
and the command line, the API and bad input behave as docs/search.md says."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import asymvlm
from asymvlm.cli import main
from asymvlm.errors import ConfigError
from asymvlm.evaluation.retrieval import encode_split
from asymvlm.indexing import Index, IndexSettings, build_index, kinds
from asymvlm.indexing.decision import fit_policy
from asymvlm.indexing.forms import NotIndexable
from asymvlm.splits import load_split
from asymvlm.synthetic import WorldConfig, write_world

TRAIN = {"epochs": 4, "hidden_dim": 64, "batch_size": 128, "lr": 2e-3, "optimizer": "adamw"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("search") / "world")
    write_world(root, WorldConfig(splits={"train": 600, "val": 200, "test": 200}))
    return root


@pytest.fixture(scope="module")
def checkpoints(world: str) -> dict[str, str]:
    out = {}
    for method in ("asymvlm-vmf", "asymvlm-ps", "symvlm"):
        out[method] = os.path.join(os.path.dirname(world), f"ck-{method}")
        asymvlm.train(
            world, "train", {**TRAIN, "method": method}, output=out[method], progress=False
        )
    return out


@pytest.fixture(scope="module")
def indexes(world: str, checkpoints: dict[str, str]) -> dict[str, str]:
    out = {}
    for method in ("asymvlm-vmf", "asymvlm-ps"):
        out[method] = os.path.join(os.path.dirname(world), f"index-{method}")
        build_index(world, "test", checkpoints[method], out[method])
    return out


def _recalls(index: Index, world: str) -> dict[str, float]:
    data = load_split(world, "test", index.method.adapter_input)
    texts, images = encode_split(index.method, data)
    owner = data.text_to_image.numpy()
    t2i, i2t = index.ranked("t2i", texts, 10), index.ranked("i2t", images, 10)
    out = {}
    for k in (1, 5, 10):
        out[f"t2i recall@{k}"] = float(
            np.mean([any(h.row == owner[q] for h in hits[:k]) for q, hits in enumerate(t2i)])
        )
        out[f"i2t recall@{k}"] = float(
            np.mean([any(owner[h.row] == q for h in hits[:k]) for q, hits in enumerate(i2t)])
        )
    return out


@pytest.mark.parametrize("method", ["asymvlm-vmf", "asymvlm-ps"])
def test_exact_search_through_the_index_gives_evaluates_recall_to_the_last_digit(
    method: str, world: str, checkpoints: dict[str, str], indexes: dict[str, str]
) -> None:
    evaluated = asymvlm.evaluate(checkpoints[method], world, "test", device="cpu")
    expected = {
        f"{d} recall@{k}": evaluated[d][f"recall@{k}"] for d in ("t2i", "i2t") for k in (1, 5, 10)
    }
    assert _recalls(Index.open(indexes[method]), world) == expected


def test_the_index_scores_are_the_methods_log_likelihood(
    world: str, indexes: dict[str, str]
) -> None:
    index = Index.open(indexes["asymvlm-ps"])
    data = load_split(world, "test", index.method.adapter_input)
    texts, images = encode_split(index.method, data)
    first = {name: value[:3] for name, value in texts.items()}
    scores = index.method.score(first, images)
    for row, hits in enumerate(index.ranked("t2i", first, 5)):
        expected = scores[row].topk(5).values
        assert [h.score for h in hits] == pytest.approx(expected.tolist(), rel=1e-6)


def test_a_method_whose_score_is_no_inner_product_is_refused_in_one_line(
    world: str, checkpoints: dict[str, str], tmp_path, capsys
) -> None:
    with pytest.raises(NotIndexable, match="symvlm: its retrieval score is not an inner product"):
        build_index(world, "test", checkpoints["symvlm"], str(tmp_path / "index"))
    argv = ["index", "--embeddings", world, "--checkpoint", checkpoints["symvlm"]]
    assert main([*argv, "--output", str(tmp_path / "cli")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: symvlm: its retrieval score")
    assert not os.path.exists(tmp_path / "cli" / "manifest.json")


def test_the_manifest_names_what_the_index_serves(world: str, indexes: dict[str, str]) -> None:
    manifest = Index.open(indexes["asymvlm-vmf"]).manifest
    assert (manifest.method, manifest.split, manifest.dim) == ("asymvlm-vmf", "test", 64)
    assert manifest.fingerprint.startswith("sha256:")
    assert (manifest.images, manifest.captions) == (200, 1000)
    (shard,) = manifest.shards
    assert shard.images.spec.kind == "flat" and shard.images.recall_at_10 == 1.0
    assert shard.captions.spec.dim == 65  # [kappa mu, ln C]: d + 1
    assert set(manifest.policies) == {"t2i", "i2t"}


def test_two_shards_give_the_top_k_of_one_index(world, checkpoints, indexes, tmp_path) -> None:
    settings = IndexSettings(shards=2)
    sharded = str(tmp_path / "sharded")
    build_index(world, "test", checkpoints["asymvlm-ps"], sharded, settings)
    one, two = Index.open(indexes["asymvlm-ps"]), Index.open(sharded)
    assert [s.images.rows for s in two.manifest.shards] == [100, 100]
    data = load_split(world, "test", one.method.adapter_input)
    texts, images = encode_split(one.method, data)
    for direction, encoding in (("t2i", texts), ("i2t", images)):
        assert two.ranked(direction, encoding, 10) == one.ranked(direction, encoding, 10)
    captions = list(data.captions[:20])
    assert two.search_text(captions, 5) == one.search_text(captions, 5)


def test_an_index_built_on_ray_data_is_the_index_built_here(
    world, checkpoints, indexes, ray_session, tmp_path
) -> None:
    from asymvlm_ray.index_build import encoded_on_ray

    on_ray = str(tmp_path / "on-ray")
    build_index(world, "test", checkpoints["asymvlm-vmf"], on_ray, encoded=encoded_on_ray)
    here, there = Index.open(indexes["asymvlm-vmf"]), Index.open(on_ray)
    for name in ("image_mu.npy", "caption_mu.npy", "images.parquet", "captions.parquet"):
        a, b = (os.path.join(i.folder, "shard-00000", name) for i in (here, there))
        assert open(a, "rb").read() == open(b, "rb").read(), name
    assert there.manifest.policies == here.manifest.policies
    data = load_split(world, "test")
    captions = list(data.captions[:30])
    assert there.search_text(captions, 5) == here.search_text(captions, 5)


def test_an_index_on_s3_is_built_and_searched_as_a_local_one(
    world, checkpoints, indexes, bucket
) -> None:
    build_index(world, "test", checkpoints["asymvlm-ps"], "s3://bucket/index")
    assert bucket.exists("bucket/index/manifest.json")
    assert bucket.exists("bucket/index/shard-00000/images.faiss")
    captions = list(load_split(world, "test").captions[:10])
    remote, local = Index.open("s3://bucket/index"), Index.open(indexes["asymvlm-ps"])
    assert remote.search_text(captions, 5) == local.search_text(captions, 5)
    with pytest.raises(ConfigError, match="an index is there already"):
        build_index(world, "test", checkpoints["asymvlm-ps"], "s3://bucket/index")


def test_an_index_or_a_folder_already_there_is_kept(world, checkpoints, indexes, tmp_path, capsys):
    argv = ["index", "--embeddings", world, "--checkpoint", checkpoints["asymvlm-vmf"]]
    before = os.path.getmtime(os.path.join(indexes["asymvlm-vmf"], "manifest.json"))
    assert main([*argv, "--output", indexes["asymvlm-vmf"]]) == 2
    assert "an index is there already (--overwrite replaces it)" in capsys.readouterr().err
    assert os.path.getmtime(os.path.join(indexes["asymvlm-vmf"], "manifest.json")) == before
    (tmp_path / "notes.txt").write_text("mine")
    assert main([*argv, "--output", str(tmp_path)]) == 2
    assert "a folder with other files in it" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"
    again = str(tmp_path / "again")
    assert main([*argv, "--output", again]) == 0
    assert main([*argv, "--output", again, "--overwrite"]) == 0
    assert sorted(os.listdir(again)) == ["adapter", "manifest.json", "shard-00000"]


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_an_approximate_kind_is_tuned_to_its_recall_target(kind: str) -> None:
    rng = np.random.default_rng(0)
    items = rng.standard_normal((20000, 32)).astype(np.float32)
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    queries = items[:200] + 0.3 * rng.standard_normal((200, 32)).astype(np.float32)
    exact = np.argsort(-(queries @ items.T), axis=1)[:, :10]
    spec = kinds.choose_spec(len(items), 32, kind=kind)
    index = spec.create()
    index.train(items)
    index.add(items)
    depth, recall = kinds.tune_depth(index, spec, queries, exact)
    assert recall >= kinds.RECALL_TARGET and depth is not None
    kinds.set_depth(index, spec, depth)
    assert kinds.recall_at(index.search(queries, 10)[1], exact) == recall


def test_the_kind_follows_the_size_and_the_memory_budget() -> None:
    assert kinds.choose_spec(1000, 512).kind == "flat"
    assert kinds.choose_spec(200_000, 512).kind == "hnsw"
    assert kinds.choose_spec(1_000_000, 512).kind == "ivf"
    squeezed = kinds.choose_spec(1_000_000, 512, memory_bytes=200 * 2**20)
    assert squeezed.kind == "ivfpq" and squeezed.pq_bytes + 8 <= 200 * 2**20 / 1_000_000
    with pytest.raises(ConfigError, match="holds no index of 1,000,000 vectors"):
        kinds.choose_spec(1_000_000, 512, memory_bytes=2**20)


def test_the_decisions_keep_the_target_risk_on_their_validation_queries() -> None:
    rng = np.random.default_rng(0)
    kappa = rng.uniform(1, 100, 5000)
    right = rng.random(5000) < kappa / 100  # certain queries are right more often
    widened = right | (rng.random(5000) < 0.5)
    policy = fit_policy(kappa, right, widened, target_risk=0.3)
    answered = kappa >= policy.answer_kappa
    given = kappa >= policy.abstain_kappa
    assert (~right[answered]).mean() <= 0.3
    assert (~np.where(answered, right, widened)[given]).mean() <= 0.3
    assert 0 < answered.mean() < given.mean() < 1
    assert [policy.decide(k) for k in (99.0, 1.0)] == ["answer", "abstain"]
    confidence = policy.confidence(np.array([2.0, 50.0, 98.0]))
    assert np.all(np.diff(confidence) >= 0) and abs(confidence[1] - 0.5) < 0.1


def test_a_vaguer_query_is_answered_less(world: str, indexes: dict[str, str]) -> None:
    index = Index.open(indexes["asymvlm-vmf"])
    data = load_split(world, "test")
    levels = data.split.extra_text_columns["level"]
    vague = data.captions[int(np.flatnonzero(levels == 0)[0])]
    detailed = data.captions[int(np.flatnonzero(levels == 3)[0])]
    general, specific = index.search_text([vague, detailed], k=5)
    assert general.kappa < specific.kappa
    order = ["abstain", "widen", "answer"]
    assert order.index(general.decision) <= order.index(specific.decision)
    policy = index.manifest.policies["t2i"]
    for result in (general, specific):
        assert result.decision == policy.decide(result.kappa)
        shown = {"answer": 5, "abstain": 0}.get(result.decision, len(result.results))
        assert len(result.results) == shown and (result.decision != "widen" or shown >= 5)
    assert 0 <= general.confidence <= specific.confidence <= 1


def test_cli_api_and_index_give_one_answer(world: str, indexes: dict[str, str], capsys) -> None:
    data = load_split(world, "test")
    captions = [data.captions[0], data.captions[7]]
    assert main(["search", "--index", indexes["asymvlm-ps"], "--k", "3", *captions]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    api = [r.model_dump() for r in asymvlm.search(indexes["asymvlm-ps"], captions, k=3)]
    direct = [r.model_dump() for r in Index.open(indexes["asymvlm-ps"]).search_text(captions, 3)]
    assert printed == api == direct
    assert [r["query"] for r in printed] == captions


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["not in them"], "caption 0: 'not in them' is not in the tables"),
        (["--k", "0", "a"], "--k must be >= 1, got 0"),
        ([], "nothing to search: give captions, or --image FILE"),
    ],
)
def test_bad_search_input_is_one_line_and_exit_2(args, message, indexes, capsys) -> None:
    assert main(["search", "--index", indexes["asymvlm-vmf"], *args]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]


def test_a_folder_without_an_index_is_named(tmp_path, capsys) -> None:
    assert main(["search", "--index", str(tmp_path), "a dog"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: {tmp_path}: not an index folder (no manifest.json)"
    )


def test_the_build_is_logged_to_mlflow(world, checkpoints, tmp_path) -> None:
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = ["index", "--embeddings", world, "--checkpoint", checkpoints["asymvlm-vmf"]]
    assert main([*argv, "--output", str(tmp_path / "index"), "--tracking-uri", uri]) == 0
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("asymvlm-index").experiment_id])
    assert run.data.params["shard-00000.images.kind"] == "flat"
    assert run.data.metrics["shard-00000.images.recall_at_10"] == 1.0
    assert run.data.metrics["shard-00000.captions.rows"] == 1000
    from asymvlm.tracking import json_artifact

    manifest = json_artifact(uri, run.info.run_id, "index-manifest.json")
    assert manifest["method"] == "asymvlm-vmf" and run.info.status == "FINISHED"
