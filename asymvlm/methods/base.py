"""One interface for every method, and the registry that names them.

Every method is an ``nn.Module`` working on cached, frozen VLM embeddings:

* ``image_emb`` -- [n_image, d] unit-norm image embeddings z_I (images are only normalised).
* ``text_emb``  -- [n_text, d] text features f_T(t): the adapter input, either the raw
  (unnormalised) text projection or its unit vector (``--adapter-input``). Methods that need
  the unit vector normalise it themselves.

and offers

* ``encode_texts`` / ``encode_images`` -> a dict of tensors (the per-item parameters: mu, kappa,
  variances ...), computed once per gallery;
* ``score(texts, images)`` -> [n_text, n_image] retrieval scores from two encodings (for the
  probabilistic methods: the log-likelihood, App. A.2), so evaluation can score chunks;
* ``log_likelihood(image_emb, text_emb)`` = ``score(encode_texts(t), encode_images(i))``;
* ``text_uncertainty`` / ``image_uncertainty`` -> [n] scalar per item, higher = more uncertain,
  or ``None`` where the method does not define one;
* ``loss(image_emb, text_emb, epoch=...)`` on a paired batch (row r of both is a pair), which
  is ``pair_loss(*loss_features(image_emb, text_emb), epoch=...)``: per-item encodings first,
  then the batch objective over them -- so data-parallel training can all-gather the encodings
  in between and every worker's objective spans the global batch
  (:mod:`asymvlm.distributed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

if TYPE_CHECKING:
    from asymvlm.splits import SplitTensors

Encoding = dict[str, torch.Tensor]
_log = logging.getLogger(__name__)

METHODS: dict[str, type[Method]] = {}


def register(name: str) -> Callable[[type[Method]], type[Method]]:
    """Class decorator: make a method available as ``build_method(name, ...)``."""

    def deco(cls: type[Method]) -> type[Method]:
        if name in METHODS:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        METHODS[name] = cls
        return cls

    return deco


def check_method_name(name: str) -> str:
    """``name`` if it is registered, else a ValueError listing the known names (the one check
    behind every config schema and :func:`build_method`)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(sorted(METHODS))}")
    return name


#: The two protocols (README "Protocols"): ``official`` reproduces the authors' code for every
#: method (architecture, PyTorch's default init, clamps, loss form, uncertainty as their
#: evaluation ranks it); ``improved`` is this project's (He init, input calibration, exact GGD
#: term, variance as uncertainty ...).
PROTOCOLS = ("improved", "official")


def check_protocol(protocol: str) -> str:
    """``protocol`` if it is one of :data:`PROTOCOLS`, else a ValueError naming them."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    return protocol


def build_method(name: str, dim: int, protocol: str = "improved", **kwargs: Any) -> Method:
    """Instantiate a registered method for embeddings of dimension ``dim`` under ``protocol``.

    The class's :meth:`Method.protocol_kwargs` give the constructor arguments that make the
    protocol; explicit ``kwargs`` override them.
    """
    cls = METHODS[check_method_name(name)]
    method = cls(dim=dim, **{**cls.protocol_kwargs(check_protocol(protocol)), **kwargs})
    method.protocol = protocol
    return method


Init = Literal["he", "default"]


def mlp(
    d_in: int, d_out: int, hidden_dim: int = 1024, depth: int = 3, init: Init = "he"
) -> nn.Sequential:
    """The adapter MLP of App. B.1: ``depth`` hidden ReLU layers of width ``hidden_dim``.

    The official code uses three hidden layers (a four-layer perceptron, as App. B.1 calls it);
    no residual, normalisation or dropout. ``init="he"`` (protocol ``improved``): He (Kaiming)
    normal weights for ReLU (linear gain on the output layer) and zero biases, so activations
    keep their scale through the depth: with unit-RMS inputs the output starts at unit RMS per
    coordinate (kappa ~ sqrt(d) for AsymVLM) instead of shrinking ~2.5x per layer as under
    PyTorch's default init, which leaves kappa near 0.55 and costs many epochs to recover.
    ``init="default"`` keeps PyTorch's default ``nn.Linear`` init, as the authors' code does
    (protocol ``official``; the layers draw from the generator in construction order).
    """
    layers: list[nn.Module] = []
    width = d_in
    for _ in range(depth):
        layers += [nn.Linear(width, hidden_dim), nn.ReLU()]
        width = hidden_dim
    layers.append(nn.Linear(width, d_out))
    if init == "he":
        for layer in layers:
            if isinstance(layer, nn.Linear):
                gain = "linear" if layer is layers[-1] else "relu"
                nn.init.kaiming_normal_(layer.weight, nonlinearity=gain)
                nn.init.zeros_(layer.bias)
    elif init != "default":
        raise ValueError(f"init must be 'he' or 'default', got {init!r}")
    return nn.Sequential(*layers)


class Adapter(nn.Module):
    """The adapter MLP of App. B.1 behind a fixed input scale.

    ``calibrate`` (called once on the training set by :meth:`Method.fit_start`) sets the scale
    to sqrt(d / mean ||x||^2), so inputs reach the first layer with unit RMS per coordinate.
    It is one constant: the function class is the MLP's own (the first layer absorbs it) and
    relative norms -- the information in the raw text norm -- are kept. It spares the optimiser
    a badly scaled start when inputs are unit vectors (coordinates ~ 1/sqrt(d)). Scale 1, the
    value before calibration, is the official code.
    """

    def __init__(
        self, d_in: int, d_out: int, hidden_dim: int = 1024, depth: int = 3, init: Init = "he"
    ) -> None:
        super().__init__()
        self.net = mlp(d_in, d_out, hidden_dim, depth, init)
        self.register_buffer("input_scale", torch.ones(()))

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor) -> None:
        # in blocks: no full-size temporary (the same value as x.float().pow(2).sum(-1).mean())
        mean_sq = torch.cat([b.float().pow(2).sum(-1) for b in x.split(_BLOCK_ROWS)])
        mean_sq = mean_sq.mean().clamp_min(1e-12)
        self.input_scale.fill_(float(torch.sqrt(x.shape[-1] / mean_sq)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x * self.input_scale)


#: Rows per block where a whole split is reduced (a full-size temporary of a COCO-size caption
#: matrix would cost as much memory as the matrix).
_BLOCK_ROWS = 65536


def unit(x: torch.Tensor) -> torch.Tensor:
    """Project onto the unit sphere."""
    return nn.functional.normalize(x, dim=-1, eps=1e-12)


def info_nce(logits: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE (paper Eq. 2) over a [B, B] logit matrix whose diagonal holds the pairs.

    Captions of the same image in one batch are negatives, as in the official code.
    """
    # = 1/2 (CE(rows) + CE(columns)) with labels = arange, written on the diagonals of the two
    # log-softmaxes: no transposed copy of the [B, B] matrix, no one-hot scatter.
    rows = logits.log_softmax(dim=1).diagonal()
    cols = logits.log_softmax(dim=0).diagonal()
    return -0.5 * (rows.mean() + cols.mean())


