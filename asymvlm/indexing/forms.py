"""A method's retrieval score as an inner product of a query vector and an item vector, the form
an index searches (docs/search.md, "Ranking by the model's own score").

For AsymVLM (captions vMF(mu, kappa) or PS(mu, kappa), images points z; App. A.2):

* text -> image: ln p(z | mu, kappa) is increasing in mu^T z for one query, so images are
  searched by ``mu . z``;
* image -> text, vMF: ln p(z | mu_t, kappa_t) = [kappa_t mu_t, ln C_d(kappa_t)] . [z, 1], an
  inner product in d + 1 dimensions;
* image -> text, PS: kappa_t ln(1 + mu_t^T z) + ln C_d(kappa_t) is concave in mu_t^T z, so its
  tangent at the caption's mean cosine c_t is an inner product that bounds it from above; the
  index searches the bound and the exact score re-ranks (:attr:`InnerProductForm.bound_i2t`).

Methods that score by the cosine of their encodings' mu (:meth:`Method.score` itself: CLIP,
Determ. FT, ELIP and the Gaussian baselines) are inner products as they are; any other score is
refused (:class:`NotIndexable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asymvlm.distributions import (
    PowerSpherical,
    VonMisesFisher,
    ps_log_normalizer,
    vmf_log_normalizer,
)
from asymvlm.errors import ConfigError
from asymvlm.methods import Encoding, Method


class NotIndexable(ConfigError):
    """The method's score is no inner product of a query and an item vector."""


@dataclass(frozen=True)
class InnerProductForm:
    """How one method's scores become inner products (:func:`inner_product_form`)."""

    family: str  # "cosine", "vmf" or "ps"
    #: The image -> text inner product is an upper bound of the score (PS), not the score.
    bound_i2t: bool = False

    def caption_width(self, dim: int) -> int:
        """Width of the caption vectors: d, or d + 1 with the normaliser's coordinate."""
        return dim if self.family == "cosine" else dim + 1

    def text_queries(self, texts: Encoding) -> torch.Tensor:
        """Text -> image query vectors: the captions' mu."""
        return texts["mu"]

    def image_items(self, images: Encoding) -> torch.Tensor:
        """Text -> image item vectors: the images' mu (z)."""
        return images["mu"]

    def image_queries(self, images: Encoding) -> torch.Tensor:
        """Image -> text query vectors: mu, or [z, 1] for a spherical caption."""
        z = images["mu"]
        if self.family == "cosine":
            return z
        return torch.cat([z, torch.ones_like(z[:, :1])], dim=1)

    def caption_items(self, texts: Encoding) -> torch.Tensor:
        """Image -> text item vectors: mu, or [kappa mu, ln C_d(kappa)] (vMF), or the PS
        tangent at the mean cosine c = kappa / (kappa + d - 1):
        [kappa mu / (1 + c), kappa (ln(1 + c) - c / (1 + c)) + ln C_d(kappa)]."""
        mu = texts["mu"]
        if self.family == "cosine":
            return mu
        kappa, dim = texts["kappa"].to(torch.float64), mu.shape[1]
        if self.family == "vmf":
            slope, offset = kappa, vmf_log_normalizer(kappa, dim)
        else:
            c = cap_cosine(self.family, kappa, dim)
            slope = kappa / (1.0 + c)
            offset = kappa * (torch.log1p(c) - c / (1.0 + c)) + ps_log_normalizer(kappa, dim)
        vectors = torch.cat([slope[:, None] * mu.to(torch.float64), offset[:, None]], dim=1)
        return vectors.to(mu.dtype)


def cap_cosine(family: str, kappa: torch.Tensor, dim: int) -> torch.Tensor:
    """The caption's mean cosine E[mu^T x] (vMF: A_d(kappa); PS: kappa / (kappa + d - 1)): a
    widened answer holds the images at least this close to mu, as close as a typical image of
    the caption's own distribution. A vague caption (small kappa) has a low one, so many images."""
    kappa = kappa.to(torch.float64)
    pole = torch.zeros(len(kappa), dim, dtype=torch.float64)
    pole[:, 0] = 1.0
    distribution = VonMisesFisher if family == "vmf" else PowerSpherical
    return distribution(pole, kappa).mean_resultant_length()


def inner_product_form(method: Method) -> InnerProductForm:
    """The :class:`InnerProductForm` of ``method``, or :class:`NotIndexable` in one line."""
    from asymvlm.methods.asymvlm import _Spherical

    if isinstance(method, _Spherical) and method.probabilistic == ("text",):
        family = method.distribution
        return InnerProductForm(family, bound_i2t=family == "ps")
    if type(method).score is Method.score:  # the cosine of the encodings' mu
        return InnerProductForm("cosine")
    raise NotIndexable(
        f"{method.name}: its retrieval score is not an inner product of a query and an item "
        "vector, so no index can rank by it (indexable: the asymvlm-vmf/-ps families with "
        "deterministic images, and methods that score by the cosine of their encodings)"
    )
