"""llama.cpp never aborts quantkit's process: its cache types are checked against the model's heads
before a context is made (one line naming the rule, exit 2), and a GGUF is first run in a child
process with the settings quantkit will run it with (gguf/trial.py), so a native abort of any kind
(GGML_ASSERT, a segmentation fault) is one line and exit 1."""

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import build_checkpoint
from installed import needs_llama_cpp

from quantkit.core.signals import EngineCrash
from quantkit.gguf import trial

ASSERT = (
    "/src/ggml/src/ggml.c:1797: GGML_ASSERT(view_src == NULL || data_size == 0 || data_size + view_offs <= "
    "ggml_nbytes(view_src)) failed\n"
)


@pytest.fixture
def gguf_file(tmp_path) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return p


@pytest.mark.parametrize("sig", [signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL])
def test_a_child_that_dies_of_a_signal_is_one_line_exit_1(gguf_file, monkeypatch, sig):
    calls = []

    def run(cmd, **kw):
        calls.append(kw["env"].get("GGML_NO_BACKTRACE"))
        return subprocess.CompletedProcess(cmd, -sig, "", "llama_context: n_ctx = 64\n" + ASSERT)

    monkeypatch.setattr(trial.subprocess, "run", run)
    with pytest.raises(EngineCrash) as info:
        trial.check_runs(gguf_file, (2, 1), False, False, "--kv-cache q4_0/f16, flash attention off")
    line = str(info.value)
    assert info.value.exit_code == 1 and "\n" not in line and calls == ["1"]
    assert f"died of {sig.name}" in line and str(gguf_file) in line and "q4_0/f16" in line
    if sig == signal.SIGABRT:
        assert "GGML_ASSERT(view_src == NULL" in line
    assert not list(gguf_file.parent.glob("*.json"))


def test_a_run_that_passed_is_remembered_and_a_refusal_is_left_to_the_load(gguf_file, monkeypatch):
    codes = [1, 0]
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, codes[min(len(calls) - 1, 1)], "", "ValueError: Failed to create")

    monkeypatch.setattr(trial.subprocess, "run", run)
    trial.check_runs(gguf_file, (1, 1), False, False, "f16")  # llama.cpp refused: the in-process load says why
    trial.check_runs(gguf_file, (1, 1), False, False, "f16")  # passed: remembered
    trial.check_runs(gguf_file, (1, 1), False, False, "f16")
    assert len(calls) == 2
    trial.check_runs(gguf_file, (8, 1), False, False, "q8_0/f16")  # other settings: tried on their own
    assert len(calls) == 3


@pytest.fixture(scope="module")
def head24(tmp_path_factory, tiny_dir) -> tuple[Path, Path]:
    """A tiny Llama with heads of 24 values (hidden 96, 4 heads) and its exact GGUF."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    root = tmp_path_factory.mktemp("head24")
    ckpt = build_checkpoint(
        root / "hd24", "llama-gqa", tiny_dir / "tokenizer", hidden_size=96, head_dim=24, intermediate_size=192
    )
    out = root / "hd24.gguf"
    res = CliRunner().invoke(group, ["export", str(ckpt), "--format", "gguf", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return ckpt, out


@needs_llama_cpp
@pytest.mark.parametrize(
    "args",
    [
        ["--kv-cache", "q4_0/f16", "--flash-attn", "off"],
        ["--kv-cache", "q8_0/f16", "--flash-attn", "on"],
        ["--kv-cache", "f16/q8_0", "--flash-attn", "on"],
        ["--kv-cache", "iq4_nl/f16", "--flash-attn", "both"],
    ],
)
def test_bench_refuses_a_cache_the_heads_cannot_hold_before_any_work(cli, head24, monkeypatch, args):
    def boom(*a, **k):
        raise AssertionError("the device was probed before the check")

    monkeypatch.setattr("quantkit.bench.probe.run_probe", boom)
    code, out, err, _ = cli("bench", str(head24[1]), "--engine", "llamacpp", *args, "--no-self-check")
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("load_backend:")]
    assert code == 2 and len(lines) == 1 and "cache holds whole blocks of 32 values" in lines[0], err
    assert "heads hold 24" in lines[0] and "Traceback" not in err


@needs_llama_cpp
def test_eval_refuses_a_cache_the_heads_cannot_hold(cli, head24, tiny_text):
    ckpt, gguf = head24
    code, _, err, _ = cli(
        "eval", str(gguf), "--baseline", str(ckpt), "--engine", "llamacpp", "--kv-cache", "q8_0/f16",
        "--text", f"file:{tiny_text}", "--seq-len", "32", "--max-tokens", "64",
    )  # fmt: skip
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("load_backend:")]
    assert code == 2 and len(lines) == 1 and "a q8_0 K cache holds whole blocks of 32" in lines[0], err


@needs_llama_cpp
def test_a_real_abort_of_llama_cpp_is_caught_in_the_child(head24, tmp_path):
    """What the rule prevents, run anyway: llama.cpp aborts in the child, quantkit says one line."""
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

    import_llama_cpp()  # the library this process would load, which the child loads too
    gguf = tmp_path / "hd24.gguf"
    shutil.copy(head24[1], gguf)
    with pytest.raises(EngineCrash) as info:
        trial.check_runs(gguf, (2, 1), False, False, "--kv-cache q4_0/f16, flash attention off")
    line = str(info.value)
    assert "died of SIGABRT" in line and "GGML_ASSERT" in line and "\n" not in line
    trial.check_runs(gguf, (1, 1), False, False, "f16")  # the same file with f16 runs


def test_the_child_is_a_module_that_runs():
    proc = subprocess.run([sys.executable, "-c", "import quantkit.gguf.trial"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_run_refuses_a_variants_cache_the_heads_cannot_hold(cli, head24, tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "variants:\n  - name: int8-kv\n    steps:\n"
        "      - quantize: {method: rtn, bits: 8, group_size: -1, kv_cache: {llamacpp: q8_0/f16}}\n"
        "bench:\n  engines: [llamacpp]\n  flash_attn: both\n"
    )
    out = tmp_path / "run"
    code, _, err, _ = cli("run", str(suite), "--model", str(head24[0]), "--out", str(out), "--skip-eval")
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out.exists(), err
    assert "variant int8-kv: kv_cache.llamacpp q8_0/f16" in err and "a q8_0 K cache holds whole blocks of 32" in err
