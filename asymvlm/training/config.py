"""Training hyper-parameters (:class:`TrainConfig`) and where training runs (devices, autocast)."""

from __future__ import annotations

import re
from dataclasses import field
from typing import Annotated, Any, Literal

import torch
from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from asymvlm.errors import ConfigError
from asymvlm.methods import check_method_name
from asymvlm.methods.official import optimizer_defaults

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


@pydantic_dataclass(config=ConfigDict(extra="forbid"))
class TrainConfig:
    """Hyper-parameters; defaults are the paper's protocol (App. B.4, Table A.1).

    ``protocol``: ``improved`` (this project's defaults) or ``official`` (the authors' code:
    architecture, init, loss form, uncertainty and the per-method optimiser defaults of their
    train.py); README "Protocols" lists every difference.

    Validated on construction (pydantic): unknown fields, wrong types and out-of-range values
    (epochs < 1, lr <= 0 or NaN, batch < 1, unknown method/optimizer ...) raise
    :class:`pydantic.ValidationError`, which every entry point reports as one line
    (:func:`asymvlm.config.validation_message`).
    """

    method: str = "asymvlm-vmf"
    protocol: Literal["improved", "official"] = "improved"
    epochs: Annotated[int, Field(ge=1)] = 200
    # None: the protocol's default for the method (asymvlm.methods.official.optimizer_defaults)
    lr: PositiveFloat | None = None
    optimizer: Literal["sgd", "adamw"] | None = None  # SGD with momentum, or AdamW
    momentum: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = None
    weight_decay: NonNegativeFloat | None = None
    batch_size: Annotated[int, Field(ge=1)] = 2048
    min_lr: NonNegativeFloat = 1e-6
    # None: the method's architecture under the protocol (1024 wide, 3 hidden layers, except
    # the official ProbVLM backbone's 2)
    hidden_dim: Annotated[int, Field(ge=1)] | None = None
    depth: Annotated[int, Field(ge=1)] | None = None
    seed: Annotated[int, Field(ge=0)] = 0
    adapter_input: Literal["raw", "unit"] = "raw"  # raw = embedding * norm (official)
    device: str = "auto"  # "auto" = cuda when available
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on cuda
    method_kwargs: dict[str, Any] = field(default_factory=dict)
    # Tables bigger than memory (asymvlm.training.stream, docs/streaming.md): "auto" streams the
    # training captions from the parquet parts when the split's float32 size exceeds
    # stream_memory_bytes (None: a share of the free memory, stream.memory_budget).
    stream: Literal["auto", "always", "never"] = "auto"
    stream_memory_bytes: Annotated[int, Field(ge=0)] | None = None
    shuffle_buffer: Annotated[int, Field(ge=0)] = 65536  # rows mixed across parts when streaming

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        return check_method_name(value)

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {value!r}")
        return value

    def __post_init__(self) -> None:
        """Fill the optimiser settings left None with the protocol's defaults for the method."""
        for key, value in optimizer_defaults(self.method, self.protocol).items():
            if getattr(self, key) is None:
                setattr(self, key, value)

    def method_args(self) -> dict[str, Any]:
        """``build_method`` arguments: the protocol, the sizes that were set, method_kwargs."""
        sizes = {k: getattr(self, k) for k in ("hidden_dim", "depth") if getattr(self, k)}
        return {"protocol": self.protocol, **sizes, **self.method_kwargs}


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` = CUDA when available; an explicit device that this machine lacks is a
    :class:`~asymvlm.errors.ConfigError`."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not _DEVICE.match(device):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {device}: only {torch.cuda.device_count()} GPU(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available on this machine")
    return dev


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``precision`` on ``device`` (None: full fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
