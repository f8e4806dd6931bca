"""The interface every method implements (:class:`Method`) and the registry that names them."""

from __future__ import annotations

import logging
import pkgutil
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

from asymvlm.errors import ConfigError
from asymvlm.methods import BUILTIN, GROUP

if TYPE_CHECKING:
    from asymvlm.splits import SplitTensors

Encoding = dict[str, torch.Tensor]
Init = Literal["he", "default"]
_log = logging.getLogger(__name__)


class _Registry(Mapping[str, "type[Method]"]):
    """Name -> Method class: on first read the ``builtin`` ones (name -> ``module:Class`` under
    ``asymvlm.methods``), then the ``asymvlm.methods`` entry points of the installed
    distributions (the entry point's name is the method's name)."""

    def __init__(self, builtin: Mapping[str, str] | None = None) -> None:
        self._builtin = dict(builtin or {})
        self._classes: dict[str, type[Method]] = {}
        #: plugin name -> its distribution's name and version
        self.dists: dict[str, dict[str, str]] = {}
        self._discovered = False
        self._lock = threading.RLock()
        self._broken: ConfigError | None = None  # a plugin that does not load fails every read

    def add(self, name: str, cls: type[Method]) -> None:
        if name in self._classes:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        self._classes[name] = cls

    def _discover(self) -> dict[str, type[Method]]:
        with self._lock:  # once per process, whichever thread reads first
            if not self._discovered:
                self._discovered = True
                for name, target in self._builtin.items():
                    self.add(name, pkgutil.resolve_name(f"{__package__}.{target}"))
                try:
                    for ep in entry_points(group=GROUP):
                        self._load(ep)
                except ConfigError as exc:
                    self._broken = exc
            if self._broken:
                raise self._broken
        return self._classes

    def _load(self, ep: Any) -> None:
        dist = {"name": ep.dist.name, "version": ep.dist.version} if ep.dist else {}
        where = f"entry point {ep.name} = {ep.value!r} of {dist.get('name')} {dist.get('version')}"
        if ep.name in self._classes:
            raise ConfigError(f"{where}: {ep.name!r} is already a method; rename the entry point")
        try:
            cls = ep.load()
        except Exception as exc:
            raise ConfigError(f"{where} does not load: {type(exc).__name__}: {exc}") from exc
        if self._classes.get(ep.name) is cls:  # its module registered it too
            del self._classes[ep.name]
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise ConfigError(f"{where} is {cls!r}, not a subclass of asymvlm.methods.Method")
        self.add(ep.name, cls)
        if dist:
            self.dists[ep.name] = dist

    def __getitem__(self, name: str) -> type[Method]:
        return self._discover()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._discover())

    def __len__(self) -> int:
        return len(self._discover())


#: Every method by name, plugins included (discovered when first read).
METHODS = _Registry(BUILTIN)
_BUILTIN_NAMES = {target: name for name, target in BUILTIN.items()}
#: ``official``: the authors' code; ``improved``: this project's fixes (README "Protocols").
PROTOCOLS = ("improved", "official")
_BLOCK_ROWS = 8192  # rows per block where a whole split is reduced (16 MiB at d = 512)


def method_distribution(name: str) -> dict[str, str] | None:
    """``{"name", "version"}`` of the distribution providing plugin method ``name``, else None."""
    return METHODS.dists.get(name) if name in METHODS else None


def check_method_name(name: str) -> str:
    """``name`` if it is registered, else a ValueError listing the known names."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(sorted(METHODS))}")
    return name


def build_method(name: str, dim: int, protocol: str = "improved", **kwargs: Any) -> Method:
    """A registered method for ``dim``-d embeddings under ``protocol``; ``kwargs`` override the
    protocol's constructor arguments (:attr:`Method.PROTOCOL_KWARGS`)."""
    cls = METHODS[check_method_name(name)]
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    method = cls(dim=dim, **{**cls.PROTOCOL_KWARGS.get(protocol, {}), **kwargs})
    method.protocol = protocol
    return method


