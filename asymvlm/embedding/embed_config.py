"""One embedding job: :class:`EmbedConfig`, validated on construction, and its fingerprint."""

from __future__ import annotations

import glob
import hashlib
import os
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import ConfigDict, Field, NonNegativeInt, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from asymvlm import storage
from asymvlm.data import perturb
from asymvlm.data.sources import READERS, SourceData
from asymvlm.data.templates import DUMMY_PROMPTS
from asymvlm.embedding.encoders import load_encoder
from asymvlm.embedding.encoders.hub import check_hub_model
from asymvlm.embedding.encoders.names import is_open_clip, local_source, parse_name
from asymvlm.errors import ConfigError

_FINGERPRINT_KEYS = (
    "dataset split sample seed image_perturbation text_perturbation perturbation_seed "
    "shard_size dtype pre_projection"
).split()
PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonEmpty = Annotated[str, Field(min_length=1)]


@dataclass(config=ConfigDict(extra="forbid"))
class EmbedConfig:
    """One embedding job (the CLI flags / the YAML keys), validated on construction; input
    paths are checked by :meth:`check_inputs` when the job starts."""

    dataset: Literal[tuple(sorted(READERS))] = Field(description="the reader")
    model: NonEmpty = Field(
        description="transformers CLIP/SigLIP hub id or folder, or open_clip:ARCH/TAG "
        "(open_clip:ARCH/WEIGHTS-FILE, open_clip:hf-hub:ORG/REPO, open_clip:local-dir:FOLDER)"
    )
    split: str = Field(
        pattern=r"^[^./_\\][^/\\]*$",
        description="the split to read (train, val, test...): a folder under the output",
    )
    output: NonEmpty = Field(description="the tables' root (a folder or s3://...)")
    annotations: str | None = Field(None, description="annotation file or folder (or s3://)")
    images: str | None = Field(None, description="image folder (or s3://)")
    batch_size: PositiveInt = Field(64, description="images per encoder batch")
    num_actors: PositiveInt = Field(1, description="encoder actors (one GPU each on GPUs)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: a GPU if any")
    dtype: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", description="auto: 16 bit on GPU"
    )
    sample: PositiveInt | None = Field(None, description="CC: sample this many pairs (CC-200k)")
    seed: NonNegativeInt = Field(0, description="the sampling seed")
    id_list: str | None = Field(None, description="CC: only the ids in this file")
    shard_size: PositiveInt = Field(2048, description="images per output part file")
    shards_per_round: PositiveInt = Field(8, description="output parts in flight at once")
    decode_cpus: PositiveFloat = Field(1.0, description="CPUs per image-decoding task")
    actor_cpus: PositiveFloat = Field(1.0, description="CPUs per encoder actor")
    dummy_prompts: tuple[str, ...] = Field(
        DUMMY_PROMPTS, description="classification sets: the none-of-the-above prompts (Table 2)"
    )
    image_perturbation: str | None = Field(
        None, description="OOD suite: KIND:SEVERITY (1-5) of the images (asymvlm.data.perturb)"
    )
    text_perturbation: str | None = Field(
        None, description="OOD suite: KIND:SEVERITY (1-5) of the captions (original: clean_text)"
    )
    perturbation_seed: NonNegativeInt = Field(0, description="the perturbations' seed")
    pre_projection: bool = Field(
        False, description="also the pre-projection features (CLIP only; bayesvlm needs them)"
    )

    @field_validator("image_perturbation", "text_perturbation")
    @classmethod
    def _perturbation(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value:
            image = info.field_name == "image_perturbation"
            kinds = perturb.IMAGE_PERTURBATIONS if image else perturb.CAPTION_PERTURBATIONS
            perturb.parse_perturbation(value, kinds)
        return value or None

    def check_inputs(self) -> None:
        """:class:`~asymvlm.errors.ConfigError` naming the key of a local input that does not
        exist (URIs are left to the readers; a ``model`` that is not path-like is a hub id)."""
        check_model(self.model)
        for key in ("annotations", "images", "id_list"):
            value = getattr(self, key)
            if value is None or storage.is_remote(value):
                continue
            path = storage.absolute(value)
            if key == "annotations" and glob.has_magic(path):  # WebDataset shards
                if not glob.glob(path):
                    raise ConfigError(f"{key} {value!r}: no file matches this pattern")
            elif not os.path.exists(path):
                raise ConfigError(f"{key} {value!r}: no such file or directory")
        if self.pre_projection:  # transformers CLIP only
            try:
                load_encoder(self.model, device="cpu", load_model=False).pre_dims()
            except ValueError as err:
                raise ConfigError(f"pre_projection with model {self.model!r}: {err}") from None

    def fingerprint(self, source: SourceData) -> dict[str, Any]:
        """What makes two runs the same job: inputs (absolute, and a hash of the rows read), model,
        precision, perturbations, sampling and shard size (docs/data.md)."""
        fp: dict[str, Any] = {k: getattr(self, k) for k in _FINGERPRINT_KEYS}
        fp["model"] = normalised_model(self.model)
        for key in ("annotations", "images", "id_list"):
            fp[key] = getattr(self, key) and storage.absolute(getattr(self, key))
        digest = hashlib.sha256()
        for table in (source.images, source.captions, source.prompts):
            sink = pa.BufferOutputStream()
            if table is not None:
                with pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table.combine_chunks())
            digest.update(sink.getvalue().to_pybytes() or b"\0none")
        fp.update(
            n_images=source.images.num_rows,
            n_captions=source.captions.num_rows,
            source_sha256=digest.hexdigest(),
            dummy_prompts=list(self.dummy_prompts) if source.prompts is not None else None,
        )
        return fp


def check_model(model: str) -> None:
    """:class:`ConfigError` when the encoder of ``model`` cannot be had here (a malformed
    ``open_clip:`` name, missing local files, or a Hub model neither cached nor served)."""
    try:
        local = local_source(model)
    except ValueError as err:  # a malformed open_clip name
        raise ConfigError(f"model: {err}") from None
    if local is not None and not os.path.exists(local):
        raise ConfigError(f"model {model!r}: no such file or directory")
    try:
        check_hub_model(model)
    except ValueError as err:
        raise ConfigError(f"model {err}") from None


def normalised_model(model: str) -> str:
    """A model name in one spelling: local folders absolute, open_clip names canonical, hub ids."""
    if is_open_clip(model):
        return parse_name(model).name
    local = local_source(model)
    return model if local is None else os.path.normpath(local)
