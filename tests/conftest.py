from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fixtures import ARCHS, build_checkpoint, build_tokenizer, synthetic_text

REPO = Path(__file__).resolve().parents[1]
SHARED_TEXT = REPO.parent / "shared" / "data" / "wikitext2-valid.txt"


@pytest.fixture(autouse=True)
def quantkit_home(tmp_path, monkeypatch):
    """Every test gets its own QUANTKIT_HOME, so no test touches real user state."""
    home = tmp_path / "qk-home"
    monkeypatch.setenv("QUANTKIT_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("QUANTKIT_PROBE_MIB", "64")
    return home


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    build_tokenizer(root / "tokenizer")
    for arch in ARCHS:
        build_checkpoint(root / arch, arch, root / "tokenizer")
    (root / "text.txt").write_text(synthetic_text())
    return root


@pytest.fixture(scope="session")
def tiny_llama(tiny_dir) -> Path:
    return tiny_dir / "llama-gqa"


@pytest.fixture(scope="session")
def tiny_text(tiny_dir) -> Path:
    return tiny_dir / "text.txt"


@pytest.fixture
def cli():
    """Invoke the CLI in-process; returns (exit_code, stdout, stderr, parsed_json_or_None)."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    def run(*args: str):
        runner = CliRunner()
        result = runner.invoke(group, list(args), catch_exceptions=False)
        parsed = None
        if "--json" in args and result.exit_code == 0:
            parsed = json.loads(result.stdout)
        return result.exit_code, result.stdout, result.stderr, parsed

    return run


def demo_model_path() -> Path | None:
    """The demo model, if pulled into the user cache (e2e tests pull it into their own home)."""
    home = Path(os.environ.get("QUANTKIT_DEMO_HOME", Path.home() / ".cache" / "quantkit"))
    path = home / "models" / "demo"
    return path if (path / "config.json").is_file() else None
