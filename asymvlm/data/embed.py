"""One embedding job: :class:`EmbedConfig`, validated on construction, and its fingerprint."""

from __future__ import annotations

import glob
import hashlib
import os
import re
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from asymvlm.data.encoder.names import is_open_clip, local_source, parse_name
from asymvlm.data.sources import READERS, SourceData
from asymvlm.errors import ConfigError

DUMMY_PROMPTS = ("a photo", "a photo of an object", "a photo of something")
_FINGERPRINT_KEYS = (
    "dataset split sample seed image_perturbation text_perturbation perturbation_seed "
    "shard_size dtype pre_projection"
).split()
PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonEmpty = Annotated[str, Field(min_length=1)]


@dataclass(config=ConfigDict(extra="forbid"))
class EmbedConfig:
    """One embedding job (the CLI flags / the YAML keys), validated on construction; input
    paths are checked by :meth:`check_inputs` when the job starts."""

    dataset: str = Field(description="the reader: " + ", ".join(sorted(READERS)))
    model: NonEmpty = Field(
        description="transformers CLIP/SigLIP hub id or folder, or open_clip:ARCH/TAG "
        "(open_clip:ARCH/WEIGHTS-FILE, open_clip:hf-hub:ORG/REPO, open_clip:local-dir:FOLDER)"
    )
    split: NonEmpty = Field(description="the split to read (train, val, test...)")
    output: NonEmpty = Field(description="the tables' root (a folder or s3://...)")
    annotations: str | None = Field(None, description="annotation file or folder (or s3://)")
    images: str | None = Field(None, description="image folder (or s3://)")
    batch_size: PositiveInt = Field(64, description="images per encoder batch")
    num_actors: PositiveInt = Field(1, description="encoder actors (one GPU each on GPUs)")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: a GPU when the cluster has one"
    )
    dtype: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", description="auto: bf16/fp16 on GPU, fp32 on CPU"
    )
    sample: PositiveInt | None = Field(None, description="CC: sample this many pairs (CC-200k)")
    seed: NonNegativeInt = Field(0, description="the sampling seed")
    id_list: str | None = Field(None, description="CC: only the ids in this file")
    shard_size: PositiveInt = Field(2048, description="images per output part file")
    shards_per_round: PositiveInt = Field(
        8, description="output parts in flight at once (memory vs. throughput)"
    )
    decode_cpus: PositiveFloat = Field(1.0, description="CPUs per image-decoding task")
    actor_cpus: PositiveFloat = Field(1.0, description="CPUs per encoder actor")
    dummy_prompts: tuple[str, ...] = Field(
        DUMMY_PROMPTS,
        description="classification sets: the none-of-the-above prompts "
        "embedded beside the class prompts (Table 2)",
    )
    image_perturbation: str | None = Field(
        None,
        description="OOD suite: perturb images first, KIND:SEVERITY (gaussian_noise, "
        "rotation, zoom_blur, jpeg, low_resolution; severity 1-5)",
    )
    text_perturbation: str | None = Field(
        None,
        description="OOD suite: perturb captions first, KIND:SEVERITY (typos, "
        "word_order, synonyms, casing; severity 1-5); the original stays in clean_text",
    )
    perturbation_seed: NonNegativeInt = Field(0, description="the perturbations' seed")
    pre_projection: bool = Field(
        False,
        description="also write the pre-projection features and ROOT/projection.npz "
        "(CLIP only), which the bayesvlm method needs",
    )

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if value not in READERS:
            raise ValueError(f"unknown data set {value!r}; known: {', '.join(sorted(READERS))}")
        return value

    @field_validator("split")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        if "/" in value or "\\" in value or value.startswith((".", "_")):
            raise ValueError(
                f"split {value!r} names a folder under the output: no '/', no leading '.' or '_'"
            )
        return value

    @field_validator("image_perturbation", "text_perturbation")
    @classmethod
    def _perturbation(cls, value: str | None, info: ValidationInfo) -> str | None:
        from asymvlm.data import perturb

        kinds = (
            perturb.IMAGE_PERTURBATIONS
            if info.field_name == "image_perturbation"
            else perturb.CAPTION_PERTURBATIONS
        )
        if value:
            perturb.parse_perturbation(value, kinds)
        return value or None

    def check_inputs(self) -> None:
        """:class:`~asymvlm.errors.ConfigError` naming the key of a local input that does not
        exist (URIs are left to the readers; a ``model`` that is not path-like is a hub id)."""
        check_model(self.model)
        for key in ("annotations", "images", "id_list"):
            value = getattr(self, key)
            if value is None or "://" in value and not value.lower().startswith("file://"):
                continue
            path = os.path.expanduser(value.removeprefix("file://"))
            if key == "annotations" and glob.has_magic(path):  # WebDataset shards
                if not glob.glob(path):
                    raise ConfigError(f"{key} {value!r}: no file matches this pattern")
            elif not os.path.exists(path):
                raise ConfigError(f"{key} {value!r}: no such file or directory")
        if self.pre_projection:  # transformers CLIP only
            from asymvlm.data.encoder import load_encoder

            try:
                load_encoder(self.model, device="cpu", load_model=False).pre_dims()
            except ValueError as err:
                raise ConfigError(f"pre_projection with model {self.model!r}: {err}") from None

    def fingerprint(self, source: SourceData) -> dict[str, Any]:
        """What makes two runs the same job (output location and scheduling excluded): the
        inputs (normalised locations and a hash of the rows read from them), the model and its
        precision, perturbations, sampling and the shard size."""
        fp: dict[str, Any] = {k: getattr(self, k) for k in _FINGERPRINT_KEYS}
        for key in ("model", "annotations", "images", "id_list"):  # locations, in one spelling
            fp[key] = normalised_location(getattr(self, key), model=key == "model")
        fp.update(
            n_images=source.images.num_rows,
            n_captions=source.captions.num_rows,
            source_sha256=_source_digest(source, self._roots()),
            dummy_prompts=list(self.dummy_prompts) if source.prompts is not None else None,
        )
        return fp

    def _roots(self) -> list[str]:
        """The locations, as written, that readers prefix to image paths."""
        roots = [r.rstrip("/") for r in (self.images, self.annotations) if r]
        if self.annotations:
            roots[-1] = roots[-1].rpartition("/")[0]
        return sorted({r for r in roots if r}, key=len, reverse=True)


