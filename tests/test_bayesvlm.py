"""BayesVLM: the KFAC Laplace posterior, its trace uncertainty and ProbCosine."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from asymvlm import tables
from asymvlm.checkpoints import load_checkpoint
from asymvlm.cli import main
from asymvlm.errors import ConfigError
from asymvlm.evaluation import evaluate_retrieval
from asymvlm.methods import build_method
from asymvlm.methods.base import unit
from asymvlm.methods.bayesvlm import embedding_trace, expected_norm_unit, fit_projection_posterior
from asymvlm.splits import SplitTensors, load_split

pytest.importorskip("laplace")


def _problem(n: int = 24, p: int = 5, d: int = 3, seed: int = 0, scale: float = 1.0):
    """Pre-projection features [n, p], a projection [d, p] and unit targets [n, d] (float64)."""
    g = torch.Generator().manual_seed(seed)
    phi = scale * torch.randn(n, p, generator=g, dtype=torch.float64)
    w = torch.randn(d, p, generator=g, dtype=torch.float64)
    targets = unit(torch.randn(n, d, generator=g, dtype=torch.float64))
    return phi, w, targets


def _fit(phi, w, targets, **kwargs):
    options = dict(logit_scale=4.0, class_batch=6, fisher="type-2", prior_steps=200)
    return fit_projection_posterior(phi, targets, w, **{**options, **kwargs})


def _ggn_by_hand(phi, w, targets, logit_scale: float, class_batch: int, seed: int = 0):
    """Sum over pairs of J^T (diag p - p p^T) J (J: the logits' Jacobian in g = W phi), with
    the class batches fit_projection_posterior draws, and the sum of phi phi^T."""
    order = torch.randperm(len(phi), generator=torch.Generator().manual_seed(seed))
    b = torch.zeros(w.shape[0], w.shape[0], dtype=torch.float64)
    for start in range(0, len(phi), class_batch):
        rows = order[start : start + class_batch]
        t = targets[rows]

        def logits(g, t=t):
            return logit_scale * unit(g) @ t.T

        for r in rows:
            g = w @ phi[r]
            jac = torch.autograd.functional.jacobian(logits, g)
            prob = logits(g).softmax(-1)
            b += jac.T @ (torch.diag(prob) - torch.outer(prob, prob)) @ jac
    return b, phi.T @ phi


def test_kfac_posterior_is_the_damped_ggn_and_gives_the_trace() -> None:
    """laplace-torch's KFAC of the cosine-softmax likelihood, balanced as BayesVLM's (summed
    factors / sqrt(n)), is the GGN computed pair by pair; the posterior factors are the damped
    A + sqrt(lambda) I, B + sqrt(lambda) I; tr Cov[W phi] = (phi^T A'^-1 phi) tr(B'^-1) against
    the dense covariance of vec W (row-major: precision B' (x) A') and laplace-torch's own GLM
    functional variance."""
    phi, w, targets = _problem()
    fit = _fit(phi, w, targets)
    la = fit["laplace"]
    b_sum, a_sum = _ggn_by_hand(phi, w, targets, logit_scale=4.0, class_batch=6)
    b, a = la.H_facs.kfacs[0]
    torch.testing.assert_close(a, a_sum / np.sqrt(len(phi)), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(b, b_sum / np.sqrt(len(phi)), rtol=1e-8, atol=1e-10)
    (d, p), root = w.shape, fit["prior_precision"].sqrt()
    eye_b, eye_a = torch.eye(d, dtype=b.dtype), torch.eye(p, dtype=a.dtype)
    torch.testing.assert_close(fit["a_inv"], torch.linalg.inv(a + root * eye_a))
    torch.testing.assert_close(fit["b_inv"], torch.linalg.inv(b + root * eye_b))
    covariance = torch.linalg.inv(torch.kron(b + root * eye_b, a + root * eye_a))
    x = torch.randn(7, p, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    jac = torch.stack([torch.kron(eye_b, row[None]) for row in x])
    dense = jac @ covariance @ jac.transpose(1, 2)  # [7, d, d]
    trace = embedding_trace(x, fit["a_inv"], fit["b_inv"].trace())
    torch.testing.assert_close(trace, dense.diagonal(dim1=1, dim2=2).sum(-1))
    torch.testing.assert_close(la.functional_variance(jac), dense)


def test_prob_cosine_matches_monte_carlo_over_the_posterior() -> None:
    """ProbCosine against the mean cosine of g = W phi over W drawn from laplace-torch's
    posterior, to first order in e = lambda_max(Cov[g]) / E|g|^2 (tolerance 4 se + 3 (e_t +
    e_i)), a tolerance that the cosine without the trace terms misses."""
    n_samples = 20000
    phi, w, targets = _problem(n=60, p=4, d=24)
    fit = _fit(phi, w, targets, prior_steps=1)  # lambda stays 1: a broad posterior
    b_max = torch.linalg.eigvalsh(fit["b_inv"]).max()
    items = []
    for seed, x in enumerate((phi[0], phi[0] + 0.3 * phi[1])):
        mean, trace = w @ x, embedding_trace(x[None], fit["a_inv"], fit["b_inv"].trace())
        draws = fit["laplace"].sample(n_samples, generator=torch.Generator().manual_seed(seed))
        e = float((x @ fit["a_inv"] @ x) * b_max / (mean.pow(2).sum() + trace))
        items.append((mean[None], trace, draws.reshape(n_samples, *w.shape) @ x, e))
    (mu_t, tr_t, g_t, e_t), (mu_i, tr_i, g_i, e_i) = items
    cos = (unit(g_t) * unit(g_i)).sum(-1)
    mc, se = float(cos.mean()), float(cos.std()) / np.sqrt(n_samples)
    closed = float(expected_norm_unit(mu_t, tr_t) @ expected_norm_unit(mu_i, tr_i).T)
    tolerance = 4 * se + 3 * (e_t + e_i)
    assert abs(mc - closed) < tolerance, (mc, closed, tolerance)
    without_trace = float(unit(mu_t) @ unit(mu_i).T)
    assert abs(mc - without_trace) > tolerance, (mc, without_trace, tolerance)


# -- the synthetic world and the command line ---------------------------------------------------
def test_missing_pre_projection_columns_exit_2(small_world, tmp_path, capsys) -> None:
    out = str(tmp_path / "ckpt")
    argv = f"train --embeddings {small_world} --method bayesvlm --output {out} --quiet"
    assert main(argv.split()) == 2
    err = capsys.readouterr().err
    assert "image_features_pre/text_features_pre" in err and "--pre-projection" in err
    assert "Traceback" not in err and not os.path.exists(os.path.join(out, "model.safetensors"))


def test_a_misspelled_method_argument_is_refused() -> None:
    with pytest.raises(TypeError, match="class_bach"):
        build_method("bayesvlm", 16, class_bach=8)


@pytest.fixture(scope="module")
def fitted(pre_world, tmp_path_factory):
    """bayesvlm fitted through the CLI on the pre-projection world: (its checkpoint folder, the
    method loaded from it, the test split)."""
    ckpt = str(tmp_path_factory.mktemp("bayesvlm") / "ckpt")
    argv = f"train --embeddings {pre_world} --method bayesvlm --output {ckpt} --quiet"
    args = ["--method-arg", "class_batch=256", "--method-arg", "prior_steps=50"]
    assert main([*argv.split(), *args]) == 0
    return ckpt, load_checkpoint(ckpt)[0], load_split(pre_world, "test")


def test_the_checkpoint_holds_the_posterior_over_the_tables_projection(pre_world, fitted):
    ckpt, method, _ = fitted
    meta = load_checkpoint(ckpt)[1]
    assert meta["method"] == "bayesvlm" and meta["complete"]
    assert method.text_a_inv.shape == (24, 24) and method.image_projection.shape == (16, 24)
    projection = tables.read_projection(pre_world)["text"]
    np.testing.assert_array_equal(method.text_projection.numpy(), projection)
    assert float(method.text_prior_precision) > 0 and float(method.image_prior_precision) > 0


def test_evaluate_gives_the_fitted_methods_recall_above_chance(pre_world, fitted, tmp_path):
    (ckpt, method, test), metrics = fitted, tmp_path / "metrics.json"
    args = ["--embeddings", pre_world, "--split", "test", "--checkpoint", ckpt, "--quiet"]
    assert main(["evaluate", *args, "--output", str(metrics)]) == 0
    result, again = json.loads(metrics.read_text()), evaluate_retrieval(method, test)
    for direction in ("t2i", "i2t"):
        assert result[direction]["recall@1"] == again[direction]["recall@1"] > 5 / 80  # chance 1/80


def test_score_writes_each_captions_trace_as_its_uncertainty(pre_world, fitted, tmp_path):
    (ckpt, method, test), scores = fitted, str(tmp_path / "scores.parquet")
    args = ["--embeddings", pre_world, "--split", "test", "--checkpoint", ckpt, "--quiet"]
    assert main(["score", *args, "--output", scores]) == 0
    trace = method.encode_texts(method.split_inputs(test)[1])["trace"]
    unc = pq.read_table(scores).column("uncertainty").to_numpy()
    np.testing.assert_allclose(unc, trace.numpy(), rtol=1e-6)


def test_inputs_without_pre_projection_features_are_refused(fitted) -> None:
    _, method, test = fitted
    plain = SplitTensors(test.image_emb, test.text_emb, test.text_to_image, test.split)
    with pytest.raises(tables.TableError, match="--pre-projection"):
        method.split_inputs(plain)
    with pytest.raises(ConfigError, match="cannot be scored"):
        method.encode_texts(test.text_emb)  # embeddings alone, as class prompts are


def test_the_hierarcaps_analysis_reads_the_checkpoint(pre_world, fitted, capsys) -> None:
    argv = ["analyze", "hierarcaps", "--checkpoint", fitted[0], "--data", f"{pre_world}:test"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert np.isfinite(report["bayesvlm/seed0"]["spearman_level_uncertainty"])
