"""quantkit eval on tiny checkpoints, through the CLI and --json."""

import re
import shutil
from pathlib import Path

import pytest
from conftest import SHARED_TEXT
from fixtures import RECIPES


def test_self_comparison_is_exact(cli, tiny_llama, tiny_text, tmp_path):
    copy = tmp_path / "copy"  # a different path: both passes really run
    shutil.copytree(tiny_llama, copy)
    code, out, err, data = cli(
        "eval",
        str(copy),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "256",
        "--json",
    )
    assert code == 0, err
    assert data["kld"]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert data["kld"]["max"] == pytest.approx(0.0, abs=1e-5)
    assert data["top1_agreement"] == 1.0
    assert data["delta_ppl_pct"] == pytest.approx(0.0, abs=1e-6)
    assert data["tokens"] == 4 * 63 and data["windows"]["count"] == 4
    assert data["windows"]["window_starts"] == [0, 64, 128, 192]
    assert set(data) >= {"ppl", "baseline_ppl", "delta_ppl_pct", "kld", "top1_agreement", "tokens", "windows", "tasks"}
    assert data["baseline_cached"] is False


def test_second_variant_uses_cached_baseline(cli, tiny_dir, tiny_text):
    args = [
        "--baseline",
        str(tiny_dir / "llama-gqa"),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "128",
        "--json",
    ]
    _, _, _, first = cli("eval", str(tiny_dir / "llama-gqa"), *args)
    code, _, err, second = cli("eval", str(tiny_dir / "llama-gqa"), *args)
    assert code == 0, err
    assert first["baseline_cached"] is False and second["baseline_cached"] is True


def test_different_model_has_positive_kl(cli, tiny_dir, tiny_text, tmp_path):
    from fixtures import build_checkpoint

    other = build_checkpoint(tmp_path / "other", "llama-gqa", tiny_dir / "tokenizer", seed=1)
    code, _, err, data = cli(
        "eval",
        str(other),
        "--baseline",
        str(tiny_dir / "llama-gqa"),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "128",
        "--json",
    )
    assert code == 0, err
    assert data["kld"]["mean"] > 0.01 and data["top1_agreement"] < 1.0


def test_tokenizer_mismatch(cli, tiny_dir, tiny_text, tmp_path):
    from fixtures import build_checkpoint, build_tokenizer

    build_tokenizer(tmp_path / "tok2", vocab_size=320)
    other = build_checkpoint(tmp_path / "m2", "llama-gqa", tmp_path / "tok2")
    code, _, err, _ = cli(
        "eval", str(other), "--baseline", str(tiny_dir / "llama-gqa"), "--text", f"file:{tiny_text}", "--seq-len", "64"
    )
    assert code == 2 and "tokenizer mismatch" in err and "Traceback" not in err


def test_text_shorter_than_a_window(cli, tiny_llama, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("only a few words here")
    code, _, err, _ = cli(
        "eval", str(tiny_llama), "--baseline", str(tiny_llama), "--text", f"file:{short}", "--seq-len", "64"
    )
    assert code == 2 and "shorter than one 64-token window" in err


def test_fewer_windows_than_max_tokens_asks_for_are_said(cli, tiny_llama, tmp_path):
    """A text whose region holds fewer windows than --max-tokens asks for: scored on those, and
    said (how many, why) on stderr and in the JSON; a text that holds them all says nothing."""
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 97} river {i}" for i in range(600)))
    base = [
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{text}",
        "--seq-len",
        "64",
        "--json",
    ]
    code, _, err, data = cli(*base, "--max-tokens", str(64 * 1000))
    assert code == 0, err
    w = data["windows"]
    assert w["requested"] == 1000 and 0 < w["count"] < 1000
    assert f"note: t: {w['count']} of the 1000 windows asked for: the first half of the text" in err
    assert f"holds only {w['count']} windows of 64 tokens" in err
    code, _, err, data = cli(*base, "--max-tokens", str(64 * w["count"]))
    assert code == 0 and data["windows"]["count"] == data["windows"]["requested"] and "windows asked for" not in err


def test_windows_longer_than_the_context_are_refused(cli, tiny_llama, tiny_text):
    """The fixture's context is 1024 tokens (max_position_embeddings)."""
    code, _, err, _ = cli(
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "1025",
        "--max-tokens",
        "4100",
    )
    assert (
        code == 2
        and len(err.strip().splitlines()) == 1
        and "--seq-len 1025 is longer than the model's context of 1024" in err
    )


