"""Checkpoint folders (:mod:`.folder`), whether an output may be written or resumed
(:mod:`.resume`), where an adapter comes from (:mod:`.sources`: a folder, an MLflow model,
``hf-hub:ORG/REPO[@REVISION]``) and its export as a Hugging Face model folder (:mod:`.export`)."""

from asymvlm.checkpoints.card import model_card  # noqa: F401
from asymvlm.checkpoints.export import EXPORT_FILES, export_adapter  # noqa: F401
from asymvlm.checkpoints.folder import (  # noqa: F401
    ADAPTER_FILES,
    CARD_FILE,
    CHECKPOINT_FILES,
    CONFIG_FILE,
    EXPORT_FORMAT,
    HASHES_KEY,
    HISTORY_FILE,
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
)
from asymvlm.checkpoints.resume import (  # noqa: F401
    RESUME_MAY_DIFFER,
    check_output,
    check_resumable,
    checkpoint_to_resume,
)
from asymvlm.checkpoints.sources import (  # noqa: F401
    HUB_PREFIX,
    check_model_folder,
    is_hub_name,
    is_model_uri,
    parse_hub_name,
    resolve_checkpoint,
)
