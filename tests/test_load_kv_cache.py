"""The KV cache types as lever-study settings (load/servers.py): llama-server's -ctk/-ctv and
llama-cpp-python's server's type_k/type_v reach their flags, and what llama.cpp would refuse (an
unknown type, a quantized V cache with flash attention off) is one line before any server starts."""

import pytest
import yaml
from click.testing import CliRunner

from quantkit.cli import cli
from quantkit.load.servers import SERVERS, StudyError, lever_args


def test_llama_server_takes_its_cache_types_and_flash_attention_as_flags():
    kind = SERVERS["llama-server"]
    args, _ = lever_args(kind, {"cache_type_k": "q8_0", "cache_type_v": "q4_0", "flash_attn": True}, "x")
    assert args == ["--cache-type-k", "q8_0", "--cache-type-v", "q4_0", "--flash-attn", "on"]
    args, _ = lever_args(kind, {"cache_type_k": "q8_0"}, "x")  # a quantized K alone: no flash attention needed
    assert args == ["--cache-type-k", "q8_0"]
    assert lever_args(kind, {"cache_type_v": "q8_0", "flash_attn": "auto"}, "x")[0][-1] == "auto"
    # one lever for both (a lever changes one thing): the K/V spec quantkit's --kv-cache takes
    assert lever_args(kind, {"kv_cache": "q8_0/f16"}, "x")[0] == ["--cache-type-k", "q8_0", "--cache-type-v", "f16"]
    ids = lever_args(SERVERS["llama-cpp-python"], {"kv_cache": "q4_0", "flash_attn": True}, "x")[0]
    assert ids == ["--type_k", "2", "--type_v", "2", "--flash_attn", "true"]


@pytest.mark.parametrize(
    "engine, settings, needle",
    [
        (
            "llama-server",
            {"cache_type_k": "q3_k"},
            "x.settings.cache_type_k: 'q3_k' is not a llama.cpp cache type; valid: f32, f16",
        ),
        ("llama-server", {"cache_type_v": "q8_0", "flash_attn": False}, "x.settings.cache_type_v: a q8_0 V cache"),
        ("llama-server", {"cache_type_v": "q4_0", "flash_attn": "off"}, "only with flash attention"),
        ("llama-cpp-python", {"type_v": 8}, "x.settings.type_v: a q8_0 V cache runs in llama.cpp only"),
        ("llama-cpp-python", {"kv_cache": "q8_0/f16"}, None),  # a quantized K alone runs without flash attention
        ("llama-server", {"kv_cache": "q9"}, "x.settings.kv_cache 'q9': 'q9' is not a llama.cpp cache type"),
        ("llama-cpp-python", {"type_k": 99}, r"99 is not the ggml type id of a llama.cpp cache type; valid: 0 \(f32\)"),
    ],
)
def test_what_llama_cpp_would_refuse_is_one_line(engine, settings, needle):
    if needle is None:
        lever_args(SERVERS[engine], settings, "x")
        return
    with pytest.raises(StudyError, match=needle) as info:
        lever_args(SERVERS[engine], settings, "x")
    assert "\n" not in str(info.value)


def test_llama_cpp_pythons_server_runs_a_quantized_v_with_flash_attention_on():
    args, _ = lever_args(SERVERS["llama-cpp-python"], {"type_k": 8, "type_v": 8, "flash_attn": True}, "x")
    assert args == ["--type_k", "8", "--type_v", "8", "--flash_attn", "true"]


def test_the_built_in_study_has_cache_levers_and_a_refused_one_starts_no_server(tmp_path, monkeypatch):
    monkeypatch.setenv("QK_GGUF", str(tmp_path / "m.gguf"))
    monkeypatch.setenv("QK_DRAFT_GGUF", str(tmp_path / "m.gguf"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    result = CliRunner().invoke(cli, ["levers", "llama-server", "--dry-run", "--json"])
    assert result.exit_code == 0, result.stderr
    import json

    plans = {p["lever"]: p for p in json.loads(result.stdout)["levers"]}
    assert plans["kv-q8_0"]["command"][-4:] == ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"]
    assert plans["kv-q4_0"]["changes"] == "kv_cache=q4_0"
    study = {
        "name": "s",
        "server": {"engine": "llama-server", "model": str(tmp_path / "m.gguf"), "settings": {"flash_attn": "off"}},
        "levers": [{"name": "base"}, {"name": "kv", "settings": {"kv_cache": "q8_0/q8_0"}}],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["levers", str(path), "--out", str(out)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "levers[1] (kv).settings.kv_cache: a q8_0 V cache runs in llama.cpp only" in result.stderr
    assert not list(out.glob("*.server.log"))  # no server was started
