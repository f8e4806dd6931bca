"""Checkpoint folders (:mod:`.folder`: layout, atomic writes, whether an output may be written or
resumed) and adapters shared as model folders (:mod:`.sharing`: from a folder, an MLflow model or
``hf-hub:ORG/REPO[@REVISION]``; exported as a Hugging Face model folder)."""

from asymvlm.checkpoints.folder import (
    MEMBER_FOLDER,
    RunState,
    check_output,
    check_resumable,
    checkpoint_to_resume,
    copy_adapter,
    discard_checkpoint,
    load_checkpoint,
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
)
from asymvlm.checkpoints.sharing import export_adapter, is_model_uri, resolve_checkpoint

__all__ = [
    "MEMBER_FOLDER",
    "RunState",
    "check_output",
    "check_resumable",
    "checkpoint_to_resume",
    "copy_adapter",
    "discard_checkpoint",
    "export_adapter",
    "is_model_uri",
    "load_checkpoint",
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
]
