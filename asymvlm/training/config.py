"""Training hyper-parameters (:class:`TrainConfig`) and where training runs (devices, autocast)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from asymvlm.errors import ConfigError
from asymvlm.methods import check_method_name
from asymvlm.methods.official import optimizer_defaults

__all__ = ["TrainConfig", "autocast_dtype", "resolve_device"]

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: The optimiser settings whose default depends on the method and protocol.
OPTIMIZER_KEYS = ("optimizer", "lr", "momentum", "weight_decay")


class TrainConfig(BaseModel):
    """Hyper-parameters of one training run; defaults are the paper's protocol (App. B.4,
    Table A.1). ``protocol: official`` follows the authors' code (README "Protocols"); optimiser
    settings left unset (:data:`OPTIMIZER_KEYS`) take the protocol's defaults for the method.
    Validated (pydantic) and frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = Field("asymvlm-vmf", description="method name (`asymvlm methods` lists them)")
    protocol: Literal["improved", "official"] = Field(
        "improved",
        description="official = the authors' code for the method (architecture, init, loss, "
        "uncertainty, optimiser defaults); improved = this project's (README 'Protocols')",
    )
    epochs: Annotated[int, Field(ge=1)] = Field(200, description="passes over the data")
    lr: PositiveFloat | None = Field(
        None,
        description="peak learning rate (default: the protocol's for the method; improved: 1e-2)",
    )
    optimizer: Literal["sgd", "adamw"] | None = Field(
        None,
        description="sgd with momentum or adamw (default: the protocol's for the method; "
        "improved: sgd, as the paper)",
    )
    momentum: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = Field(
        None, description="SGD momentum (default: 0.9)"
    )
    weight_decay: NonNegativeFloat | None = Field(
        None,
        description="L2 weight decay (default: the protocol's for the method; improved: 5e-4)",
    )
    batch_size: Annotated[int, Field(ge=1)] = Field(
        2048, description="pairs per step (the global batch of the contrastive loss)"
    )
    min_lr: NonNegativeFloat = Field(1e-6, description="end of the cosine schedule")
    hidden_dim: Annotated[int, Field(ge=1)] | None = Field(
        None, description="width of the adapter's hidden layers (default: 1024)"
    )
    depth: Annotated[int, Field(ge=1)] | None = Field(
        None, description="hidden layers (default: 3; the official ProbVLM backbone: 2)"
    )
    seed: Annotated[int, Field(ge=0)] = Field(0, description="initialisation and order")
    adapter_input: Literal["raw", "unit"] = Field(
        "raw",
        description="raw = unnormalised text projection (embedding * norm), as the official code",
    )
    device: str = Field(
        "auto", pattern=_DEVICE.pattern, description="cpu, cuda, cuda:1 ... or auto (cuda if any)"
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 autocast on CUDA, fp32 on CPU"
    )
    method_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra method constructor arguments"
    )
    stream: Literal["auto", "always", "never"] = Field(
        "auto",
        description="stream the training captions from the parquet parts instead of loading "
        "the split (docs/streaming.md); auto: when the split's float32 size exceeds "
        "stream_memory_bytes",
    )
    stream_memory_bytes: Annotated[int, Field(ge=0)] | None = Field(
        None,
        description="auto streams above this many bytes (default: a quarter of the free "
        "memory, at most half the free GPU memory)",
    )
    shuffle_buffer: Annotated[int, Field(ge=0)] = Field(
        65536, description="rows mixed across parts when streaming"
    )

    @model_validator(mode="before")
    @classmethod
    def _protocol_defaults(cls, data: Any) -> Any:
        """Fill the optimiser settings left unset with the protocol's defaults for the method."""
        if not isinstance(data, dict):
            return data
        method, protocol = data.get("method") or "asymvlm-vmf", data.get("protocol") or "improved"
        defaults = optimizer_defaults(str(method), str(protocol))
        return {**data, **{k: defaults[k] for k in OPTIMIZER_KEYS if data.get(k) is None}}

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        return check_method_name(value)

    def method_args(self) -> dict[str, Any]:
        """``build_method`` arguments."""
        sizes = {k: getattr(self, k) for k in ("hidden_dim", "depth") if getattr(self, k)}
        return {"protocol": self.protocol, **sizes, **self.method_kwargs}


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` = CUDA when available; a device this machine lacks is a ConfigError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not _DEVICE.match(device):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ConfigError(f"--device {device}: CUDA is not available on this machine ({n} GPUs)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available on this machine")
    return dev


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``precision`` on ``device`` (None: full fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
