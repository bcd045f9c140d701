"""quantkit export --format gguf --type T: llama.cpp's own types with an importance matrix from
quantkit's calibration windows. The plumbing (what each tensor got, bad input) on any machine; the
whole export with llama.cpp's tools where the install built them (installed.llama_tool)."""

import json
from pathlib import Path

import pytest
from installed import llama_tool

from quantkit.errors import QuantkitError
from quantkit.gguf import llama_quantize
from quantkit.gguf.type_report import ggml_block


@pytest.mark.parametrize("bad", ["Q9_Z", "q4", "F16", "COPY", "Q4_K_M ", ""])
def test_unknown_types_are_one_line_listing_the_valid_ones(cli, tiny_llama, tmp_path, bad):
    out = tmp_path / "x.gguf"
    code, stdout, stderr, _ = cli(
        "export", str(tiny_llama), "--format", "gguf", "--type", bad, "--out", str(out), "--json"
    )
    assert code == 2 and stderr.count("\n") == 1 and "valid: Q4_0" in stderr and "Q4_K_M" in stderr, stderr
    assert stdout == "" and not out.exists()


def test_type_names_are_case_insensitive():
    assert llama_quantize.check_type("q4_k_m") == "Q4_K_M"
    with pytest.raises(QuantkitError):
        llama_quantize.check_type("Q4_K_MM")


@pytest.mark.parametrize("flag", [["--embeddings", "q8_0"], ["--allow-lossy"], ["--kl-text", "set:shakespeare-plays"]])
def test_exact_export_options_with_type_are_refused(cli, tiny_llama, tmp_path, flag):
    out = tmp_path / "x.gguf"
    code, _, stderr, _ = cli(
        "export", str(tiny_llama), "--format", "gguf", "--type", "Q4_K_M", *flag, "--out", str(out)
    )
    assert code == 2 and stderr.count("\n") == 1 and flag[0] in stderr and not out.exists(), stderr


def test_type_without_the_tools_is_one_line_and_writes_nothing(cli, tiny_llama, tmp_path, monkeypatch):
    empty = tmp_path / "no-tools"
    empty.mkdir()
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(empty))
    out = tmp_path / "out" / "x.gguf"
    code, stdout, stderr, _ = cli(
        "export", str(tiny_llama), "--format", "gguf", "--type", "Q4_K_M", "--out", str(out), "--json"
    )
    assert code == 2 and stderr.count("\n") == 1 and "llama-quantize is not installed" in stderr, stderr
    assert "QUANTKIT_WITH_LLAMA_TOOLS=1" in stderr and stdout == "" and not out.parent.exists()


def _export(cli, src: Path, out: Path, qtype: str, tiny_text: Path, *extra: str):
    return cli(
        "export",
        str(src),
        "--format",
        "gguf",
        "--type",
        qtype,
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--calib-samples",
        "4",
        "--calib-seq-len",
        "64",
        *extra,
        "--json",
    )


@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q6_K", "Q4_0"])
def test_kquant_export_reports_what_each_tensor_got(cli, tiny_llama, tiny_text, tmp_path, qtype):
    import gguf

    llama_tool("llama-quantize"), llama_tool("llama-imatrix")
    out = tmp_path / "out" / f"tiny-{qtype}.gguf"
    code, _, stderr, rec = _export(cli, tiny_llama, out, qtype, tiny_text)
    assert code == 0, stderr
    reader = gguf.GGUFReader(str(out))
    got = {t.name: t.tensor_type.name for t in reader.tensors}
    assert {t["name"]: t["type"] for t in rec["tensors"]} == got  # the record is what the file holds
    assert rec["gguf_type"] == qtype and rec["lossless"] is False
    block = ggml_block(qtype)
    for t in reader.tensors:  # every 2-D weight whose rows the block does not divide is reported as a fallback
        if len(t.shape) == 2 and int(t.shape[0]) % block:
            assert t.name in {f["tensor"] for f in rec["fallbacks"]}
    assert rec["imatrix"]["calibration"]["samples"] == 4 and len(rec["imatrix"]["sha256"]) == 64
    keys = {f.name for f in reader.fields.values()}
    assert "quantize.imatrix.file" in keys and "quantkit.imatrix.sha256" in keys
    assert (
        bytes(reader.fields["quantkit.lossless"].parts[-1]) == b"\x00"
    )  # false: llama-quantize copied the F16 file's true
    assert json.loads(Path(str(out).removesuffix(".gguf") + ".quantkit.json").read_text())["sha256"] == rec["sha256"]
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        [out.name, out.stem + ".quantkit.json"]
    )  # nothing left behind


