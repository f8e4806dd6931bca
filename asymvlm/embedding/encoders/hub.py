"""Whether a Hugging Face Hub model can be had here, asked once by the driver (torch-free)."""

from __future__ import annotations

import os

from asymvlm.embedding.encoders.names import is_open_clip, local_source, parse_name

_OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
_HINT = (
    "download it where there is internet and give its folder as {flag}, or point HF_HOME at a "
    "Hugging Face cache that holds it"
)


def hub_files(model: str) -> tuple[str, tuple[str, ...]] | None:
    """(repository, files of which one must be fetchable) for a model the encoders would
    fetch from the Hub; None for local files and open_clip tags whose weights come from a URL."""
    if not is_open_clip(model):
        return None if local_source(model) is not None else (model, ("config.json",))
    name = parse_name(model)
    if name.local is not None:
        return None
    if name.pretrained is None:  # hf-hub:ORG/REPO
        return name.model_name.removeprefix("hf-hub:"), ("open_clip_config.json",)
    from open_clip.pretrained import get_pretrained_cfg

    hub = (get_pretrained_cfg(name.model_name, name.pretrained) or {}).get("hf_hub", "")
    if hub.endswith("/"):  # 'org/model/': the repository, open_clip's default file names
        return hub.rstrip("/"), _OPEN_CLIP_WEIGHTS
    repo, filename = os.path.split(hub)
    return (repo, (filename,)) if hub else None


def check_hub_model(model: str, flag: str = "--model (model: in a config)") -> None:
    """ValueError saying why ``model`` cannot be had here (not in the Hugging Face cache, and the
    Hub does not answer or have it), naming the ``flag`` that takes a folder; none if local."""
    found = hub_files(model)
    if found is None:
        return
    repo, files = found
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    if any(isinstance(try_to_load_from_cache(repo, f), str) for f in files):
        return
    where, hint = f"the Hugging Face cache ({constants.HF_HUB_CACHE})", _HINT.format(flag=flag)
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"{model!r} is not in {where} and HF_HUB_OFFLINE is set; {hint}")
    for filename in files:
        try:
            get_hf_file_metadata(hf_hub_url(repo, filename))
            return
        except EntryNotFoundError:
            continue
        except GatedRepoError:
            why = f"the Hub repository {repo!r} is gated; accept its terms and log in"
            raise ValueError(f"{model!r}: {why} (hf auth login)") from None
        except RepositoryNotFoundError:
            why = f"the Hub has no repository {repo!r} (or it is private: log in with"
            raise ValueError(f"{model!r}: {why} hf auth login)") from None
        except Exception as err:  # no connection, a proxy, an expired token...
            reason = " ".join(str(err).split())[:300] or type(err).__name__
            why = f"is not in {where} and the Hub cannot be asked for it ({reason}); {hint}"
            raise ValueError(f"{model!r} {why}") from None
    raise ValueError(
        f"{model!r}: the Hub repository {repo!r} has none of {', '.join(files)} "
        "(is the name right?)"
    )
