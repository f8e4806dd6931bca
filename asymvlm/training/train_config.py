"""A training run's hyper-parameters (paper App. B.4, Table A.1): :class:`TrainConfig`. No
torch here, so the command line builds its flags from it quickly; validators load the registry."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]
#: The optimiser settings whose default depends on the method and protocol.
OPTIMIZER_KEYS = ("optimizer", "lr", "momentum", "weight_decay")
_DEFAULT = "default: the protocol's for the method; improved:"


class TrainConfig(BaseModel):
    """Hyper-parameters of one training run; defaults are the paper's protocol (App. B.4,
    Table A.1). ``protocol: official`` follows the authors' code (README "Protocols"); optimiser
    settings left unset (:data:`OPTIMIZER_KEYS`) take the protocol's defaults for the method."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = Field("asymvlm-vmf", description="method name (`asymvlm methods` lists them)")
    protocol: Literal["improved", "official"] = Field(
        "improved", description="official: the authors' code; improved: this project's (README)"
    )
    epochs: Count = Field(200, description="passes over the data")
    lr: PositiveFloat | None = Field(None, description=f"peak learning rate ({_DEFAULT} 1e-2)")
    optimizer: Literal["sgd", "adamw"] | None = Field(
        None, description=f"sgd or adamw ({_DEFAULT} sgd)"
    )
    momentum: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = Field(
        None, description="SGD momentum (default: 0.9)"
    )
    weight_decay: NonNegativeFloat | None = Field(None, description=f"L2 ({_DEFAULT} 5e-4)")
    batch_size: Count = Field(2048, description="pairs per step (the global contrastive batch)")
    min_lr: NonNegativeFloat = Field(1e-6, description="end of the cosine schedule")
    hidden_dim: Count | None = Field(None, description="adapter hidden width (default: 1024)")
    depth: Count | None = Field(None, description="hidden layers (default: 3; official ProbVLM: 2)")
    seed: Annotated[int, Field(ge=0)] = Field(0, description="initialisation and order")
    adapter_input: Literal["raw", "unit"] = Field(
        "raw",
        description="raw: the unnormalised text projection (embedding * norm); unit: the unit "
        "embedding (used, and recorded, for a text table without `norm` unless raw is given)",
    )
    device: str = Field("auto", pattern=DEVICE.pattern, description="cpu, cuda, cuda:1 or auto")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 autocast on CUDA, fp32 on CPU"
    )
    method_kwargs: dict[str, Any] = Field(
        {}, description="the method's own arguments (`asymvlm methods NAME` lists them)"
    )
    stream: Literal["auto", "always", "never"] = Field(
        "auto", description="stream the captions from the parquet parts (docs/streaming.md)"
    )
    stream_memory_bytes: Annotated[int, Field(ge=0)] | None = Field(
        None, description="auto streams above this (default: a share of the free memory)"
    )
    shuffle_buffer: Annotated[int, Field(ge=0)] = Field(65536, description="rows mixed in streams")

    @model_validator(mode="before")
    @classmethod
    def _protocol_defaults(cls, data: Any) -> Any:
        """Fill the optimiser settings left unset with the protocol's defaults for the method."""
        if not isinstance(data, dict):
            return data
        from asymvlm.methods.official import optimizer_defaults

        method, protocol = data.get("method") or "asymvlm-vmf", data.get("protocol") or "improved"
        defaults = optimizer_defaults(str(method), str(protocol))
        return {**data, **{k: defaults[k] for k in OPTIMIZER_KEYS if data.get(k) is None}}

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        from asymvlm.methods import check_method_name

        return check_method_name(value)

    @field_validator("method_kwargs")
    @classmethod
    def _method_kwargs(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """The method's own arguments, converted to the types its constructor declares."""
        from asymvlm.methods import check_method_kwargs

        method = info.data.get("method")
        return value if method is None else check_method_kwargs(method, value)

    def method_args(self) -> dict[str, Any]:
        """``build_method`` arguments."""
        sizes = {k: getattr(self, k) for k in ("hidden_dim", "depth") if getattr(self, k)}
        return {"protocol": self.protocol, **sizes, **self.method_kwargs}