def sigmoid_pair_loss(logits: torch.Tensor) -> torch.Tensor:
    """SigLIP's pairwise log-sigmoid loss (App. A.3): -1/B sum_{r,s} ln sigmoid(y_rs logits_rs)."""
    signs = 2.0 * torch.eye(logits.shape[0], device=logits.device, dtype=logits.dtype) - 1.0
    return -nn.functional.logsigmoid(signs * logits).sum() / logits.shape[0]


class Method(nn.Module):
    """Base class; see the module docstring for the contract."""

    name: ClassVar[str] = "base"
    #: False for reference methods without parameters (nothing to train).
    trainable: ClassVar[bool] = True
    #: What ``text_uncertainty`` returns, for documentation and reports.
    uncertainty_doc: ClassVar[str] = "none"
    #: Constructor arguments per protocol (see :data:`PROTOCOLS`), e.g. ``{"official":
    #: {"init": "default"}}``; a protocol not listed builds the method with its defaults.
    PROTOCOL_KWARGS: ClassVar[dict[str, dict[str, Any]]] = {}
    #: The protocol the method was built under (set by :func:`build_method`).
    protocol: str = "improved"
    #: True where the authors' code feeds this method the raw image projection and the norm
    #: reaches its output (their embedding cache keeps raw projections; AsymVLM, PCME++ and
    #: ProLIP normalise it first, PFE's means and variance head and ProbVLM's backbone and
    #: targets do not): under ``official`` such a method takes ``image_emb * image_norm``.
    OFFICIAL_RAW_IMAGES: ClassVar[bool] = False
    #: Buffers that stay empty until the method is fitted (ELIP's galleries, BayesVLM's
    #: posterior): loading a state dict first gives them the saved shape.
    FITTED_BUFFERS: ClassVar[tuple[str, ...]] = ()
    #: Whether :meth:`split_inputs` needs the pre-projection features and the frozen model's
    #: projections (BayesVLM): a scorer of new inputs must then embed them too.
    USES_PRE_FEATURES: ClassVar[bool] = False

    @classmethod
    def protocol_kwargs(cls, protocol: str) -> dict[str, Any]:
        """Constructor arguments that make ``protocol`` for this method."""
        return dict(cls.PROTOCOL_KWARGS.get(protocol, {}))

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    # -- encodings ---------------------------------------------------------------------------
    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return {"mu": unit(text_emb)}

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return {"mu": unit(image_emb)}

    def score(self, texts: Encoding, images: Encoding) -> torch.Tensor:
        """[n_text, n_image] retrieval scores (higher = better match)."""
        return texts["mu"] @ images["mu"].T

    def log_likelihood(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """The retrieval score matrix [n_text, n_image] of App. A.2."""
        return self.score(self.encode_texts(text_emb), self.encode_images(image_emb))

    # -- uncertainty -------------------------------------------------------------------------
    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor | None:
        return None

    def image_uncertainty_from(self, images: Encoding) -> torch.Tensor | None:
        return None

    def text_uncertainty(self, text_emb: torch.Tensor) -> torch.Tensor | None:
        """[n_text] scalar uncertainty per caption (higher = more uncertain), or None."""
        return self.text_uncertainty_from(self.encode_texts(text_emb))

    def image_uncertainty(self, image_emb: torch.Tensor) -> torch.Tensor | None:
        """[n_image] scalar uncertainty per image (symmetric methods), or None."""
        return self.image_uncertainty_from(self.encode_images(image_emb))

    # -- training ----------------------------------------------------------------------------
    def loss_features(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor
    ) -> tuple[Encoding, Encoding]:
        """Per-item encodings of a paired batch (rows = items) that :meth:`pair_loss` needs."""
        return self.encode_images(image_emb), self.encode_texts(text_emb)

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        """The batch objective over encodings whose row r is a matched pair."""
        raise NotImplementedError(f"{self.name} has no training loss")

    def loss(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor, *, epoch: int = 0
    ) -> torch.Tensor:
        """Training loss on a paired batch: :meth:`pair_loss` of :meth:`loss_features`."""
        return self.pair_loss(*self.loss_features(image_emb, text_emb), epoch=epoch)

    #: Calibrate the input scale of the adapters (see :class:`Adapter`) in ``fit_start``.
    calibrate_input: bool = True

    def fit_start(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> None:
        """Hook called once with the whole training set before the first step.

        By default it calibrates the input scale of ``text_adapter`` / ``image_adapter``.
        """
        if not self.calibrate_input:
            return
        for attr, data in (("text_adapter", text_emb), ("image_adapter", image_emb)):
            adapter = getattr(self, attr, None)
            if isinstance(adapter, Adapter):
                adapter.calibrate(data)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in self.FITTED_BUFFERS:
            saved = state_dict.get(prefix + name)
            if isinstance(saved, torch.Tensor):
                buf = getattr(self, name)
                setattr(self, name, torch.empty(saved.shape, dtype=buf.dtype, device=buf.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def fit_posthoc(self, data: SplitTensors) -> None:
        """Hook of methods fitted post hoc instead of by SGD (``trainable = False``): called once
        with the whole training split (its optional tensors included) when training starts.
        Default: nothing."""

    @property
    def raw_image_input(self) -> bool:
        """Whether this method takes raw image projections (``official`` PFE and ProbVLM)."""
        return self.OFFICIAL_RAW_IMAGES and self.protocol == "official"

    def image_rows(self, image_emb: torch.Tensor, image_norm: torch.Tensor | None) -> torch.Tensor:
        """The image input this method takes from unit embeddings and their raw norms: the unit
        embeddings, or ``image_emb * image_norm`` where :attr:`raw_image_input`. Tables without
        an image ``norm`` column give unit images then, with a warning (once per method)."""
        if not self.raw_image_input:
            return image_emb
        if image_norm is None:
            if not getattr(self, "_warned_unit_images", False):
                self._warned_unit_images = True
                _log.warning(
                    "%s (protocol official) takes raw image projections, as the authors' code "
                    "does, but these tables have no image `norm` column: using unit images "
                    "(re-embed with this version to record the norm)",
                    self.name,
                )
            return image_emb
        return image_emb * image_norm.to(image_emb)[:, None]

    def split_inputs(self, data: SplitTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """(image rows, text rows) of a split that :meth:`encode_images` / :meth:`encode_texts`
        take: the image rows of :meth:`image_rows` and ``data.text_emb`` by default."""
        return self.image_rows(data.image_emb, data.image_norm), data.text_emb

    def kappa(self, text_emb: torch.Tensor) -> torch.Tensor | None:
        """Concentration per caption where the method defines one (vMF/PS), else None."""
        return None

    def training_stats(self) -> dict[str, float]:
        """Scalars worth logging per epoch (e.g. the temperature)."""
        return {}

    #: The logit scale of methods without a trained one: CLIP's (its learned logit scale is
    #: clamped at 100, Radford et al. 2021).
    default_calibration_scale: ClassVar[float] = 100.0

    def calibration_scale(self) -> float:
        """tau such that softmax(tau * score) is the method's predictive distribution over a
        gallery (the ECE of that softmax is reported): the trained temperature where the method
        has one (AsymVLM's tau multiplies L, Eq. 2), else :attr:`default_calibration_scale`."""
        temperature = getattr(self, "temperature", None)
        if isinstance(temperature, torch.Tensor):
            return float(temperature.detach())
        return self.default_calibration_scale