def check_model(model: str) -> None:
    """:class:`ConfigError` when the encoder of ``model`` cannot be had here (a malformed
    ``open_clip:`` name, missing local files, or a Hub model neither cached nor served)."""
    from asymvlm.data.encoder.hub import check_hub_model

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


def normalised_location(value: str | None, model: bool = False) -> str | None:
    """A location in one spelling: local paths absolute and normalised (``file://`` URIs too),
    other URIs without a trailing slash; hub model ids and open_clip tags as they are."""
    if value is None:
        return None
    if model:
        local = local_source(value)
        if is_open_clip(value) or local is None:
            return parse_name(value).name if is_open_clip(value) else value
        return os.path.normpath(local)
    if "://" in value and not value.lower().startswith("file://"):
        return value.rstrip("/") or value
    return os.path.normpath(os.path.abspath(os.path.expanduser(value[7 * ("://" in value) :])))


def _source_digest(source: SourceData, roots: list[str]) -> str:
    """SHA-256 of the rows read (their Arrow IPC bytes), image paths below ``roots`` written
    ``<root>/...`` so that relative and absolute spellings of one input agree."""
    import pyarrow.compute as pc

    digest = hashlib.sha256()
    for table in (source.images, source.captions, source.prompts):
        if table is None:
            digest.update(b"\0none")
            continue
        if table is source.images:
            path = table["path"]
            for root in roots:
                path = pc.replace_substring_regex(path, "^" + re.escape(root) + "/", "<root>/")
            table = table.set_column(table.schema.get_field_index("path"), "path", path)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.combine_chunks())
        digest.update(sink.getvalue())
    return digest.hexdigest()
