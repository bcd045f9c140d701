"""Several evaluation texts: one row per domain in `quantkit eval` and in `quantkit run`'s report,
each text with its own guards; labels, duplicates and the recipe's eval.text / eval.texts keys."""

import json
import os
from pathlib import Path

import pytest
from fixtures import CALIB_DATA, RECIPES

from quantkit.errors import DataError
from quantkit.evals.domains import label_of, labelled

ARGS = ["--seq-len", "32", "--max-tokens", "96"]


def _other_text(tmp_path: Path) -> Path:
    """A second domain: shipped legal text, copied so the test does not depend on where it lives."""
    p = tmp_path / "legal.txt"
    p.write_text((CALIB_DATA / "text" / "legal-licenses.txt").read_text()[:20000])
    return p


@pytest.mark.parametrize(
    "spec,label",
    [
        ("set:legal-licenses", "legal-licenses"),
        ("file:/a/b/eval.jsonl", "eval"),
        ("hf:wikitext:wikitext-2-raw-v1:test", "wikitext-wikitext-2-raw-v1-test"),
        ("self", "self"),
        ("file:noext", "noext"),
    ],
)
def test_labels(spec, label):
    assert label_of(spec) == label


def test_two_files_with_one_name_get_distinct_labels_and_a_repeated_text_is_refused():
    assert [lab for lab, _ in labelled(["file:a/x.txt", "file:b/x.txt", "file:c/x.txt"])] == ["x", "x-2", "x-3"]
    with pytest.raises(DataError, match="given twice"):
        labelled(["set:legal-licenses", "set:legal-licenses"])


def _same_text_ways(tmp_path: Path, text: Path) -> dict[str, tuple[str, str]]:
    """Two SPECs that name one text, each way there is: a symlink, a byte-identical copy, a path
    through a symlinked directory, a relative and an absolute path, a set and its file."""
    (tmp_path / "link.txt").symlink_to(text)
    (tmp_path / "copy.txt").write_bytes(text.read_bytes())
    (tmp_path / "dirlink").symlink_to(text.parent)
    from quantkit.data.text import parse_spec

    legal = parse_spec("set:legal-licenses").path
    return {
        "symlink": (f"file:{text}", f"file:{tmp_path / 'link.txt'}"),
        "copy": (f"file:{text}", f"file:{tmp_path / 'copy.txt'}"),
        "directory symlink": (f"file:{text}", f"file:{tmp_path / 'dirlink' / text.name}"),
        "relative path": (f"file:{text}", f"file:{os.path.relpath(text)}"),
        "set and its file": ("set:legal-licenses", f"file:{legal}"),
        "hf spacing": ("hf:org/data:train", " hf:org/data:train"),
    }


WAYS = ["symlink", "copy", "directory symlink", "relative path", "set and its file", "hf spacing"]


@pytest.mark.parametrize("way", WAYS)
def test_one_text_named_twice_is_refused_whatever_names_it(tmp_path, tiny_text, way):
    first, second = _same_text_ways(tmp_path, Path(tiny_text))[way]
    with pytest.raises(DataError, match="is the same text as|given twice") as caught:
        labelled([first, second])
    assert "each domain is evaluated once" in str(caught.value)


def test_different_texts_with_one_name_are_two_domains(tmp_path, tiny_text):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.txt").write_text("one text")
    (tmp_path / "b" / "x.txt").write_text("another text")
    assert [lab for lab, _ in labelled([f"file:{tmp_path / 'a' / 'x.txt'}", f"file:{tmp_path / 'b' / 'x.txt'}"])] == [
        "x",
        "x-2",
    ]