def test_model_that_fails_to_load(cli, tiny_llama, tiny_text, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    (broken / "config.json").write_text('{"model_type": "no-such-arch"}')
    code, _, err, _ = cli(
        "eval", str(broken), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--seq-len", "64"
    )
    assert code == 2 and "error:" in err and "Traceback" not in err


def test_no_text_evaluates_the_default_domains(cli, tiny_llama, monkeypatch):
    """Without --text: the shipped encyclopedic and literature sets, and WikiText-2 after them where
    QUANTKIT_WIKITEXT2_VALID points at a copy; fewer than two default domains found: one line."""
    import quantkit.evals.domains as domains

    args = ("eval", str(tiny_llama), "--baseline", str(tiny_llama), "--seq-len", "32", "--max-tokens", "64", "--json")
    for wikitext in (False, True):
        if wikitext and not SHARED_TEXT.is_file():
            continue  # no copy of WikiText-2 on this machine
        if wikitext:
            monkeypatch.setenv("QUANTKIT_WIKITEXT2_VALID", str(SHARED_TEXT))
        else:
            monkeypatch.delenv("QUANTKIT_WIKITEXT2_VALID", raising=False)
        code, _, err, data = cli(*args)
        assert code == 0, err
        expected = list(domains.DEFAULT_SETS) + (["wikitext2-valid"] if wikitext else [])
        assert [t["label"] for t in data["texts"]] == expected and data["primary_text"] == expected[0]
    monkeypatch.setattr(domains, "_available", lambda n: n == domains.DEFAULT_SETS[0])
    code, _, err, _ = cli("eval", str(tiny_llama), "--baseline", str(tiny_llama))
    assert code == 2 and "only 1 of the default domains" in err and "--text" in err


def test_same_checkpoint_shortcut(cli, tiny_llama, tiny_text):
    code, _, err, data = cli(
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "128",
        "--json",
    )
    assert code == 0, err
    assert data["kld"]["max"] == 0.0 and data["top1_agreement"] == 1.0 and data["ppl"] == data["baseline_ppl"]


def test_offline_lm_eval_task_from_evals_dir(cli, tiny_dir):
    code, _, err, data = cli(
        "eval",
        str(tiny_dir / "llama-mha"),
        "--baseline",
        str(tiny_dir / "llama-mha"),
        "--tasks",
        "qk_facts",
        "--limit",
        "8",
        "--json",
    )
    assert code == 0, err
    t = data["tasks"]["qk_facts"]
    assert t["n"] == 8 and 0.0 <= t["value"] <= 1.0 and t["delta"] == 0.0 and t["metric"] in ("acc", "acc_norm")


def test_unknown_task(cli, tiny_llama):
    code, _, err, _ = cli(
        "eval", str(tiny_llama), "--baseline", str(tiny_llama), "--tasks", "no_such_task_xyz", "--limit", "2"
    )
    assert code == 2 and "unknown lm-eval task 'no_such_task_xyz'" in err


def test_update_card_on_non_artifact_fails_before_evaluating(cli, tiny_llama, tiny_text, monkeypatch):
    import quantkit.evals.eval_runner as runner

    monkeypatch.setattr(runner, "run_eval", lambda *a, **k: pytest.fail("evaluated before refusing --update-card"))
    code, _, err, _ = cli(
        "eval", str(tiny_llama), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--update-card"
    )
    assert code == 2 and "not a quantkit artifact" in err and "Traceback" not in err


def _rtn_artifact(cli, src, out):

    recipe = RECIPES / "int4-w4a16-rtn.yaml"
    code, _, err, _ = cli(
        "convert",
        str(recipe),
        "--model",
        str(src),
        "--out",
        str(out),
        "--set",
        "steps[0].quantize.group_size=32",
        "--json",
    )
    assert code == 0, err
    return out


def test_baseline_must_be_the_artifacts_source(cli, tiny_dir, tiny_text, tmp_path):
    """The demo as the baseline of a fixture's artifact once printed dPPL +91,498% with exit 0."""
    art = _rtn_artifact(cli, tiny_dir / "llama-gqa", tmp_path / "int4")
    args = ["--text", f"file:{tiny_text}", "--seq-len", "64", "--max-tokens", "128"]
    other = tiny_dir / "mistral"  # the same tokenizer, another checkpoint
    code, _, err, _ = cli("eval", str(art), "--baseline", str(other), *args)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"--baseline {other}" in err and "llama-gqa" in err and "--baseline-mismatch-ok" in err
    code, _, err, data = cli("eval", str(art), "--baseline", str(other), *args, "--baseline-mismatch-ok", "--json")
    assert code == 0, err
    check = data["baseline_check"]
    assert (
        check["match"] is False
        and check["mismatch_ok"] is True
        and check["artifact_source_sha256"] != check["baseline_sha256"]
    )
    code, _, err, data = cli("eval", str(art), "--baseline", str(tiny_dir / "llama-gqa"), *args, "--json")
    assert code == 0, err
    assert data["baseline_check"]["match"] is True
    assert data["overlap_check"]["overlap"] is False  # RTN was fitted on no text
    code, _, err, data = cli("eval", str(other), "--baseline", str(tiny_dir / "llama-gqa"), *args, "--json")
    assert code == 0 and data["baseline_check"]["match"] is None  # a plain checkpoint records no source


def test_damaged_artifact_metadata_is_one_line(cli, tiny_dir, tiny_text, tmp_path):
    art = _rtn_artifact(cli, tiny_dir / "llama-gqa", tmp_path / "int4")
    for content in ("{broken", "[]", "\x00\xff"):
        (art / "quantkit.json").write_text(content, encoding="latin-1")
        code, _, err, _ = cli(
            "eval",
            str(art),
            "--baseline",
            str(tiny_dir / "llama-gqa"),
            "--text",
            f"file:{tiny_text}",
            "--seq-len",
            "64",
        )
        assert code == 2 and f"{art / 'quantkit.json'}" in err and len(err.strip().splitlines()) == 1, err


def test_damaged_baseline_cache_is_recomputed(cli, tiny_llama, tiny_text, quantkit_home):
    args = [
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "128",
        "--json",
    ]
    _, _, _, first = cli(*args)
    for f in (quantkit_home / "eval-cache").glob("*.pt"):
        f.write_bytes(b"\x00" * 10)
    code, _, err, second = cli(*args)
    assert code == 0, err
    assert second["baseline_cached"] is False and second["ppl"] == first["ppl"]


def test_the_overlap_guard_reads_every_fitted_text_record():
    """Calibration, GQA recovery, and each text of a calibration mix (`parts`) are guarded."""
    from quantkit.errors import DataError
    from quantkit.evals.checks import check_disjoint_from_fitted, fitted_texts
    from quantkit.evals.perplexity import Windows

    meta = {
        "calibration": {
            "source": "mix:m",
            "seq_len": 8,
            "parts": [
                {"source": "file:a", "sha256": "A", "seq_len": 8, "window_starts": [0]},
                {"source": "file:b", "sha256": "B", "seq_len": 8, "window_starts": [64]},
            ],
        },
        "gqa": {
            "recover": {
                "windows": {
                    "source": "mix:m",
                    "seq_len": 4,
                    "parts": [
                        {
                            "source": "file:c",
                            "sha256": "C",
                            "seq_len": 4,
                            "train_starts": [100],
                            "heldout_starts": [200],
                        }
                    ],
                }
            }
        },
    }
    assert {(r["what"], r["sha256"]) for r in fitted_texts(meta) if r["starts"]} == {
        ("calibration", "A"),
        ("calibration", "B"),
        ("GQA recovery training", "C"),
        ("GQA recovery held-out", "C"),
    }
    for sha, start, what in [
        ("B", 60, "calibration"),
        ("C", 102, "GQA recovery training"),
        ("C", 198, "GQA recovery held-out"),
    ]:
        with pytest.raises(DataError, match=f"overlap the {what} windows"):
            check_disjoint_from_fitted(Path("art"), meta, Windows([], [start], 8, {"sha256": sha}))
    assert check_disjoint_from_fitted(Path("art"), meta, Windows([], [8, 300], 8, {"sha256": "B"}))["overlap"] is False
    assert check_disjoint_from_fitted(Path("art"), meta, Windows([], [64], 8, {"sha256": "other"}))["overlap"] is False


FITTED_ELSEWHERE = {
    "auto mixed precision": {
        "mixed_precision": {"windows": {"text": {"sha256": "T", "seq_len": 8, "window_starts": [0]}}}
    },
    "sensitivity (the overrides' choice)": {
        "recipe": {"steps": [{"quantize": {"chosen_on": {"sha256": "T", "seq_len": 8, "window_starts": [0]}}}]}
    },
    "importance matrix": {
        "gguf_export": {"imatrix": {"calibration": {"sha256": "T", "seq_len": 8, "window_starts": [0]}}}
    },
    "--mixed selection": {"gguf_export": {"mixed": {"windows": {"sha256": "T", "seq_len": 8, "window_starts": [0]}}}},
}


@pytest.mark.parametrize("what", list(FITTED_ELSEWHERE))
def test_every_text_a_choice_was_fitted_on_is_guarded(what):
    """Beyond the calibration: the windows auto chose its units on, sensitivity's (chosen_on, beside
    the overrides it printed), a K-quant GGUF's importance matrix and --mixed windows."""
    from quantkit.errors import DataError
    from quantkit.evals.checks import check_disjoint_from_fitted, fitted_texts
    from quantkit.evals.perplexity import Windows

    meta = FITTED_ELSEWHERE[what]
    assert [r["what"] for r in fitted_texts(meta)] == [what]
    with pytest.raises(DataError, match=f"1 of 2 evaluation windows overlap the {re.escape(what)} windows"):
        check_disjoint_from_fitted(Path("art"), meta, Windows([], [4, 64], 8, {"sha256": "T"}))
    assert check_disjoint_from_fitted(Path("art"), meta, Windows([], [8, 64], 8, {"sha256": "T"}))["overlap"] is False


def test_an_auto_artifact_on_the_windows_auto_chose_on_is_refused(cli, tiny_llama, tiny_text, tmp_path):
    """RTN fits on no text, but `auto:` chose its units on windows of the calibration file: the
    second half of that file reported `overlap: false` with 7 of 8 windows exactly those."""
    out = tmp_path / "art"
    code, _, err, data = cli(
        "convert",
        "int4-w4a16-rtn",
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        "steps[0].quantize.auto={budget_bits: 4.5, windows: 8, seq_len: 64}",
        "--json",
    )
    assert code == 0, err
    assert data["calibration"] is None and len(data["mixed_precision"]["windows"]["text"]["window_starts"]) == 8
    args = ["eval", str(out), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--seq-len", "64"]
    for region in ("second-half", "all"):  # the whole text: as many windows as it holds
        code, _, err, _ = cli(*args, "--region", region, "--max-tokens", "100000")
        assert code == 2 and "overlap the auto mixed precision windows" in err, err
        assert len(err.strip().splitlines()) == 1
    code, _, err, data = cli(*args, "--region", "first-half", "--max-tokens", "256", "--json")
    assert code == 0 and data["overlap_check"]["overlap"] is False, err
    assert data["overlap_check"]["fitted_texts"][0]["what"] == "auto mixed precision"


class _Captured(Exception):
    """Raised by the stand-in for run_eval once it has the settings the command built (the command
    then exits 1, an unexpected failure)."""


def test_every_eval_option_reaches_the_settings_the_run_uses(cli, tiny_llama, tiny_text, monkeypatch):
    """Walk `quantkit eval`'s options: each is a field of EvalSettings (but the models and what is
    done with the result), and a value other than its default arrives in the settings run_eval gets."""
    from dataclasses import fields

    import click

    import quantkit.evals.eval_runner as runner
    from quantkit.cli.eval_cmd import NOT_SETTINGS, eval_cmd
    from quantkit.evals.eval_settings import EvalSettings

    settings_fields = {f.name for f in fields(EvalSettings)}
    options = [p for p in eval_cmd.params if p.name not in NOT_SETTINGS]
    assert {p.name for p in options} == settings_fields
    special = {  # option -> (its value on the command line, the field's value in the settings)
        "texts": (f"file:{tiny_text}", (f"file:{tiny_text}",)),
        "tasks": ("qk_facts,qk_cloze", ("qk_facts", "qk_cloze")),
        "position_buckets": ("16,32", (16, 32)),
        "device": ("cpu", "cpu"),
        "seq_len": ("32", 32),
        "max_tokens": ("96", 96),
        "kv_cache": ("f16", "f16"),
        "flash_attn": ("on", True),
        "engine": ("llamacpp", "llamacpp"),
    }
    args, expected = [], {}
    for p in options:
        flag = p.opts[0]
        if p.name in special:
            given, want = special[p.name]
            args += [flag, given]
        elif p.is_flag:
            args, want = [*args, flag], True
        elif isinstance(p.type, click.Choice):
            want = next(c for c in p.type.choices if c != p.default)
            args += [flag, want]
        else:
            assert p.type is click.INT, f"{flag}: give the test a value for it"
            want = (p.default or 1) + 2
            args += [flag, str(want)]
        expected[p.name] = want
    seen = []

    def capture(model, base, settings, runtime):
        seen.append(settings)
        raise _Captured

    monkeypatch.setattr(runner, "run_eval", capture)
    code, _, err, _ = cli("eval", str(tiny_llama), "--baseline", str(tiny_llama), *args)
    assert seen and "_Captured" in err, err  # the command reached the run (and stopped there)
    (got,) = seen
    defaults = EvalSettings()
    for name, want in expected.items():
        assert getattr(got, name) == want != getattr(defaults, name), name


def _full_vocabulary_kl(base_dir, model_dir, text, seq_len: int, max_tokens: int) -> tuple[float, list]:
    """By hand: both models' whole log-softmax over the eval's windows, KL(base || model) per position."""
    import torch

    from quantkit.data.text import parse_spec
    from quantkit.evals.perplexity import text_windows
    from quantkit.models.checkpoint import load_model, load_tokenizer

    tok = load_tokenizer(base_dir)
    w = text_windows(tok, parse_spec(f"file:{text}"), seq_len=seq_len, max_tokens=max_tokens, region="first-half")
    base = load_model(base_dir, dtype="float32", device=torch.device("cpu"))
    model = load_model(model_dir, dtype="float32", device=torch.device("cpu"))
    per_position = []
    with torch.inference_mode():
        for ids in w.tokens:
            lb = torch.log_softmax(base(input_ids=ids[None]).logits[0, :-1].double(), -1)
            lm = torch.log_softmax(model(input_ids=ids[None]).logits[0, :-1].double(), -1)
            per_position.append((lb.exp() * (lb - lm)).sum(-1))
    kl = torch.stack(per_position)  # [windows, seq_len - 1]
    return float(kl.mean()), kl


def test_exact_kl_end_to_end_equals_the_full_vocabulary_kl_by_hand(cli, tiny_dir, tiny_text, tmp_path):
    """The tiny model's vocabulary (384) is past the top-256, so the bound falls short of it."""
    from fixtures import build_checkpoint

    other = build_checkpoint(tmp_path / "other", "llama-gqa", tiny_dir / "tokenizer", seed=1)
    base = tiny_dir / "llama-gqa"
    args = ["eval", str(other), "--baseline", str(base), "--text", f"file:{tiny_text}", "--seq-len", "64"]
    args += ["--max-tokens", "256", "--position-buckets", "16,32,128", "--json"]
    code, _, err, exact = cli(*args)
    assert code == 0, err
    code, _, err, bound = cli(*args, "--kl", "topk")
    assert code == 0, err
    hand, per_position = _full_vocabulary_kl(base, other, tiny_text, 64, 256)
    assert exact["kl_kind"] == exact["texts"][0]["kl_kind"] == "exact"
    assert bound["kl_kind"] == bound["texts"][0]["kl_kind"] == "topk-256 lower bound"
    assert exact["kld"]["mean"] == pytest.approx(hand, rel=1e-5)
    assert exact["kld"]["max"] == pytest.approx(float(per_position.max()), rel=1e-5)
    assert bound["kld"]["mean"] < exact["kld"]["mean"] and bound["ppl"] == exact["ppl"]
    # by position: [0, 16), [16, 32), [32, 63); 128 lies past a 64-token window and is dropped, said
    buckets = exact["positions"]
    assert [(b["lo"], b["hi"]) for b in buckets] == [(0, 16), (16, 32), (32, 63)]
    assert "note: --position-buckets 128: at or past the last position of a 64-token window" in err
    for b in buckets:
        assert b["kld"]["mean"] == pytest.approx(float(per_position[:, b["lo"] : b["hi"]].mean()), rel=1e-5)
    assert sum(b["tokens"] for b in buckets) == exact["tokens"]
    weighted = sum(b["tokens"] * b["kld"]["mean"] for b in buckets) / exact["tokens"]
    assert weighted == pytest.approx(exact["kld"]["mean"], rel=1e-9)
    code, out, err, _ = cli(*args[:-1])
    assert code == 0 and "KL        KL(baseline || model) over the whole vocabulary (exact)" in out
    assert "text by position in the window" in out and "     32–63 " in out
