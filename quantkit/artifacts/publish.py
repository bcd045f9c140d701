"""Publish an artifact to the Hugging Face Hub with huggingface_hub.

The token comes from HF_TOKEN or the Hugging Face token cache and is never printed or written.
Only an artifact `quantkit convert` wrote and verified is published, and only when every file
still has the sha256 and size recorded at conversion (`files` in quantkit.json), with no extra,
missing or symlinked file: a flag in quantkit.json alone proves nothing.
"""

from __future__ import annotations

import glob
from pathlib import Path

import httpx
from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError
from huggingface_hub.utils import validate_repo_id

from quantkit.artifacts.staging import read_meta, verification_problem
from quantkit.core.integrity import check
from quantkit.errors import OfflineError, QuantkitError

EXCLUDE = [".*", "**/.*", "*.partial-*"]


def check_repo(repo: str) -> str:
    """ORG/NAME, by huggingface_hub's own rules (the same check for --dry-run and the upload)."""

    if not isinstance(repo, str) or repo.count("/") != 1:
        raise QuantkitError(f"--repo {repo!r}: expected ORG/NAME")
    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise QuantkitError(f"--repo {repo!r}: not a valid Hub repo id ({str(exc).split(':')[0]})") from None
    return repo


def check_publishable(artifact: Path) -> dict:
    """The artifact's metadata once it is known to be verified and intact (every byte re-hashed)."""

    artifact = Path(artifact)
    if not artifact.is_dir() or not (artifact / "quantkit.json").is_file():
        raise QuantkitError(
            f"{artifact}: not a quantkit artifact (no quantkit.json); only verified artifacts are published"
        )
    if (artifact / "quantkit.json").is_symlink():
        raise QuantkitError(f"{artifact}: quantkit.json is a symbolic link (an artifact holds regular files only)")
    meta = read_meta(artifact)
    if meta.get("kind") != "quantkit-artifact":
        raise QuantkitError(
            f"{artifact}: quantkit.json was not written by `quantkit convert`; only verified artifacts are published"
        )
    problem = verification_problem(meta)
    if problem is not None:
        raise QuantkitError(f"{artifact}: {problem}; refusing to publish an unverified artifact")
    if not (artifact / "README.md").is_file():
        raise QuantkitError(f"{artifact}: no model card (README.md)")
    check(artifact, meta, deep=True)
    return meta


def plan(artifact: Path, meta: dict) -> list[dict]:
    """What is uploaded: the files the manifest records, and quantkit.json."""
    names = sorted([*meta["files"], "quantkit.json"])
    return [
        {"path": n, "bytes": (Path(artifact) / n).stat().st_size}
        for n in names
        if not any(p.startswith(".") for p in n.split("/"))
    ]


def resolve_token() -> str:
    token = get_token()  # HF_TOKEN, then the cached login
    if not token:
        raise QuantkitError("no Hugging Face token: set HF_TOKEN or run `hf auth login`")
    return token


def _existing_visibility(api, repo: str) -> bool | None:
    """True/False: the repo exists and is private/public; None: it does not exist (for this token)."""

    try:
        info = api.repo_info(repo, repo_type="model")
    except RepositoryNotFoundError:
        return None
    return bool(getattr(info, "private", False))


def publish(artifact: Path, repo: str, *, private: bool = False, revision: str | None = None, api=None) -> dict:
    """Check the artifact, create the repo if needed and upload exactly the verified files."""

    check_repo(repo)
    meta = check_publishable(artifact)
    files = plan(artifact, meta)
    token = resolve_token()
    api = api or HfApi(token=token)
    try:
        existing = _existing_visibility(api, repo)
        if private and existing is False:
            raise QuantkitError(
                f"{repo} exists and is public: --private cannot make it private and nothing was uploaded; "
                "change its visibility on the Hub first, or publish without --private"
            )
        if existing is None:
            api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        if revision:
            api.create_branch(repo, branch=revision, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo,
            folder_path=str(artifact),
            revision=revision,
            repo_type="model",
            commit_message="Upload quantized artifact (quantkit)",
            allow_patterns=[glob.escape(f["path"]) for f in files],
            ignore_patterns=EXCLUDE,
        )
    except HfHubHTTPError as exc:
        code = getattr(getattr(exc, "response", None), "status_code", None)
        raise QuantkitError(
            f"the Hub refused the upload to {repo} (HTTP {code}): check the token's write access"
        ) from None
    except (ConnectionError, OSError, httpx.TransportError) as exc:
        raise OfflineError(
            f"cannot reach the Hugging Face Hub ({type(exc).__name__}); publish needs the network"
        ) from None
    visibility = "private" if (private or existing) else "public"
    return {
        "repo": repo,
        "revision": revision or "main",
        "private": visibility == "private",
        "files": len(files),
        "commit_url": str(getattr(info, "commit_url", info)),
    }
