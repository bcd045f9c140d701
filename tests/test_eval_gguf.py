"""`quantkit eval --engine llamacpp FILE.gguf --baseline MODEL`: a GGUF scored by llama.cpp against
the original model's cached top-k baseline; bad files, another vocabulary, a missing llama_cpp."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures import CALIB_DATA, RECIPES
from gguf_helpers import kquant_json

ARGS = ["--seq-len", "32", "--max-tokens", "128", "--json"]

needs_llama_cpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (./scripts/_install.sh builds it)",
)


@pytest.fixture(scope="module")
def exported(tiny_dir, tmp_path_factory):
    """An RTN g32 INT4 artifact of the fixture and its Q4_0 GGUF, the fixture's own F16 GGUF, and a GGUF
    of another tokenizer's model."""
    from fixtures import build_checkpoint, build_tokenizer

    from quantkit.cli import cli as group

    root = tmp_path_factory.mktemp("eval-gguf")
    env = {"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}

    def run(*args):
        res = CliRunner().invoke(group, list(args), catch_exceptions=False, env=env)
        assert res.exit_code == 0, res.stderr

    art = root / "int4"
    run(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(tiny_dir / "llama-gqa"),
        "--out",
        str(art),
        "--set",
        "steps[0].quantize.group_size=32",
    )
    run("export", str(art), "--format", "gguf", "--out", str(root / "int4.gguf"))
    run("export", str(tiny_dir / "llama-gqa"), "--format", "gguf", "--out", str(root / "f16.gguf"))
    build_tokenizer(root / "tok2", vocab_size=320)
    foreign = build_checkpoint(root / "foreign", "llama-gqa", root / "tok2")
    run("export", str(foreign), "--format", "gguf", "--out", str(root / "foreign.gguf"))
    return {"artifact": art, "int4": root / "int4.gguf", "f16": root / "f16.gguf", "foreign": root / "foreign.gguf"}


@needs_llama_cpp
def test_f16_gguf_of_the_baseline_scores_like_the_baseline(cli, exported, tiny_dir, tiny_text):
    code, _, err, data = cli(
        "eval",
        "--engine",
        "llamacpp",
        str(exported["f16"]),
        "--baseline",
        str(tiny_dir / "llama-gqa"),
        "--text",
        f"file:{tiny_text}",
        "--text",
        "set:legal-licenses",
        *ARGS,
    )
    assert code == 0, err
    assert data["engine"] == "llamacpp" and data["scorer"]["engine"] == "llamacpp" and data["scorer"]["threads"] >= 1
    assert data["baseline_check"]["match"] is True  # exported from the baseline itself (quantkit.source.sha256)
    assert [t["label"] for t in data["texts"]] == ["text", "legal-licenses"]
    for t in data["texts"]:  # F16 weights, llama.cpp's own kernels: agreement of the order of activation rounding
        assert t["kld"]["mean"] < 1e-3 and t["top1_agreement"] > 0.97 and abs(t["delta_ppl_pct"]) < 1.0, t


@needs_llama_cpp
def test_int4_gguf_agrees_with_its_artifact_in_transformers(cli, exported, tiny_dir, tiny_text):
    """The same Q4_0 weights through llama.cpp and through transformers: close figures (llama.cpp also
    rounds the activations to Q8_0 for Q4_0 matmuls), both clearly away from the baseline."""
    base = ["--baseline", str(tiny_dir / "llama-gqa"), "--text", f"file:{tiny_text}", *ARGS]
    code, _, err, ggml = cli("eval", "--engine", "llamacpp", str(exported["int4"]), *base)
    assert code == 0, err
    code, _, err, torch_ = cli("eval", str(exported["artifact"]), *base)
    assert code == 0, err
    g, t = ggml["texts"][0], torch_["texts"][0]
    assert ggml["baseline_check"]["match"] is True and str(exported["artifact"]) in ggml["baseline_check"]["found_via"]
    assert t["baseline_cached"] is True  # one baseline pass serves both engines
    assert g["tokens"] == t["tokens"] and g["kld"]["mean"] > 1e-3
    assert g["kld"]["mean"] == pytest.approx(t["kld"]["mean"], rel=0.3) and g["ppl"] == pytest.approx(
        t["ppl"], rel=0.05
    )


@needs_llama_cpp
def test_an_artifact_directory_is_exported_on_the_fly(cli, exported, tiny_dir, tiny_text):
    code, _, err, data = cli(
        "eval",
        "--engine",
        "llamacpp",
        str(exported["artifact"]),
        "--baseline",
        str(tiny_dir / "llama-gqa"),
        "--text",
        f"file:{tiny_text}",
        *ARGS,
    )
    assert code == 0, err
    assert data["scorer"]["gguf_export"]["lossless"] is True and data["texts"][0]["kld"]["mean"] > 1e-3


@needs_llama_cpp
def test_bad_ggufs_are_one_line_exit_2(cli, exported, tiny_dir, tiny_text, tmp_path, monkeypatch):
    import quantkit.evals.scorers.transformers_scorer as hf

    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("loaded the baseline for a bad GGUF"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    short = tmp_path / "short.gguf"
    short.write_bytes(exported["int4"].read_bytes()[:20000])
    header = tmp_path / "header.gguf"
    header.write_bytes(exported["int4"].read_bytes()[:40])
    text = tmp_path / "model.txt"
    text.write_text("not a model")
    cases = [
        (junk, "not a GGUF file"),
        (short, "truncated"),
        (header, "GGUF"),
        (text, "not a GGUF file"),
        (tmp_path / "missing.gguf", "no such GGUF file"),
        (exported["foreign"], "vocabulary size mismatch"),
    ]
    for path, needle in cases:
        code, _, err, _ = cli(
            "eval",
            "--engine",
            "llamacpp",
            str(path),
            "--baseline",
            str(tiny_dir / "llama-gqa"),
            "--text",
            f"file:{tiny_text}",
            "--seq-len",
            "32",
        )
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (
            path,
            err,
        )


def test_missing_llama_cpp_is_one_line_exit_2(cli, tiny_dir, tiny_text, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    code, _, err, _ = cli(
        "eval", "--engine", "llamacpp", str(f), "--baseline", str(tiny_dir / "llama-gqa"), "--text", f"file:{tiny_text}"
    )
    assert code == 2 and "llama-cpp-python is not installed" in err and len(err.strip().splitlines()) == 1


def test_tasks_are_not_llama_cpps(cli, tiny_dir, tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    code, _, err, _ = cli(
        "eval", "--engine", "llamacpp", str(f), "--baseline", str(tiny_dir / "llama-gqa"), "--tasks", "qk_facts"
    )
    assert code == 2 and "--tasks" in err and "lm-eval" in err


@needs_llama_cpp
def test_run_evaluates_every_variant_on_each_eval_engine(cli, tiny_llama, tiny_text, tmp_path):
    """`eval: {engines: [transformers, llamacpp]}`: a row per variant, engine and
    domain; one baseline pass serves both."""
    legal = tmp_path / "legal.txt"
    legal.write_text((CALIB_DATA / "text" / "legal-licenses.txt").read_text()[:20000])
    (tmp_path / "int4-w4a16-rtn.yaml").write_text((RECIPES / "int4-w4a16-rtn.yaml").read_text())
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "description: engines\nvariants:\n  - name: int4-rtn\n    recipe: int4-w4a16-rtn.yaml\n"
        f"eval:\n  texts: [file:{tiny_text}, file:{legal}]\n  engines: [transformers, llamacpp]\n"
        "  seq_len: 32\n  max_tokens: 64\n"
    )
    out = tmp_path / "run"
    code, _, err, rep = cli("run", str(suite), "--model", str(tiny_llama), "--out", str(out), "--skip-bench", "--json")
    assert code == 0, err
    got = {(a["name"], a["engine"], a["domain"]): a for a in rep["accuracy"]}
    assert set(got) == {
        (n, e, d) for n in ("baseline", "int4-rtn") for e in ("transformers", "llamacpp") for d in ("text", "legal")
    }
    assert got[("baseline", "transformers", "text")]["kld_mean"] == 0.0
    assert 0 < got[("baseline", "llamacpp", "text")]["kld_mean"] < 1e-3  # the F16 GGUF: activation rounding only
    for d in ("text", "legal"):
        t, g = got[("int4-rtn", "transformers", d)], got[("int4-rtn", "llamacpp", d)]
        assert g["kld_mean"] == pytest.approx(t["kld_mean"], rel=0.3)
    md = (out / "report.md").read_text()
    assert "| int4-rtn | llamacpp | legal |" in md


def test_recipe_eval_engines():
    from quantkit.recipe.schema import EvalConfig

    assert EvalConfig().engines == ("transformers",)
    assert EvalConfig.model_validate({"engines": ["transformers", "llamacpp"]}).engines == ("transformers", "llamacpp")
    for bad, needle in (
        ({"engines": []}, "at least one"),
        ({"engines": ["llamacpp", "llamacpp"]}, "once"),
        ({"engines": ["llamacpp"], "tasks": ["qk_facts"]}, "must be transformers"),
        ({"engines": ["sglang"]}, "llamacpp"),
    ):
        with pytest.raises(ValueError, match=needle):
            EvalConfig.model_validate(bad)


def test_a_gguf_vocabulary_must_be_the_baselines_row_for_row(tiny_dir, monkeypatch):
    """Same tokens, padded vocabulary: the baseline's top-k ids would index past llama.cpp's rows or leave rows out."""
    import quantkit.evals.gguf as g
    from quantkit.errors import DataError
    from quantkit.models.checkpoint import load_tokenizer

    base = tiny_dir / "llama-gqa"
    tok = load_tokenizer(base)
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    rows = __import__("json").loads((base / "config.json").read_text())["vocab_size"]
    padded = tokens + [f"[PAD{i}]" for i in range(len(tokens), rows)]
    monkeypatch.setattr(g, "gguf_tokens", lambda p: padded)
    assert g.check_same_vocab(Path("m.gguf"), base, tok)  # the export's own padding: accepted
    monkeypatch.setattr(g, "gguf_tokens", lambda p: padded + ["[PAD-extra]"])
    with pytest.raises(DataError, match="vocabulary size mismatch"):
        g.check_same_vocab(Path("m.gguf"), base, tok)
    swapped = list(padded)
    swapped[5], swapped[6] = swapped[6], swapped[5]  # same size, two ids exchanged
    monkeypatch.setattr(g, "gguf_tokens", lambda p: swapped)
    with pytest.raises(DataError, match="tokenizer mismatch.* at id 5 "):
        g.check_same_vocab(Path("m.gguf"), base, tok)


@pytest.mark.parametrize("what", ["importance matrix", "--mixed selection"])
def test_a_k_quant_ggufs_own_fitted_windows_come_from_its_export_record(exported, tiny_text, tmp_path, what):
    """llama-quantize copies the F16 file's header, so a K-quant GGUF carries only its artifact's
    texts; the importance matrix's windows and the --mixed selection's are in its export record,
    which the overlap check reads while the record describes the file."""
    import json
    import shutil

    from quantkit.core.integrity import sha256_file
    from quantkit.data.text import parse_spec, read_text
    from quantkit.errors import DataError
    from quantkit.evals.checks import check_disjoint_from_fitted
    from quantkit.evals.gguf import source_meta
    from quantkit.evals.perplexity import Windows
    from quantkit.gguf.target import record_path

    gguf = shutil.copy(exported["int4"], tmp_path / "k.gguf")
    windows = {
        "source": f"file:{tiny_text}",
        "sha256": read_text(parse_spec(f"file:{tiny_text}")).provenance["sha256"],
        "seq_len": 64,
        "window_starts": [1000, 2000],
    }
    record = kquant_json(json.loads(record_path(exported["int4"]).read_text()), mixed=what == "--mixed selection")
    record |= {"sha256": sha256_file(gguf), "bytes": gguf.stat().st_size}
    if what == "importance matrix":
        record["imatrix"]["calibration"] = windows
    else:
        record |= {"imatrix": None, "mixed": {**record["mixed"], "windows": windows}}
    record_path(gguf).write_text(json.dumps(record))
    meta, _, found = source_meta(gguf)
    assert "quantkit.provenance" in found["found_via"]
    evaluated = Windows([], [1010, 5000], 64, {"sha256": windows["sha256"]})
    with pytest.raises(DataError, match=f"1 of 2 evaluation windows overlap the {what} windows"):
        check_disjoint_from_fitted(gguf, meta, evaluated)
    gguf.write_bytes(gguf.read_bytes() + b"\0")  # the record no longer describes the file: not read
    assert check_disjoint_from_fitted(gguf, source_meta(gguf)[0], evaluated)["overlap"] is False
