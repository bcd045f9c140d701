"""Publish an artifact to the Hugging Face Hub with huggingface_hub.

The token comes from HF_TOKEN or the Hugging Face token cache and is never printed or written;
artifacts that failed or skipped verification are refused."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import OfflineError, QuantkitError

EXCLUDE = [".*", "**/.*", "*.partial-*"]


def check_publishable(artifact: Path) -> dict:
    meta_file = artifact / "quantkit.json"
    if not artifact.is_dir() or not meta_file.is_file():
        raise QuantkitError(f"{artifact}: not a quantkit artifact (no quantkit.json); only verified artifacts are published")
    meta = json.loads(meta_file.read_text())
    status = (meta.get("verification") or {}).get("status")
    if status != "passed":
        raise QuantkitError(f"{artifact}: verification {status or 'was skipped'}; refusing to publish an unverified artifact")
    if not (artifact / "README.md").is_file():
        raise QuantkitError(f"{artifact}: no model card (README.md)")
    return meta


def plan(artifact: Path) -> list[dict]:
    files = sorted(p for p in artifact.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(artifact).parts))
    return [{"path": str(p.relative_to(artifact)), "bytes": p.stat().st_size} for p in files]


def resolve_token() -> str:
    from huggingface_hub import get_token

    token = get_token()  # HF_TOKEN, then the cached login
    if not token:
        raise QuantkitError("no Hugging Face token: set HF_TOKEN or run `hf auth login`")
    return token


def publish(artifact: Path, repo: str, *, private: bool = False, revision: str | None = None, api=None) -> dict:
    """Create the repo if needed and upload the artifact folder; returns the commit URL."""
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    check_publishable(artifact)
    if "/" not in repo or repo.count("/") != 1:
        raise QuantkitError(f"--repo {repo!r}: expected ORG/NAME")
    token = resolve_token()
    api = api or HfApi(token=token)
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        if revision:
            api.create_branch(repo, branch=revision, exist_ok=True)
        info = api.upload_folder(repo_id=repo, folder_path=str(artifact), revision=revision, repo_type="model",
                                 commit_message="Upload quantized artifact (quantkit)", ignore_patterns=EXCLUDE)
    except HfHubHTTPError as exc:
        code = getattr(getattr(exc, "response", None), "status_code", None)
        raise QuantkitError(f"the Hub refused the upload to {repo} (HTTP {code}): check the token's write access") from None
    except (ConnectionError, OSError, httpx.TransportError) as exc:
        raise OfflineError(f"cannot reach the Hugging Face Hub ({type(exc).__name__}); publish needs the network") from None
    return {"repo": repo, "revision": revision or "main", "commit_url": str(getattr(info, "commit_url", info))}
