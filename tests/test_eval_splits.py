"""`quantkit eval --split all|selection|confirmation`: the eval region cut in two by token position;
choices are made on selection, figures reported on confirmation."""

import json
import shutil

import pytest

from quantkit.data.text import region_windows
from quantkit.errors import DataError
from quantkit.evals.splits import SPLITS, region_range, split_range, split_windows

REGIONS = ("first-half", "second-half", "all")
SIZES = [0, 1, 7, 8, 9, 31, 64, 65, 100, 127, 1000, 4097, 12345]
ARGS = ["--seq-len", "32", "--max-tokens", "256", "--json"]


@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize("n", SIZES)
def test_selection_and_confirmation_are_disjoint_and_cover_the_region(region, n):
    lo, hi = region_range(n, region)
    (s_lo, s_hi), (c_lo, c_hi) = split_range(n, region, "selection"), split_range(n, region, "confirmation")
    assert split_range(n, region, "all") == (lo, hi)
    assert (s_lo, s_hi, c_hi) == (
        lo,
        c_lo,
        hi,
    ) and s_lo <= s_hi <= c_hi  # adjacent halves: no token in both, none left out
    assert abs((s_hi - s_lo) - (c_hi - c_lo)) <= 1


@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seq_len", [1, 8, 32])
def test_each_part_s_windows_lie_inside_it_and_all_is_today_s_windows(region, n, seq_len):
    assert split_windows(n, seq_len, region, "all") == region_windows(n, seq_len, region)
    sel, conf = (split_windows(n, seq_len, region, s) for s in ("selection", "confirmation"))
    for split, windows in (("selection", sel), ("confirmation", conf)):
        lo, hi = split_range(n, region, split)
        assert all(lo <= s and e <= hi and e - s == seq_len for s, e in windows)
        assert len(windows) == max(0, (hi - lo) // seq_len)
    assert not {t for s, e in sel for t in range(s, e)} & {t for s, e in conf for t in range(s, e)}


@pytest.mark.parametrize("split", ["", "Selection", "confirm", "held-out"])
def test_an_unknown_split_is_refused(split):
    with pytest.raises(DataError, match="use one of all, selection, confirmation"):
        split_range(100, "first-half", split)


def _eval(cli, model, base, text, *extra):
    code, _, err, data = cli("eval", str(model), "--baseline", str(base), "--text", f"file:{text}", *ARGS, *extra)
    assert code == 0, err
    return data


def test_the_json_says_which_split_was_scored_and_its_windows_stay_in_it(cli, tiny_dir, tiny_text):
    model, base = tiny_dir / "mistral", tiny_dir / "llama-gqa"  # one tokenizer, two checkpoints: real KL
    runs = {
        split: _eval(cli, model, base, tiny_text, *(("--split", split) if split != "all" else ())) for split in SPLITS
    }
    whole = runs["all"]["texts"][0]["windows"]
    assert (
        whole["window_starts"] == [s for s, _ in region_windows(whole["stream_tokens"], 32, "first-half")][: 256 // 32]
    )
    assert whole["token_range"] == [0, whole["stream_tokens"] // 2]  # the first half, as before the splits
    starts = {}
    for split, data in runs.items():
        w = data["texts"][0]["windows"]
        assert data["split"] == w["split"] == data["windows"]["split"] == split and w["region"] == "first-half"
        lo, hi = w["token_range"]
        assert all(lo <= s and s + 32 <= hi for s in w["window_starts"]) and w["count"] == 256 // 32
        starts[split] = w["window_starts"]
    sel, conf = (
        runs["selection"]["texts"][0]["windows"]["token_range"],
        runs["confirmation"]["texts"][0]["windows"]["token_range"],
    )
    assert sel[0] == whole["token_range"][0] and sel[1] == conf[0] and conf[1] == whole["token_range"][1]
    assert max(starts["selection"]) + 32 <= min(starts["confirmation"])  # no window in both
    assert runs["selection"]["ppl"] != runs["confirmation"]["ppl"]  # other tokens, other figures


def test_the_text_report_names_the_split(cli, tiny_llama, tiny_text):
    code, out, err, _ = cli(
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "32",
        "--max-tokens",
        "64",
        "--split",
        "confirmation",
    )
    assert code == 0, err
    assert "split     confirmation" in out and "confirmation: tokens" in out


def _artifact_fitted_on(tmp_path, model, text, seq_len: int, starts: list[int]):
    """A copy of `model` whose quantkit.json says it was calibrated on `text` at `starts`."""
    from quantkit.data.text import parse_spec, read_text

    art = tmp_path / f"art-{starts[0]}"
    shutil.copytree(model, art)
    sha = read_text(parse_spec(f"file:{text}")).provenance["sha256"]
    (art / "quantkit.json").write_text(
        json.dumps(
            {"calibration": {"source": f"file:{text}", "sha256": sha, "seq_len": seq_len, "window_starts": starts}}
        )
    )
    return art


def test_the_overlap_guard_applies_to_each_split(cli, tiny_llama, tiny_text, tmp_path):
    """Calibration windows inside one part: evaluating that part (or every window of the whole
    region) is refused, the other part is not; --allow-overlap still lets any of them through."""
    ranges = {
        s: _eval(cli, tiny_llama, tiny_llama, tiny_text, "--split", s)["texts"][0]["windows"]["token_range"]
        for s in ("selection", "confirmation")
    }
    for fitted, clean in (("selection", "confirmation"), ("confirmation", "selection")):
        art = _artifact_fitted_on(tmp_path, tiny_llama, tiny_text, 32, [ranges[fitted][0] + 3])
        for split in (fitted, "all"):
            code, _, err, _ = cli(
                "eval",
                str(art),
                "--baseline",
                str(tiny_llama),
                "--text",
                f"file:{tiny_text}",
                *ARGS[:-1],
                *(("--split", split) if split != "all" else ("--max-tokens", "10000000")),
            )
            assert code == 2 and "overlap the calibration windows" in err and len(err.strip().splitlines()) == 1, (
                fitted,
                split,
                err,
            )
        data = _eval(cli, art, tiny_llama, tiny_text, "--split", clean)
        assert data["overlap_check"]["overlap"] is False and data["overlap_check"]["fitted_texts"][0]["windows"] == 1
        assert _eval(cli, art, tiny_llama, tiny_text, "--split", fitted, "--allow-overlap")["overlap_check"] == {
            "allowed": True
        }


@pytest.mark.parametrize("split", ["selection", "confirmation"])
def test_self_text_has_no_parts_to_split(cli, tiny_llama, tiny_text, split):
    code, _, err, _ = cli(
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--text",
        "self",
        "--split",
        split,
        "--seq-len",
        "16",
    )
    assert code == 2 and "`self` text" in err and "--split all" in err and len(err.strip().splitlines()) == 1


def test_a_part_shorter_than_a_window_is_one_line(cli, tiny_llama, tmp_path):
    """A text with one window in its region but none in either half of it."""
    from quantkit.data.text import tokenize_stream
    from quantkit.models.checkpoint import load_tokenizer

    short = tmp_path / "short.txt"
    short.write_text("The cat sat on the mat and looked at the door. " * 8)
    n = len(tokenize_stream(load_tokenizer(tiny_llama), short.read_text()))
    seq_len = str((n + 1) // 2 + 1)  # longer than either half, no longer than the text
    args = (
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{short}",
        "--seq-len",
        seq_len,
        "--max-tokens",
        seq_len,
        "--region",
        "all",
    )
    code, _, err, _ = cli(*args)
    assert code == 0, err
    for split in ("selection", "confirmation"):
        code, _, err, _ = cli(*args, "--split", split)
        assert code == 2 and f"the {split} part of the text (tokens" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("split", ["selection", "confirmation"])
def test_fewer_windows_than_asked_names_the_part(cli, tiny_llama, tiny_text, tmp_path, split):
    short = tmp_path / "short.txt"
    short.write_text(tiny_text.read_text()[:6000])
    code, _, err, data = cli(
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{short}",
        "--seq-len",
        "32",
        "--max-tokens",
        "10000000",
        "--split",
        split,
        "--json",
    )
    assert code == 0, err
    lo, hi = data["texts"][0]["windows"]["token_range"]
    assert f"the {split} part of the first half of the text (tokens {lo:,} to {hi:,})" in err
    assert data["texts"][0]["windows"]["count"] == (hi - lo) // 32


def test_the_default_domains_hold_several_8192_token_windows_in_each_part(demo_model):
    """The demo's context is 8192 tokens: its long windows (eval --seq-len 8192, figures by position up
    to depth 8192) need the shipped default domains to hold a few in each held-out part, apart from
    the calibration half."""
    from quantkit.data.text import parse_spec, read_text, tokenize_stream
    from quantkit.evals.domains import DEFAULT_SETS
    from quantkit.models.checkpoint import load_tokenizer

    tok = load_tokenizer(demo_model)
    assert json.loads((demo_model / "config.json").read_text())["max_position_embeddings"] >= 8192
    for name in DEFAULT_SETS:
        n = len(tokenize_stream(tok, read_text(parse_spec(f"set:{name}")).text))
        parts = {s: split_windows(n, 8192, "first-half", s) for s in SPLITS}
        assert len(parts["selection"]) >= 3 and len(parts["confirmation"]) >= 3, (name, n)
        assert len(parts["all"]) >= len(parts["selection"]) + len(parts["confirmation"])
        calib_lo, _ = region_range(n, "second-half")
        sel_end = max(e for _, e in parts["selection"])
        assert sel_end <= min(s for s, _ in parts["confirmation"]) and max(e for _, e in parts["all"]) <= calib_lo
