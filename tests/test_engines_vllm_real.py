"""vLLM itself, from the environment scripts/_install.sh built: the bench engine and the eval scorer
on the demo model, on the CPU. Where the install script built vLLM (tests/installed.py), a vLLM that
does not start fails these tests; they skip only where vLLM was left out (QUANTKIT_SKIP_VLLM=1) or
never installed by the script. Few and slow: each starts vLLM (~30 s on 2 idle cores)."""

import re

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def real_vllm(monkeypatch):
    from installed import vllm_venv

    monkeypatch.setenv("QUANTKIT_VLLM_VENV", str(vllm_venv()))


def test_bench_times_vllm_and_its_logits_pass_the_self_check(cli, demo_model, real_vllm):
    code, _, err, out = cli(
        "bench",
        str(demo_model),
        "--engine",
        "vllm",
        "--device",
        "cpu",
        "--prompt-len",
        "32",
        "--gen-len",
        "8",
        "--repeats",
        "2",
        "--min-seconds",
        "0",
        "--warmups",
        "1",
        "--json",
    )
    assert code == 0, err
    (row,) = out["rows"]
    assert row["self_check"]["passed"] and row["self_check"]["mean_kl"] < 0.01, row["self_check"]
    assert row["engine"] == "vllm" and "vLLM" in row["kernel"] and row["tpot_ms"] > 0 and row["ttft_ms"] > 0
    assert row["stats"]["per_step"]["measured"] and all(len(rep) == 7 for rep in row["stats"]["step_times_ms"])


def test_eval_on_vllm_agrees_with_transformers_on_the_same_checkpoint(cli, demo_model, real_vllm):
    """The demo (16-bit) in float32 on both sides: vLLM's full-vocabulary log-probabilities are transformers'."""
    code, _, err, out = cli(
        "eval",
        str(demo_model),
        "--baseline",
        str(demo_model),
        "--engine",
        "vllm",
        "--device",
        "cpu",
        "--text",
        "set:world-factbook",
        "--seq-len",
        "128",
        "--max-tokens",
        "256",
        "--json",
    )
    assert code == 0, err
    (row,) = out["texts"]
    assert out["scorer"]["engine"] == "vllm" and out["scorer"]["dtype"] == "float32" and row["tokens"] == 254
    assert row["kld"]["mean"] < 1e-3 and row["top1_agreement"] > 0.98 and abs(row["delta_ppl_pct"]) < 0.5, row


INT8_WEIGHT_ONLY = ["--set", "steps[0].quantize.bits=8", "--set", "steps[0].quantize.group_size=-1"]


@pytest.mark.parametrize(
    "sets",
    [[], ["--set", "steps[0].quantize.symmetric=false"], INT8_WEIGHT_ONLY],
    ids=["int4-sym", "int4-asym", "int8-w8a16"],
)
def test_the_compatibility_table_holds_on_a_tiny_model(cli, tiny_llama, tiny_text, tmp_path, real_vllm, sets):
    """What vllm_support.SUPPORT says of the artifact's schemes on the CPU is what vLLM does with it: it
    serves INT4 (and its next-token distribution is transformers' on the same artifact), it refuses
    INT8 weight-only with its own kernel error, as one line."""
    import json

    from quantkit.external import vllm_support

    art = tmp_path / "art"
    code, _, err, _ = cli("convert", "int4-w4a16-rtn", "--model", str(tiny_llama), "--out", str(art), *sets, "--json")
    assert code == 0, err
    served = vllm_support.verdict(vllm_support.schemes(json.loads((art / "quantkit.json").read_text())))["cpu"]
    code, _, err, out = cli(
        "eval",
        str(art),
        "--baseline",
        str(art),
        "--baseline-mismatch-ok",
        "--engine",
        "vllm",
        "--device",
        "cpu",
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "128",
        "--json",
    )
    if served:
        assert code == 0, err
        (row,) = out["texts"]
        assert out["scorer"]["dtype"] == "bfloat16" and row["kld"]["mean"] < 0.01 and row["top1_agreement"] > 0.9, row
    else:
        assert code == 2 and "Traceback" not in err, err
        (line,) = [x for x in err.splitlines() if x.startswith("error:")]
        assert "uint8b128" in line, line  # vLLM's reason: CPUWNA16 takes uint4 and uint4b8 only


def test_every_vllm_lever_is_a_flag_of_the_installed_server(real_vllm):
    """A study's vLLM settings become flags (load/servers.py): each one, and the --no- form of an
    on/off one, is a flag the installed vLLM's OpenAI server takes, so no lever fails at start-up
    for a flag this vLLM does not have."""
    import subprocess

    from quantkit.external import vllm_env
    from quantkit.load.servers import SERVERS

    cmd = [str(vllm_env.python()), "-m", "vllm.entrypoints.openai.api_server", "--help=all"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    flags = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", done.stdout))
    keys = SERVERS["vllm"].keys
    wanted = {k.flag for k in keys.values() if k.flag} | {
        "--no-" + k.flag.removeprefix("--") for k in keys.values() if k.flag and k.style == "pair"
    }
    assert wanted <= flags, sorted(wanted - flags)