def mlp(
    d_in: int, d_out: int, hidden_dim: int = 1024, depth: int = 3, init: Init = "he"
) -> nn.Sequential:
    """The adapter MLP of App. B.1: ``depth`` hidden ReLU layers of width ``hidden_dim``;
    ``init="he"``: Kaiming-normal weights, zero biases; ``"default"``: PyTorch's init."""
    if init not in ("he", "default"):
        raise ValueError(f"init must be 'he' or 'default', got {init!r}")
    widths = [d_in] + [hidden_dim] * depth
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], d_out))
    if init == "he":
        for layer in layers[::2]:
            gain = "linear" if layer is layers[-1] else "relu"
            nn.init.kaiming_normal_(layer.weight, nonlinearity=gain)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Adapter(nn.Module):
    """The MLP of App. B.1 behind an input scale, sqrt(d / mean ||x||^2) after
    :meth:`calibrate` (unit RMS per coordinate), 1 before (the official code)."""

    def __init__(
        self, d_in: int, d_out: int, hidden_dim: int = 1024, depth: int = 3, init: Init = "he"
    ) -> None:
        super().__init__()
        self.net = mlp(d_in, d_out, hidden_dim, depth, init)
        self.register_buffer("input_scale", torch.ones(()))

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor) -> None:
        square = torch.empty(min(len(x), _BLOCK_ROWS), x.shape[-1], device=x.device)  # reused
        blocks = x.split(_BLOCK_ROWS)
        mean_sq = torch.cat([torch.pow(b.float(), 2, out=square[: len(b)]).sum(-1) for b in blocks])
        mean_sq = mean_sq.mean().clamp_min(1e-12)
        self.input_scale.fill_(float(torch.sqrt(x.shape[-1] / mean_sq)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x * self.input_scale)


def unit(x: torch.Tensor) -> torch.Tensor:
    """Project onto the unit sphere."""
    return nn.functional.normalize(x, dim=-1, eps=1e-12)


def info_nce(logits: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE (Eq. 2) over [B, B] logits whose diagonal holds the pairs."""
    rows = logits.log_softmax(dim=1).diagonal()
    cols = logits.log_softmax(dim=0).diagonal()
    return -0.5 * (rows.mean() + cols.mean())


def sigmoid_pair_loss(logits: torch.Tensor) -> torch.Tensor:
    """SigLIP's pairwise loss (App. A.3): -1/B sum_{r,s} ln sigmoid(y_rs logits_rs)."""
    signs = 2.0 * torch.eye(logits.shape[0], device=logits.device, dtype=logits.dtype) - 1.0
    return -nn.functional.logsigmoid(signs * logits).sum() / logits.shape[0]


@dataclass(frozen=True)
class Roles:
    """Where a method enters the report beside Table 1, which lists every method."""

    claims: bool = False  # judged in the paper's claims (Tables 1-3) as a probabilistic method
    ablation_of: str | None = None  # in the ablation figure (Fig. 4) beside this method
    uncertainty: bool = True  # False: its uncertainty means nothing; S, R², AUROC ... show "–"


class Method(nn.Module):
    """An ``nn.Module`` on cached frozen embeddings [n, d] (docs/adding-a-method.md): encodings,
    scores [n_text, n_image] (the log-likelihood for probabilistic methods, App. A.2), a per-item
    uncertainty and a batch loss. The base: the frozen model's cosine, no uncertainty, no loss."""

    name: ClassVar[str] = "base"
    trainable: ClassVar[bool] = True  # False: nothing to train, or fitted post hoc
    uncertainty_doc: ClassVar[str] = "none"  # what the uncertainty is, for reports
    roles: ClassVar[Roles] = Roles()  # the paper's tables, figures and claims it enters
    #: Constructor arguments per protocol, e.g. ``{"official": {"init": "default"}}``.
    PROTOCOL_KWARGS: ClassVar[dict[str, dict[str, Any]]] = {}
    OFFICIAL_RAW_IMAGES: ClassVar[bool] = False  # the authors feed raw image projections
    #: Buffers empty until fitted; loading a state dict gives them the saved shape.
    FITTED_BUFFERS: ClassVar[tuple[str, ...]] = ()
    USES_PRE_FEATURES: ClassVar[bool] = False  # split_inputs needs pre-projection features
    protocol: str = "improved"
    calibrate_input: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A built-in method knows its name once defined (before a worker reads the registry)."""
        super().__init_subclass__(**kwargs)
        target = f"{cls.__module__.removeprefix(__package__ + '.')}:{cls.__qualname__}"
        cls.name = _BUILTIN_NAMES.get(target, cls.name)

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def encode(self, side: str, x: torch.Tensor) -> Encoding:
        """The encoding of rows of ``side`` ("text" or "image"): here the unit embeddings."""
        return {"mu": unit(x)}

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return self.encode("text", text_emb)

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return self.encode("image", image_emb)

    def score(self, texts: Encoding, images: Encoding) -> torch.Tensor:
        """[n_text, n_image] retrieval scores (higher = better match)."""
        return texts["mu"] @ images["mu"].T

    def log_likelihood(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """The retrieval score matrix [n_text, n_image] of App. A.2."""
        return self.score(self.encode_texts(text_emb), self.encode_images(image_emb))

    def uncertainty_from(self, enc: Encoding) -> torch.Tensor | None:
        """Per-item uncertainty of an encoding (methods that treat both modalities alike)."""
        return None

    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor | None:
        return self.uncertainty_from(texts)

    image_uncertainty_from = text_uncertainty_from

    def text_uncertainty(self, text_emb: torch.Tensor) -> torch.Tensor | None:
        return self.text_uncertainty_from(self.encode_texts(text_emb))

    def image_uncertainty(self, image_emb: torch.Tensor) -> torch.Tensor | None:
        return self.image_uncertainty_from(self.encode_images(image_emb))

    def kappa(self, text_emb: torch.Tensor) -> torch.Tensor | None:
        """Concentration per caption where the method defines one (vMF/PS), else None."""
        return None

    def loss_features(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor
    ) -> tuple[Encoding, Encoding]:
        """Per-item encodings of a paired batch that :meth:`pair_loss` needs."""
        return self.encode_images(image_emb), self.encode_texts(text_emb)

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        """The batch objective over encodings whose row r is a matched pair."""
        raise NotImplementedError(f"{self.name} has no training loss")

    def loss(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor, *, epoch: int = 0
    ) -> torch.Tensor:
        return self.pair_loss(*self.loss_features(image_emb, text_emb), epoch=epoch)

    def fit_start(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> None:
        """Called once with the training set: calibrates the :class:`Adapter` input scales."""
        if self.calibrate_input:
            for attr, data in (("text_adapter", text_emb), ("image_adapter", image_emb)):
                if isinstance(adapter := getattr(self, attr, None), Adapter):
                    adapter.calibrate(data)

    def fit_posthoc(self, data: SplitTensors) -> None:
        """Fit a method without SGD on the whole training split (default: nothing)."""

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in self.FITTED_BUFFERS:
            saved = state_dict.get(prefix + name)
            if isinstance(saved, torch.Tensor):
                buf = getattr(self, name)
                setattr(self, name, torch.empty(saved.shape, dtype=buf.dtype, device=buf.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def raw_image_input(self) -> bool:
        """Whether this method takes raw image projections (``official`` PFE and ProbVLM)."""
        return self.OFFICIAL_RAW_IMAGES and self.protocol == "official"

    def image_rows(self, image_emb: torch.Tensor, image_norm: torch.Tensor | None) -> torch.Tensor:
        """The image input: ``image_emb * image_norm`` where :attr:`raw_image_input`, else (or
        when the tables have no norm, with one warning) the unit embeddings."""
        if not self.raw_image_input:
            return image_emb
        if image_norm is None:
            if not getattr(self, "_warned_unit_images", False):
                self._warned_unit_images = True
                _log.warning(
                    "%s (protocol official) takes raw image projections, but these tables have "
                    "no image `norm` column: using unit images (re-embed to record the norm)",
                    self.name,
                )
            return image_emb
        return image_emb * image_norm.to(image_emb)[:, None]

    def split_inputs(self, data: SplitTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """(image rows, text rows) of a split for :meth:`encode_images` / :meth:`encode_texts`:
        the one input contract of training, evaluation and scoring (docs/api.md)."""
        return self.image_rows(data.image_emb, data.image_norm), data.text_emb

    def training_stats(self) -> dict[str, float]:
        """Scalars worth logging per epoch: the trained temperature where there is one."""
        temperature = getattr(self, "temperature", None)
        return {"temperature": float(temperature.detach())} if temperature is not None else {}

    def calibration_scale(self) -> float:
        """tau of the predictive softmax(tau * score): the trained temperature, else CLIP's 100."""
        temperature = getattr(self, "temperature", None)
        return float(temperature.detach()) if isinstance(temperature, torch.Tensor) else 100.0