def test_kquant_export_refuses_to_overwrite_without_force(cli, tiny_llama, tiny_text, tmp_path):
    llama_tool("llama-quantize")
    out = tmp_path / "x.gguf"
    assert _export(cli, tiny_llama, out, "Q4_K_M", tiny_text)[0] == 0
    before = out.read_bytes()
    code, _, stderr, _ = _export(cli, tiny_llama, out, "Q6_K", tiny_text)
    assert code == 2 and "--force" in stderr and out.read_bytes() == before
    code, _, stderr, rec = _export(cli, tiny_llama, out, "Q6_K", tiny_text, "--force")
    assert code == 0 and rec["gguf_type"] == "Q6_K", stderr


@pytest.fixture
def rtn_artifact(tmp_path, tiny_llama):
    """INT4 symmetric group 32 (RTN): its exact GGUF type is Q4_0."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    out = tmp_path / "rtn" / "int4"
    result = CliRunner().invoke(
        group,
        [
            "convert",
            "int4-w4a16-rtn",
            "--model",
            str(tiny_llama),
            "--out",
            str(out),
            "--set",
            "steps[0].quantize.group_size=32",
        ],
    )
    assert result.exit_code == 0, result.output
    return out


def test_a_quantized_artifact_keeps_its_exact_type(cli, rtn_artifact, tmp_path, monkeypatch):
    (tmp_path / "no-tools").mkdir()
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "no-tools"))  # the exact path needs no tool
    out = tmp_path / "x.gguf"
    code, _, stderr, rec = cli(
        "export", str(rtn_artifact), "--format", "gguf", "--type", "q4_0", "--out", str(out), "--json"
    )
    assert code == 0 and rec["lossless"] is True and rec["tensor_types"]["Q4_0"] > 0, stderr
    for other in ("Q4_K_M", "Q8_0", "IQ4_XS"):  # llama-quantize would round the rounded grid again
        code, _, stderr, _ = cli(
            "export", str(rtn_artifact), "--format", "gguf", "--type", other, "--out", str(tmp_path / "y.gguf")
        )
        assert code == 2 and stderr.count("\n") == 1 and "already quantized (Q4_0 exactly)" in stderr, stderr
    assert not (tmp_path / "y.gguf").exists()


def test_a_second_type_reuses_the_importance_matrix(cli, tiny_llama, tiny_text, tmp_path):
    llama_tool("llama-imatrix")
    first = _export(cli, tiny_llama, tmp_path / "a.gguf", "Q4_K_M", tiny_text)[3]
    second = _export(cli, tiny_llama, tmp_path / "b.gguf", "Q6_K", tiny_text)[3]
    assert first["imatrix"]["reused"] is False and second["imatrix"]["reused"] is True
    assert second["imatrix"]["sha256"] == first["imatrix"]["sha256"]
    other = _export(cli, tiny_llama, tmp_path / "c.gguf", "Q6_K", tiny_text, "--calib-samples", "3")[
        3
    ]  # other windows: computed again
    assert other["imatrix"]["reused"] is False and other["imatrix"]["calibration"]["samples"] == 3


@pytest.mark.parametrize(
    ("spec", "chat", "loads"),
    [
        ("self", False, True),  # the model writes the whole text
        ("mix:default", True, True),  # the mix's chat part: the model's own replies
        ("mix:default", False, False),  # no chat template: that part is left out, nothing generated
        ("set:world-factbook", True, False),
        ("file:x.txt", True, False),
    ],
)
def test_the_model_is_loaded_only_for_text_it_writes(spec, chat, loads, monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(llama_quantize, "load_model", lambda *a, **k: "model")
    tok = SimpleNamespace(chat_template="{{ x }}" if chat else None)
    assert (llama_quantize._model_if_needed(Path("src"), spec, tok) == "model") is loads
