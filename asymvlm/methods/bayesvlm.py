"""BayesVLM (Baumann et al., arXiv:2412.06014): laplace-torch's damped KFAC Laplace posterior
over the frozen VLM's projections g = W phi, nothing trained (docs/methods.md)."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from asymvlm.errors import ConfigError
from asymvlm.methods.base import Encoding, Method, unit
from asymvlm.tables import TableError

if TYPE_CHECKING:
    from asymvlm.splits import SplitTensors

MODALITIES = ("image", "text")
MISSING_PRE = (
    "bayesvlm needs the pre-projection columns image_features_pre/text_features_pre and the "
    "root's projection.npz; embed with --pre-projection (or write the synthetic world with "
    "--pre-dim)"
)
#: The Fisher of the Laplace fit: Monte-Carlo sampled labels, or the exact GGN (type-2).
Fisher = Literal["mc", "type-2"]


class _CosineSoftmaxLogits(nn.Module):
    """The likelihood's logits ``s * cos(W phi, t_c)`` over a class batch's targets (the
    other modality's unit embeddings of its pairs); ``W`` (``proj``) is the only parameter."""

    def __init__(self, projection: torch.Tensor, logit_scale: float) -> None:
        super().__init__()
        self.proj = nn.Linear(projection.shape[1], projection.shape[0], bias=False)
        self.proj.to(device=projection.device, dtype=projection.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(projection)
        self.logit_scale = logit_scale

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.logit_scale * unit(self.proj(batch["input_ids"])) @ batch["targets"].T


def _class_batches(
    source: torch.Tensor, targets: torch.Tensor, class_batch: int, seed: int
) -> torch.utils.data.DataLoader:
    """Class batches of ``class_batch`` pairs in a seeded order: source features
    (``input_ids``), the pairs' targets and each pair's own target index (``labels``)."""
    order = torch.randperm(len(source), generator=torch.Generator().manual_seed(seed))
    batches = [order[i : i + class_batch].tolist() for i in range(0, len(order), class_batch)]

    def collate(rows: list[int]) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(rows, device=source.device)
        labels = torch.arange(len(rows), device=source.device)
        return {"input_ids": source[idx], "targets": targets[idx], "labels": labels}

    return torch.utils.data.DataLoader(
        range(len(source)), batch_sampler=batches, collate_fn=collate
    )


def fit_projection_posterior(
    source: torch.Tensor,
    targets: torch.Tensor,
    projection: torch.Tensor,
    *,
    logit_scale: float = 100.0,
    class_batch: int = 1024,
    fisher: Fisher = "mc",
    mc_samples: int = 1,
    prior_steps: int = 300,
    seed: int = 0,
) -> dict[str, Any]:
    """BayesVLM's Laplace posterior over ``g = W phi``: ``source`` [n, p] features of this
    modality, ``targets`` [n, d] the other's unit embeddings, ``projection`` W* [d, p].
    Returns float64 ``a_inv`` [p, p], ``b_inv`` [d, d], ``prior_precision`` and ``laplace``."""
    from laplace import KronLaplace
    from laplace.curvature import CurvlinopsGGN

    class DampedKronLaplace(KronLaplace):  # laplace-torch 0.3 drops damping in H * f + prior
        @property
        def posterior_precision(self) -> Any:
            precision = super().posterior_precision
            precision.damping = self.damping
            return precision

    la = DampedKronLaplace(
        _CosineSoftmaxLogits(projection, logit_scale),
        "classification",
        damping=True,
        backend=CurvlinopsGGN,
        backend_kwargs={"stochastic": fisher == "mc"},
        asdl_fisher_kwargs={"mc_samples": mc_samples} if fisher == "mc" else None,
    )
    la.fit(_class_batches(source, targets, class_batch, seed))
    root_n = math.sqrt(len(source))  # (B, A) over (sum, mean) -> BayesVLM's (B/sqrt n, A sqrt n)
    for factors in la.H_facs.kfacs:
        factors[0], factors[1] = factors[0] / root_n, factors[1] * root_n
    la.H = la.H_facs.decompose(damping=la.damping)
    with warnings.catch_warnings():  # laplace's note on the probit link of its predictive
        warnings.simplefilter("ignore", UserWarning)
        la.optimize_prior_precision(pred_type="glm", method="marglik", n_steps=prior_steps, lr=0.1)
    a_inv, b_inv = kron_posterior_factors(la)
    prior_precision = la.prior_precision.detach().reshape(()).double()
    return {"a_inv": a_inv, "b_inv": b_inv, "prior_precision": prior_precision, "laplace": la}


def kron_posterior_factors(la: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(A'^-1, B'^-1) of a fitted damped KronLaplace over one bias-free Linear: its precision
    is (B + sqrt(lambda) I) (x) (A + sqrt(lambda) I) in (output, input) order."""
    precision = la.posterior_precision  # eigen-decomposed factors, deltas = the prior
    (q_b, q_a), (l_b, l_a) = precision.eigenvectors[0], precision.eigenvalues[0]
    root = precision.deltas[0].sqrt().double()
    q_a, q_b, l_a, l_b = (t.detach().double() for t in (q_a, q_b, l_a, l_b))
    return (q_a / (l_a + root)) @ q_a.T, (q_b / (l_b + root)) @ q_b.T


def embedding_trace(
    phi: torch.Tensor, a_inv: torch.Tensor, b_inv_trace: torch.Tensor
) -> torch.Tensor:
    """tr Cov[g] = (phi^T A'^-1 phi) tr(B'^-1) for g = W phi, Cov[vec W] = A'^-1 (x) B'^-1."""
    return ((phi @ a_inv) * phi).sum(-1) * b_inv_trace


def expected_norm_unit(mean: torch.Tensor, trace: torch.Tensor) -> torch.Tensor:
    """mu / sqrt(|mu|^2 + tr Cov[g]): the dot product of two is ProbCosine's expected cosine."""
    return mean / (mean.pow(2).sum(-1) + trace).clamp_min(1e-30).sqrt().unsqueeze(-1)


def _check_pre_features(data: SplitTensors) -> None:
    """A :class:`TableError` when the split lacks the pre-projection features or projections."""
    needed = ("image_pre", "text_pre", "image_projection", "text_projection")
    if missing := [name for name in needed if getattr(data, name, None) is None]:
        raise TableError(f"{MISSING_PRE} (this split has no {', '.join(missing)})")


class BayesVLM(Method):
    """BayesVLM on cached pre-projection features (module docstring).

    :meth:`fit_posthoc` fits both posteriors; encodings ``mean`` = W* phi, ``trace`` = tr Cov[g]
    (the uncertainty) and ``mu`` = :func:`expected_norm_unit`, so the base score is ProbCosine's."""

    trainable = False
    uncertainty_doc = (
        "tr Cov of the embedding under the KFAC Laplace posterior over the projection (BayesVLM); "
        "score: its expected cosine (ProbCosine)"
    )
    FITTED_BUFFERS = tuple(f"{m}_{n}" for m in MODALITIES for n in ("projection", "a_inv"))
    USES_PRE_FEATURES = True

    def __init__(
        self,
        dim: int,
        logit_scale: float = 100.0,
        class_batch: int = 1024,
        fisher: Fisher = "mc",
        mc_samples: int = 1,
        prior_steps: int = 300,
        seed: int = 0,
        hidden_dim: int | None = None,
        depth: int | None = None,
    ) -> None:
        """:func:`fit_projection_posterior`'s options; ``hidden_dim`` and ``depth`` are ignored."""
        super().__init__(dim)
        self.logit_scale = float(logit_scale)
        self.fit_kwargs = {
            "logit_scale": self.logit_scale,
            "class_batch": class_batch,
            "fisher": fisher,
            "mc_samples": mc_samples,
            "prior_steps": prior_steps,
            "seed": seed,
        }
        for modality in MODALITIES:
            self.register_buffer(f"{modality}_projection", torch.empty(dim, 0))
            self.register_buffer(f"{modality}_a_inv", torch.empty(0, 0))
            self.register_buffer(f"{modality}_b_inv_diag", torch.zeros(dim))
            self.register_buffer(f"{modality}_prior_precision", torch.zeros(()))

    def fit_posthoc(self, data: SplitTensors) -> None:
        """Fit both posteriors on the training split, every pair one datum: the image posterior
        with captions as targets, the text posterior with their images."""
        _check_pre_features(data)
        owners = data.text_to_image
        fits = {
            "image": (data.image_pre[owners], unit(data.text_emb), data.image_projection),
            "text": (data.text_pre, unit(data.image_emb)[owners], data.text_projection),
        }
        for modality, (source, targets, w) in fits.items():
            fit = fit_projection_posterior(
                *(t.float() for t in (source, targets, w)), **self.fit_kwargs
            )
            device = self.image_b_inv_diag.device
            setattr(self, f"{modality}_projection", w.detach().float().to(device).clone())
            setattr(self, f"{modality}_a_inv", fit["a_inv"].float().to(device))
            getattr(self, f"{modality}_b_inv_diag").copy_(fit["b_inv"].diagonal())
            getattr(self, f"{modality}_prior_precision").fill_(float(fit["prior_precision"]))

    def split_inputs(self, data: SplitTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[embedding (d) | pre-projection feature (p)]`` of the images and captions."""
        _check_pre_features(data)
        return (
            torch.cat([data.image_emb, data.image_pre], 1),
            torch.cat([data.text_emb, data.text_pre], 1),
        )

    def encode(self, modality: str, rows: torch.Tensor) -> Encoding:
        w = getattr(self, f"{modality}_projection")
        if w.shape[1] == 0:
            raise RuntimeError(
                "bayesvlm has no posterior yet: fit it on a training split (asymvlm train "
                "--method bayesvlm) or load its checkpoint"
            )
        width = self.dim + w.shape[1]
        if rows.shape[-1] != width:
            raise ConfigError(
                f"bayesvlm encodes {modality} rows [embedding ({self.dim}) | pre-projection "
                f"feature ({w.shape[1]})] of width {width}, got width {rows.shape[-1]}: inputs "
                "without these pre-projection features (e.g. class prompts) cannot be scored"
            )
        phi = rows[..., self.dim :].to(w.dtype)
        mean = phi @ w.T
        b_trace = getattr(self, f"{modality}_b_inv_diag").sum()
        trace = embedding_trace(phi, getattr(self, f"{modality}_a_inv"), b_trace)
        return {"mu": expected_norm_unit(mean, trace), "mean": mean, "trace": trace}

    def uncertainty_from(self, enc: Encoding) -> torch.Tensor:
        return enc["trace"]

    def calibration_scale(self) -> float:
        """The likelihood's logit scale (CLIP's 100 by default)."""
        return self.logit_scale

    def training_stats(self) -> dict[str, float]:
        return {
            f"{m}_prior_precision": float(getattr(self, f"{m}_prior_precision")) for m in MODALITIES
        }
