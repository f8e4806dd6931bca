"""Checkpoint folders: the one owner of their layout, for every writer and reader.

* :mod:`~asymvlm.checkpoints.folder` -- the files (``config.json``, ``model.safetensors``,
  ``history.jsonl``, ``trainer.pt``; a pack's state and member folders), written as a whole
  (:func:`publish_folder`) and read back (:func:`load_checkpoint`, :func:`read_run_state`);
* :mod:`~asymvlm.checkpoints.resume` -- whether an output folder may be written or continued;
* :mod:`~asymvlm.checkpoints.sources` -- a folder, an MLflow model URI or a Hub model
  (``hf-hub:ORG/REPO[@REVISION]``) to a local folder; model folders checked (no pickle, hashes);
* :mod:`~asymvlm.checkpoints.export` -- a checkpoint as a Hugging Face model folder
  (``model.safetensors``, ``config.json``, a ``README.md`` model card: ``asymvlm export``).
"""

from asymvlm.checkpoints.card import model_card
from asymvlm.checkpoints.export import EXPORT_FILES, export_adapter
from asymvlm.checkpoints.folder import (
    ADAPTER_FILES,
    CARD_FILE,
    CHECKPOINT_FILES,
    CONFIG_FILE,
    EXPORT_FORMAT,
    HASHES_KEY,
    HISTORY_FILE,
    LEGACY_WEIGHTS_FILE,
    MEMBER_FOLDER,
    PACK_STATE_FILE,
    TRAINER_FILE,
    WEIGHTS_FILE,
    RunState,
    check_hashes,
    copy_adapter,
    discard_checkpoint,
    file_sha256,
    load_checkpoint,
    member_folder,
    provenance,
    publish_folder,
    read_checkpoint_meta,
    read_history,
    read_pack_state,
    read_run_state,
    recover_checkpoint,
    save_checkpoint,
    save_pack_checkpoint,
    save_run_checkpoint,
    weights_file,
)
from asymvlm.checkpoints.resume import (
    RESUME_MAY_DIFFER,
    check_output,
    check_resumable,
    checkpoint_to_resume,
)
from asymvlm.checkpoints.sources import (
    HUB_PREFIX,
    check_model_folder,
    is_hub_name,
    is_model_uri,
    parse_hub_name,
    resolve_checkpoint,
)

__all__ = [
    "ADAPTER_FILES",
    "CARD_FILE",
    "CHECKPOINT_FILES",
    "CONFIG_FILE",
    "EXPORT_FILES",
    "EXPORT_FORMAT",
    "HASHES_KEY",
    "HISTORY_FILE",
    "HUB_PREFIX",
    "LEGACY_WEIGHTS_FILE",
    "MEMBER_FOLDER",
    "PACK_STATE_FILE",
    "RESUME_MAY_DIFFER",
    "TRAINER_FILE",
    "WEIGHTS_FILE",
    "RunState",
    "check_hashes",
    "check_model_folder",
    "check_output",
    "check_resumable",
    "checkpoint_to_resume",
    "copy_adapter",
    "discard_checkpoint",
    "export_adapter",
    "file_sha256",
    "is_hub_name",
    "is_model_uri",
    "load_checkpoint",
    "member_folder",
    "model_card",
    "parse_hub_name",
    "provenance",
    "publish_folder",
    "read_checkpoint_meta",
    "read_history",
    "read_pack_state",
    "read_run_state",
    "recover_checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
    "save_pack_checkpoint",
    "save_run_checkpoint",
    "weights_file",
]