@pytest.mark.parametrize("way", ["symlink", "copy"])
def test_eval_refuses_one_text_twice_before_loading(cli, tiny_llama, tiny_text, tmp_path, monkeypatch, way):
    import quantkit.evals.scorers.transformers_scorer as hf

    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("loaded a model before checking the texts"))
    first, second = _same_text_ways(tmp_path, Path(tiny_text))[way]
    code, _, err, _ = cli(
        "eval", str(tiny_llama), "--baseline", str(tiny_llama), "--text", first, "--text", second, *ARGS
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"--text {second} is the same text as --text {first} (sha256 " in err


def test_one_row_per_text_each_equal_to_its_single_text_run(cli, tiny_dir, tiny_text, tmp_path):
    from fixtures import build_checkpoint

    other = build_checkpoint(tmp_path / "other", "llama-gqa", tiny_dir / "tokenizer", seed=1)
    legal = _other_text(tmp_path)
    base = ["--baseline", str(tiny_dir / "llama-gqa"), *ARGS, "--json"]
    code, _, err, both = cli("eval", str(other), "--text", f"file:{tiny_text}", "--text", f"file:{legal}", *base)
    assert code == 0, err
    assert [t["label"] for t in both["texts"]] == ["text", "legal"]
    assert [t["text"] for t in both["texts"]] == [f"file:{tiny_text}", f"file:{legal}"]
    for t in both["texts"]:
        assert {
            "ppl",
            "baseline_ppl",
            "delta_ppl_pct",
            "kld",
            "top1_agreement",
            "ci95",
            "tokens",
            "windows",
            "overlap_check",
        } <= set(t)
        assert t["kld"]["mean"] > 0 and t["windows"]["count"] == 3
    assert both["texts"][0]["ppl"] != both["texts"][1]["ppl"]  # really two texts
    assert (
        both["primary_text"] == "text" and both["ppl"] == both["texts"][0]["ppl"]
    )  # the one-text keys: the first text's
    code, _, err, alone = cli("eval", str(other), "--text", f"file:{legal}", *base)
    assert code == 0, err
    assert alone["texts"][0]["ppl"] == pytest.approx(both["texts"][1]["ppl"], rel=1e-6)
    assert alone["texts"][0]["kld"]["mean"] == pytest.approx(both["texts"][1]["kld"]["mean"], rel=1e-6)
    code, out, err, _ = cli(
        "eval",
        str(other),
        "--text",
        f"file:{tiny_text}",
        "--text",
        f"file:{legal}",
        "--baseline",
        str(tiny_dir / "llama-gqa"),
        *ARGS,
    )
    rows = [line for line in out.splitlines() if line.startswith(("text ", "legal "))]
    assert code == 0 and len(rows) == 2 and "ΔPPL %" in out and "KL mean" in out


def test_each_text_is_guarded_before_any_model_loads(cli, tiny_dir, tiny_text, tmp_path, monkeypatch):
    """A bad second text, or one overlapping the artifact's calibration, refuses the whole eval up front."""
    import quantkit.evals.scorers.transformers_scorer as hf

    art = tmp_path / "gptq"
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_dir / "llama-gqa"),
        "--out",
        str(art),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        "calibration.samples=4",
        "--set",
        "calibration.seq_len=32",
        "--set",
        "steps[0].quantize.group_size=32",
    )
    assert code == 0, err
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("loaded a model before checking every text"))
    legal = _other_text(tmp_path)
    base = ["--baseline", str(tiny_dir / "llama-gqa"), *ARGS]
    # the calibration read the text's second half: its second half overlaps, whichever position the text has
    code, _, err, _ = cli(
        "eval",
        str(art),
        "--text",
        f"file:{legal}",
        "--text",
        f"file:{tiny_text}",
        "--region",
        "second-half",
        *base,
        "--max-tokens",
        "1000000",
    )  # every window of the second half
    assert code == 2 and "overlap the calibration windows" in err and len(err.strip().splitlines()) == 1, err
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, _, err, _ = cli("eval", str(art), "--text", f"file:{legal}", "--text", f"file:{empty}", *base)
    assert code == 2 and "no text" in err and str(empty) in err
    code, _, err, _ = cli("eval", str(art), "--text", f"file:{legal}", "--text", "nonsense:x", *base)
    assert code == 2 and "unknown text source" in err
    code, _, err, _ = cli("eval", str(art), "--text", f"file:{legal}", "--text", f"file:{legal}", *base)
    assert code == 2 and "given twice" in err


