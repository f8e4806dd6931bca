"""BayesVLM (Baumann et al., arXiv:2412.06014; reference code AaltoML/BayesVLM): a post-hoc
Laplace posterior over the frozen VLM's projection layers g = W phi, nothing trained.

Per modality a damped KFAC Laplace posterior over W (laplace-torch) under the contrastive
softmax likelihood p(target | source) = softmax_c(s cos(g, t_c)) over a class batch, prior
precision by marginal likelihood: Cov[vec W] = A'^-1 (x) B'^-1. An item's uncertainty is
tr Cov[g] = (phi^T A'^-1 phi) tr(B'^-1); retrieval ranks by ProbCosine's expected cosine.
Rows are ``[embedding (d) | pre-projection feature (p)]`` (:meth:`BayesVLM.split_inputs`).
The design is described in docs/methods.md.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from asymvlm.errors import ConfigError
from asymvlm.methods.base import Encoding, Method, register, unit
from asymvlm.tables import TableError

if TYPE_CHECKING:
    from asymvlm.splits import SplitTensors

MODALITIES = ("image", "text")
MISSING_PRE = (
    "bayesvlm needs the pre-projection columns image_features_pre/text_features_pre and the "
    "root's projection.npz; embed with --pre-projection (or write the synthetic world with "
    "--pre-dim)"
)


class _CosineSoftmaxLogits(nn.Module):
    """The likelihood's logits for a class batch: ``s * cos(W phi, t_c)`` over the batch's
    targets (the other modality's unit embeddings of the same pairs), as in the VLM's own
    contrastive objective. ``W`` (``proj``) is the only parameter."""

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
    """Class batches of ``class_batch`` pairs (a seeded permutation): the pairs' source features
    (``input_ids``), the targets of the same pairs and, per pair, its own target's index."""
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
    fisher: Literal["mc", "type-2"] = "mc",
    mc_samples: int = 1,
    prior_steps: int = 300,
    prior_lr: float = 0.1,
    prior_init: float = 1.0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """BayesVLM's Laplace posterior over one projection ``g = W phi``.

    ``source`` [n, p]: pre-projection features of this modality's items of the training pairs;
    ``targets`` [n, d]: the other modality's unit embeddings of the same pairs; ``projection``
    [d, p]: ``W*``. Returns float64 ``a_inv`` [p, p], ``b_inv`` [d, d], ``prior_precision``
    (0-d) and the fitted ``laplace`` object.
    """
    from laplace.curvature import CurvlinopsGGN

    model = _CosineSoftmaxLogits(projection, logit_scale)
    la = _damped_kron_laplace()(
        model,
        "classification",
        damping=True,
        backend=CurvlinopsGGN,
        backend_kwargs={"stochastic": fisher == "mc"},
        asdl_fisher_kwargs={"mc_samples": mc_samples} if fisher == "mc" else None,
    )
    la.fit(_class_batches(source, targets, class_batch, seed))
    _balance_kron_factors(la, len(source))
    with warnings.catch_warnings():  # laplace's note on the probit link of its predictive
        warnings.simplefilter("ignore", UserWarning)
        la.optimize_prior_precision(
            pred_type="glm",
            method="marglik",
            n_steps=prior_steps,
            lr=prior_lr,
            init_prior_prec=prior_init,
        )
    a_inv, b_inv = kron_posterior_factors(la)
    return {
        "a_inv": a_inv,
        "b_inv": b_inv,
        "prior_precision": la.prior_precision.detach().reshape(()).double(),
        "laplace": la,
    }


def _damped_kron_laplace() -> type:
    """laplace-torch's ``KronLaplace`` whose posterior precision keeps ``damping=True``
    (laplace-torch 0.3 drops the flag in ``H * factor + prior``)."""
    from laplace import KronLaplace

    class DampedKronLaplace(KronLaplace):
        @property
        def posterior_precision(self) -> Any:
            precision = super().posterior_precision
            precision.damping = self.damping
            return precision

    return DampedKronLaplace


def _balance_kron_factors(la: Any, n: int) -> None:
    """Rescale the KFAC factors (B, A) = (sum, mean over the data) to (B / sqrt(n), A sqrt(n)):
    the same product, each factor carrying sqrt(n) as BayesVLM's, before the damped prior."""
    for factors in la.H_facs.kfacs:
        b, a = factors
        factors[0], factors[1] = b / math.sqrt(n), a * math.sqrt(n)
    la.H = la.H_facs.decompose(damping=la.damping)


def kron_posterior_factors(la: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A'^-1, B'^-1)`` of a fitted damped KronLaplace over one bias-free Linear: its
    posterior precision is ``(B + sqrt(lambda) I) (x) (A + sqrt(lambda) I)`` in laplace-torch's
    (output, input) order, so ``Cov[vec W] = B'^-1 (x) A'^-1`` for the row-major ``vec W``."""
    precision = la.posterior_precision  # eigen-decomposed factors, deltas = the prior
    (q_b, q_a), (l_b, l_a) = precision.eigenvectors[0], precision.eigenvalues[0]
    root = precision.deltas[0].sqrt()
    q_a, q_b, l_a, l_b = (t.detach().double() for t in (q_a, q_b, l_a, l_b))
    a_inv = (q_a / (l_a + root.double())) @ q_a.T
    b_inv = (q_b / (l_b + root.double())) @ q_b.T
    return a_inv, b_inv


def embedding_trace(
    phi: torch.Tensor, a_inv: torch.Tensor, b_inv_trace: torch.Tensor
) -> torch.Tensor:
    """``tr Cov[g] = (phi^T A'^-1 phi) tr(B'^-1)`` for ``g = W phi`` under ``Cov[vec W] =
    A'^-1 (x) B'^-1`` (``Cov[g] = (phi^T A'^-1 phi) B'^-1``); [n]."""
    return ((phi @ a_inv) * phi).sum(-1) * b_inv_trace


def prob_cosine(
    mean_t: torch.Tensor, trace_t: torch.Tensor, mean_i: torch.Tensor, trace_i: torch.Tensor
) -> torch.Tensor:
    """ProbCosine's expected cosine similarity of independent Gaussians ``g_t``, ``g_i``:
    ``mu_t . mu_i / sqrt((|mu_t|^2 + tr Cov[g_t]) (|mu_i|^2 + tr Cov[g_i]))`` ([n_t, n_i])."""
    return expected_norm_unit(mean_t, trace_t) @ expected_norm_unit(mean_i, trace_i).T


def expected_norm_unit(mean: torch.Tensor, trace: torch.Tensor) -> torch.Tensor:
    """``mu / sqrt(E|g|^2)`` with ``E|g|^2 = |mu|^2 + tr Cov[g]``: ProbCosine's per-item factor."""
    return mean / (mean.pow(2).sum(-1) + trace).clamp_min(1e-30).sqrt().unsqueeze(-1)


@register("bayesvlm")
class BayesVLM(Method):
    """BayesVLM on cached pre-projection features (module docstring).

    :meth:`fit_posthoc` fits both posteriors; the state dict holds the MAP projections,
    ``A'^-1``, diag ``B'^-1`` and the prior precisions. Encodings: ``mean`` = W* phi,
    ``trace`` = tr Cov[g] (the uncertainty) and ``mu`` = mean / sqrt(|mean|^2 + trace), so the
    base score is ProbCosine's."""

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
        fisher: Literal["mc", "type-2"] = "mc",
        mc_samples: int = 1,
        prior_steps: int = 300,
        prior_lr: float = 0.1,
        prior_init: float = 1.0,
        seed: int = 0,
        hidden_dim: int | None = None,
        depth: int | None = None,
    ) -> None:
        """``hidden_dim`` / ``depth`` (adapter sizes) are accepted and ignored: no adapter."""
        super().__init__(dim)
        if fisher not in ("mc", "type-2"):
            raise ValueError(f"fisher must be 'mc' or 'type-2', got {fisher!r}")
        if class_batch < 2 or mc_samples < 1 or prior_steps < 1:
            raise ValueError("class_batch must be >= 2, mc_samples and prior_steps >= 1")
        self.logit_scale = float(logit_scale)
        self.fit_kwargs = dict(
            logit_scale=self.logit_scale,
            class_batch=class_batch,
            fisher=fisher,
            mc_samples=mc_samples,
            prior_steps=prior_steps,
            prior_lr=prior_lr,
            prior_init=prior_init,
            seed=seed,
        )
        for modality in MODALITIES:
            self.register_buffer(f"{modality}_projection", torch.empty(dim, 0))
            self.register_buffer(f"{modality}_a_inv", torch.empty(0, 0))
            self.register_buffer(f"{modality}_b_inv_diag", torch.zeros(dim))
            self.register_buffer(f"{modality}_prior_precision", torch.zeros(()))

    def fit_posthoc(self, data: SplitTensors) -> None:
        """Fit both projection posteriors on the whole training split: the image posterior
        with each caption's image as source and the captions as targets, the text posterior
        the other way round (every training pair is one datum)."""
        image_pre, text_pre = self._pre_features(data)
        w_image, w_text = data.image_projection, data.text_projection
        pairs_image = image_pre[data.text_to_image]
        unit_texts, unit_images = unit(data.text_emb), unit(data.image_emb)[data.text_to_image]
        for modality, source, targets, w in (
            ("image", pairs_image, unit_texts, w_image),
            ("text", text_pre, unit_images, w_text),
        ):
            fit = fit_projection_posterior(
                source.float(), targets.float(), w.float(), **self.fit_kwargs
            )
            device = self.image_b_inv_diag.device
            setattr(self, f"{modality}_projection", w.detach().float().to(device).clone())
            setattr(self, f"{modality}_a_inv", fit["a_inv"].float().to(device))
            getattr(self, f"{modality}_b_inv_diag").copy_(fit["b_inv"].diagonal())
            getattr(self, f"{modality}_prior_precision").fill_(float(fit["prior_precision"]))

    def _pre_features(self, data: SplitTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """(image_pre, text_pre) of a split; :class:`TableError` when the tables lack them or
        the projections, or their widths disagree."""
        needed = ("image_pre", "text_pre", "image_projection", "text_projection")
        missing = [name for name in needed if getattr(data, name, None) is None]
        if missing:
            raise TableError(f"{MISSING_PRE} (this split has no {', '.join(missing)})")
        for modality in MODALITIES:
            pre, w = getattr(data, f"{modality}_pre"), getattr(data, f"{modality}_projection")
            if w.shape != (self.dim, pre.shape[1]):
                raise TableError(
                    f"the {modality} projection has shape {list(w.shape)}, but the features "
                    f"are {pre.shape[1]}-d and the embeddings {self.dim}-d"
                )
        if self.image_projection.numel() and any(
            getattr(data, f"{m}_pre").shape[1] != getattr(self, f"{m}_projection").shape[1]
            for m in MODALITIES
        ):
            raise TableError(
                "the pre-projection features of this split are not as wide as the ones "
                "bayesvlm was fitted on (another embedding model?)"
            )
        return data.image_pre, data.text_pre

    def split_inputs(self, data: SplitTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[embedding input | pre-projection feature]`` of the split's images and
        captions (see the module docstring)."""
        image_pre, text_pre = self._pre_features(data)
        return torch.cat([data.image_emb, image_pre], 1), torch.cat([data.text_emb, text_pre], 1)

    def _encode(self, modality: str, rows: torch.Tensor) -> Encoding:
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
                "without pre-projection features (e.g. class prompts) cannot be scored"
            )
        phi = rows[..., self.dim :].to(w.dtype)
        mean = phi @ w.T
        trace = embedding_trace(
            phi, getattr(self, f"{modality}_a_inv"), getattr(self, f"{modality}_b_inv_diag").sum()
        )
        return {"mu": expected_norm_unit(mean, trace), "mean": mean, "trace": trace}

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return self._encode("text", text_emb)

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return self._encode("image", image_emb)

    def uncertainty_from(self, enc: Encoding) -> torch.Tensor:
        return enc["trace"]

    def calibration_scale(self) -> float:
        """The logit scale of the likelihood (CLIP's 100 by default)."""
        return self.logit_scale

    def training_stats(self) -> dict[str, float]:
        return {
            f"{m}_prior_precision": float(getattr(self, f"{m}_prior_precision")) for m in MODALITIES
        }
