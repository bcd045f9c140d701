"""The one resolver of model arguments: every command that takes a model (convert --model, eval
MODEL and --baseline, bench MODELS, export ARTIFACT, sensitivity MODEL, run --model, publish
ARTIFACT) accepts the same forms through it:

- a named model ("demo"), built into the cache on first use (`quantkit models pull`);
- a directory: a Hugging Face checkpoint, or a quantkit artifact (the same, with quantkit.json);
- a GGUF file, where the command runs GGUF files (eval and bench on llama.cpp);
- a hub id (ORG/NAME), downloaded when online.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

from quantkit.errors import ModelError, OfflineError
from quantkit.models.checkpoint import check_checkpoint
from quantkit.models.named_models import NAMED_MODELS, is_complete, named_model_dir, pull_named

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
GGUF_MAGIC = b"GGUF"
META = "quantkit.json"  # an artifact's own record (artifacts/staging.py writes it)


@dataclass(frozen=True)
class ModelRef:
    """What a model argument names."""

    given: str
    path: Path  # a checkpoint directory, or a GGUF file
    gguf: bool = False
    named: str | None = None  # the named model it is, if any

    @property
    def artifact(self) -> bool:
        """A directory quantkit converted (its quantkit.json beside config.json)."""
        return not self.gguf and (self.path / META).is_file()


def resolve_model(
    ref: str | os.PathLike, *, gguf: bool = False, pull: bool = True, allow_pickle: bool = False, check: bool = True
) -> ModelRef:
    """A model argument -> a ModelRef, or one line saying why it names no model. `gguf`: the
    command also runs GGUF files; `pull`: a named model not built yet is built now; `check`: a
    directory's config and weights are checked now (export and publish check an artifact against
    its sha256 manifest first, which names a tampered file better)."""
    given = str(ref)
    if given in NAMED_MODELS:
        path = named_model_dir(given)
        if not is_complete(path):
            if not pull:
                raise ModelError(f"model {given!r} is not pulled yet: run `quantkit models pull {given}`")
            path = pull_named(given)
        return ModelRef(given, path, named=given)
    path = Path(given).expanduser()
    if path.is_file() or (path.suffix.lower() == ".gguf" and not path.exists()):
        return ModelRef(given, _gguf_file(path, given, gguf), gguf=True)
    if path.exists():
        if check:
            check_checkpoint(path, allow_pickle=allow_pickle)
        return ModelRef(given, path.resolve())
    if _HUB_ID.match(given):
        return ModelRef(given, _download(given, allow_pickle=allow_pickle))
    names = ", ".join(NAMED_MODELS)
    raise ModelError(f"{given}: no such file or directory, and not a hub id (ORG/NAME) or a named model ({names})")


def resolve_path(ref: str | os.PathLike, **kw) -> Path:
    return resolve_model(ref, **kw).path


def _gguf_file(path: Path, given: str, takes_gguf: bool) -> Path:
    if not takes_gguf:
        raise ModelError(
            f"{given}: a file; this command takes a checkpoint or artifact directory (or a named model such as "
            f"{next(iter(NAMED_MODELS))}); GGUF files run in `eval`/`bench --engine llamacpp`"
        )
    if not path.is_file():
        raise ModelError(f"{given}: no such GGUF file")
    with open(path, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise ModelError(f"{given}: not a GGUF file (it does not start with the GGUF magic) and not a directory")
    return path.resolve()


def _download(repo_id: str, allow_pickle: bool) -> Path:
    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
    if allow_pickle:
        patterns.append("*.bin")
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise ModelError(f"{repo_id}: no such model on the Hugging Face Hub (or it is gated/private)") from None
    except LocalEntryNotFoundError:
        raise OfflineError(
            f"{repo_id}: cannot download from the Hugging Face Hub (offline or unreachable) and it is not in the "
            "local cache; pass a local checkpoint directory instead"
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        raise OfflineError(
            f"{repo_id}: download failed ({type(exc).__name__}); pass a local checkpoint directory"
        ) from None
    check_checkpoint(path, allow_pickle=allow_pickle)
    return path