def test_recipe_eval_text_and_texts():
    from quantkit.recipe.schema import EvalConfig

    assert EvalConfig.model_validate({"text": "set:a"}).texts == ("set:a",)
    assert EvalConfig.model_validate({"texts": ["set:a", "file:b"]}).text == "set:a"
    assert EvalConfig().texts == () and EvalConfig().text is None
    with pytest.raises(ValueError, match="not both"):
        EvalConfig.model_validate({"text": "set:a", "texts": ["set:b"]})
    dumped = EvalConfig.model_validate({"text": "set:a"}).model_dump(mode="json")
    assert EvalConfig.model_validate(dumped).texts == ("set:a",)  # a dumped recipe reloads


SMALL = [
    "--set",
    "calibration.samples=4",
    "--set",
    "calibration.seq_len=64",
    "--set",
    "eval.seq_len=32",
    "--set",
    "eval.max_tokens=64",
    "--skip-bench",
]


def test_run_reports_a_row_per_variant_per_domain(cli, tiny_llama, tiny_text, tmp_path):
    legal = _other_text(tmp_path)
    suite = tmp_path / "suite.yaml"
    (tmp_path / "int4-w4a16-rtn.yaml").write_text((RECIPES / "int4-w4a16-rtn.yaml").read_text())
    suite.write_text(
        "description: domains\nvariants:\n  - name: int4-rtn\n    recipe: int4-w4a16-rtn.yaml\n"
        f"eval:\n  texts: [file:{tiny_text}, file:{legal}]\n"
    )
    out = tmp_path / "run"
    code, _, err, rep = cli("run", str(suite), "--model", str(tiny_llama), "--out", str(out), *SMALL, "--json")
    assert code == 0, err
    acc = rep["accuracy"]
    assert [(a["name"], a["domain"]) for a in acc] == [
        ("baseline", "text"),
        ("baseline", "legal"),
        ("int4-rtn", "text"),
        ("int4-rtn", "legal"),
    ]
    assert all(a["kld_mean"] == 0.0 for a in acc[:2]) and all(a["kld_mean"] > 0 for a in acc[2:])
    assert rep["eval_texts"] == [f"file:{tiny_text}", f"file:{legal}"]
    md = (out / "report.md").read_text()
    assert "**Accuracy per domain**" in md and "| int4-rtn | legal |" in md and "ΔPPL % (text)" in md
    assert "on cpu" in md and "float32" in md  # where the eval ran
    # --eval-text (repeatable) overrides the recipe; the single-text report has no per-domain table
    code, _, err, rep = cli(
        "run",
        str(suite),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "r2"),
        *SMALL,
        "--eval-text",
        f"file:{legal}",
        "--json",
    )
    assert code == 0, err
    assert {a["domain"] for a in rep["accuracy"]} == {"legal"}
    assert "Accuracy per domain" not in (tmp_path / "r2" / "report.md").read_text()
    # a bad second text fails before any conversion
    code, _, err, _ = cli(
        "run",
        str(suite),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "r3"),
        *SMALL,
        "--eval-text",
        f"file:{legal}",
        "--eval-text",
        f"file:{tmp_path / 'missing.txt'}",
    )
    assert code == 2 and "no such text file" in err and not (tmp_path / "r3" / "artifacts").exists()


def test_update_card_lists_every_domain(cli, tiny_dir, tiny_text, tmp_path):
    art = tmp_path / "int4"
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(tiny_dir / "llama-gqa"),
        "--out",
        str(art),
        "--set",
        "steps[0].quantize.group_size=32",
    )
    assert code == 0, err
    legal = _other_text(tmp_path)
    code, _, err, _ = cli(
        "eval",
        str(art),
        "--baseline",
        str(tiny_dir / "llama-gqa"),
        "--text",
        f"file:{tiny_text}",
        "--text",
        f"file:{legal}",
        *ARGS,
        "--update-card",
    )
    assert code == 0, err
    card = (art / "README.md").read_text()
    assert (
        "| text: dPPL |" in card
        and "| legal: dPPL |" in card
        and "| legal: KL divergence vs baseline, exact (mean / p99) |" in card
    )
    meta = json.loads((art / "quantkit.json").read_text())
    assert [t["label"] for t in meta["results"]["eval"]["texts"]] == ["text", "legal"]
