"""Calibration mixes (`mix:NAME`): allocation math, the mix file's validation, the shipped texts,
conversions that record every part, GQA recovery drawing from every part, the eval guard."""

import hashlib
import json
import random
import sys
from pathlib import Path

import pytest
import yaml
from fixtures import CALIB_DATA, RECIPES

from quantkit.data.mix import allocate
from quantkit.data.mixconfig import load_mix
from quantkit.data.text import parse_spec, read_text
from quantkit.errors import DataError
from quantkit.gqa.mix_windows import heldout_counts, interleave

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--set", "calibration.samples=12", "--set", "calibration.seq_len=32"]


# ---------------------------------------------------------------- pure math


def test_allocate_by_weight_with_largest_remainder():
    assert allocate([0.4, 0.2, 0.2, 0.2], 128) == [51, 26, 26, 25]
    assert allocate([1, 1, 1], 2) == [1, 1, 0]  # ties go to the earlier part
    assert allocate([3, 1], 0) == [0, 0]


def test_allocate_caps_a_part_and_gives_the_rest_to_the_others():
    assert allocate([0.4, 0.2, 0.2, 0.2], 128, [500, 10, 60, 5]) == [75, 10, 38, 5]
    assert allocate([0.5, 0.5], 10, [0, None]) == [0, 10]
    assert allocate([1, 2, 3], 1000, [1, 2, 3]) == [1, 2, 3]  # every part full: the sum falls short


def test_allocate_invariants_on_random_inputs():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 6)
        weights = [rng.choice([0.05, 0.1, 0.25, 1, 3.3]) for _ in range(n)]
        cap = [rng.choice([None, 0, 1, 5, 40]) for _ in range(n)]
        total = rng.randint(0, 120)
        got = allocate(weights, total, cap)
        room = sum(c if c is not None else total for c in cap)
        assert sum(got) == min(total, room)
        assert all(g >= 0 and (c is None or g <= c) for g, c in zip(got, cap))
        free = allocate(weights, total)
        assert sum(free) == total and all(abs(f - total * w / sum(weights)) < 1 for f, w in zip(free, weights))


def test_interleave_spreads_every_part_evenly():
    counts = [410, 205, 205, 204]
    order = interleave(counts)
    assert [order.count(i) for i in range(4)] == counts
    for start in range(0, len(order) - 20, 7):  # every 20 consecutive slots hold each part near its share
        window = order[start : start + 20]
        for i, c in enumerate(counts):
            assert abs(window.count(i) - 20 * c / sum(counts)) <= 2
    assert interleave([0, 3]) == [1, 1, 1] and interleave([]) == []


def test_heldout_counts_give_every_part_one():
    assert heldout_counts([0.4, 0.2, 0.2, 0.2], 8) == [3, 2, 2, 1]
    assert heldout_counts([0.4, 0.2, 0.2, 0.2], 2) == [1, 1, 1, 1]


# ---------------------------------------------------------------- the mix file


def _mix_dir(tmp_path, monkeypatch, parts: list[dict], name="test") -> Path:
    root = tmp_path / "calib_data"
    (root / "mix").mkdir(parents=True, exist_ok=True)
    (root / "mix" / f"{name}.yaml").write_text(yaml.safe_dump({"description": "test mix", "parts": parts}))
    monkeypatch.setenv("QUANTKIT_CALIB_DATA", str(root))
    return root


@pytest.mark.parametrize(
    "parts,message",
    [
        ([{"name": "a", "weight": 1}], "exactly one of: source, chat"),
        ([{"name": "a", "weight": 0, "source": "file:x.txt"}], "parts[0].weight"),
        ([{"name": "a", "weight": 1, "source": "self"}], "source must be file:PATH or set:NAME"),
        ([{"name": "a", "weight": 1, "source": "mix:other"}], "source must be file:PATH or set:NAME"),
        ([{"name": "a", "weight": 1, "source": "file:x", "colour": "red"}], "parts[0].colour"),
        (
            [{"name": "a", "weight": 1, "source": "file:x"}, {"name": "a", "weight": 1, "source": "file:y"}],
            "names must be unique",
        ),
        ([{"name": "a", "weight": 1, "chat": {"prompts": "p.txt", "top_p": 2}}], "parts[0].chat.top_p"),
        ([], "parts"),
    ],
)
def test_bad_mix_files_are_one_line(tmp_path, monkeypatch, parts, message):
    _mix_dir(tmp_path, monkeypatch, parts)
    with pytest.raises(DataError, match="test.yaml") as err:
        parse_spec("mix:test")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_mix_lists_the_known_ones_and_invalid_yaml(tmp_path, monkeypatch):
    root = _mix_dir(tmp_path, monkeypatch, [{"name": "a", "weight": 1, "source": "file:x"}])
    with pytest.raises(DataError, match=r"mix:nope: no mix nope.yaml .*known: test"):
        parse_spec("mix:nope")
    (root / "mix" / "broken.yaml").write_text("parts: [unclosed\n")
    with pytest.raises(DataError, match="not valid YAML"):
        parse_spec("mix:broken")
    for bad in ("mix:", "mix:../x"):
        with pytest.raises(DataError):
            parse_spec(bad)


def test_a_mix_is_not_an_evaluation_text():
    assert str(parse_spec("mix:default")) == "mix:default"
    with pytest.raises(DataError, match="not one text; use one of its parts"):
        read_text(parse_spec("mix:default"))


# ---------------------------------------------------------------- what calib_data ships


def test_shipped_texts_match_their_manifests_and_name_a_license():
    for name in ("python-stdlib-code", "python-reference", "world-factbook", "shakespeare-plays", "legal-licenses"):
        manifest = yaml.safe_load((CALIB_DATA / f"{name}.yaml").read_text())
        data = (CALIB_DATA / "text" / f"{name}.txt").read_bytes()
        assert hashlib.sha256(data).hexdigest() == manifest["sha256"] and len(data) == manifest["bytes"]
        assert manifest["license"] and manifest["domain"]
        assert "bad_characters" not in read_text(parse_spec(f"set:{name}")).provenance
    assert (CALIB_DATA / "text" / "LICENSE-PSF.txt").read_text().count(
        "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2"
    ) == 1
    total = sum(p.stat().st_size for p in (CALIB_DATA).rglob("*") if p.is_file())
    assert total < 2_500_000  # the repository stays small


def test_the_default_mix_spans_domains_and_never_reads_the_evaluation_only_text():
    mix = load_mix("default")
    domains = {p.domain for p in mix.parts}
    assert {"encyclopedic", "code", "technical prose", "chat"} <= domains
    assert all(p.license for p in mix.parts)
    assert "set:legal-licenses" not in {p.source for p in mix.parts}
    assert "set:shakespeare-plays" not in {p.source for p in mix.parts}
    for part in mix.parts:  # every text part ships: the mix is the same on every machine
        if part.source:
            spec = parse_spec(part.source)
            assert spec.kind == "file" and Path(spec.path).is_relative_to(REPO) and spec.expect_sha256


@pytest.mark.skipif(
    sys.version.split()[0] != "3.11.7" or not Path("/usr/share/common-licenses/GPL-3").is_file(),
    reason="the shipped texts were cut from CPython 3.11.7 and Debian's common-licenses",
)
def test_build_script_reproduces_the_shipped_texts():
    sys.path.insert(0, str(REPO / "scripts"))
    import build_calib_mix

    assert build_calib_mix.main(["--check"]) == 0


# ---------------------------------------------------------------- conversions


def _parts(tmp_path, tiny_text) -> list[dict]:
    words = tiny_text.read_text()
    (tmp_path / "a.txt").write_text(words[: len(words) // 2])
    (tmp_path / "b.txt").write_text("def f(x):\n    return x + 1\n" * 800)
    (tmp_path / "calib_data").mkdir(exist_ok=True)
    (tmp_path / "calib_data" / "prompts.txt").write_text("# a comment\nSay something.\nTell me about caches.\n")
    parts = [
        {"name": "prose", "domain": "prose", "weight": 0.5, "source": f"file:{tmp_path / 'a.txt'}", "license": "test"},
        {"name": "code", "domain": "code", "weight": 0.25, "source": f"file:{tmp_path / 'b.txt'}", "license": "test"},
        {
            "name": "chat",
            "domain": "chat",
            "weight": 0.25,
            "license": "generated",
            "region": "all",
            "chat": {"prompts": "prompts.txt", "repeats": 8, "max_new_tokens": 48},
        },
    ]
    return parts


def _convert(cli, recipe, model, out, spec, *extra):
    return cli(
        "convert",
        str(RECIPES / recipe),
        "--model",
        str(model),
        "--out",
        str(out),
        "--calib",
        spec,
        *extra,
        "--json",
    )


def test_convert_records_every_part(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    _mix_dir(tmp_path, monkeypatch, _parts(tmp_path, tiny_text))
    code, _, err, data = _convert(cli, "int4-w4a16-gptq-g64.yaml", tiny_llama, tmp_path / "q", "mix:test", *SMALL)
    assert code == 0, err
    cal = data["calibration"]
    assert cal["source"] == "mix:test" and cal["kind"] == "mix" and cal["samples"] == 12
    assert len(cal["mix"]["sha256"]) == 64
    parts = {p["name"]: p for p in cal["parts"]}
    assert set(parts) == {"prose", "code", "chat"} and cal["left_out"] == []
    assert [parts[n]["samples"] for n in ("prose", "code", "chat")] == [6, 3, 3]  # 0.5 / 0.25 / 0.25 of 12
    assert parts["code"]["sha256"] == hashlib.sha256((tmp_path / "b.txt").read_bytes()).hexdigest()
    for p in parts.values():
        half = p["stream_tokens"] // 2 if p["region"] == "second-half" else 0
        assert len(p["window_starts"]) == p["samples"] and all(s >= half for s in p["window_starts"]) and p["license"]
    assert [parts[n]["region"] for n in ("prose", "code", "chat")] == ["second-half", "second-half", "all"]
    assert parts["chat"]["source"] == "generated" and parts["chat"]["conversations"] == 16
    assert cal["domains"] == {"prose": 6, "code": 3, "chat": 3}
    # the artifact's recipe says what was asked; its card names the mix and its domains
    assert data["recipe"]["calibration"]["source"] == "mix:test"
    card = (tmp_path / "q" / "README.md").read_text()
    assert "calibration: mix:test" in card and "samples per domain: prose 6, code 3, chat 3" in card


def test_the_chat_part_is_generated_once(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    _mix_dir(tmp_path, monkeypatch, _parts(tmp_path, tiny_text))
    code, _, err, first = _convert(cli, "int4-w4a16-gptq-g64.yaml", tiny_llama, tmp_path / "a", "mix:test", *SMALL)
    assert code == 0, err
    import quantkit.data.chat as cc

    monkeypatch.setattr(cc, "_replies", lambda *a, **k: pytest.fail("generated again"))
    code, _, err, second = _convert(cli, "int4-w4a16-gptq-g64.yaml", tiny_llama, tmp_path / "b", "mix:test", *SMALL)
    assert code == 0, err
    assert first["calibration"]["parts"] == second["calibration"]["parts"]


def test_sensitivity_caches_generated_text_under_the_models_own_hash(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    """The chat part is the model's own replies: cached under its checkpoint's hash, so another
    model never reads them, and built before a rotation touches the weights."""
    from quantkit.models.checkpoint import checkpoint_hash

    _mix_dir(tmp_path, monkeypatch, _parts(tmp_path, tiny_text))
    for extra in ([], ["--spinquant", "R1"]):
        code, _, err, sens = cli(
            "sensitivity",
            str(tiny_llama),
            "--budget",
            "4.6",
            "--text",
            "mix:test",
            "--windows",
            "4",
            "--seq-len",
            "32",
            "--device",
            "cpu",
            *extra,
            "--json",
        )
        assert code == 0, err
        chat = next(p for p in sens["text"]["parts"] if p["name"] == "chat")
        assert chat["source"] == "generated" and chat["model_hash"] == checkpoint_hash(tiny_llama)
        if not extra:
            import quantkit.data.chat as cc

            first = sens["text"]["parts"]
            monkeypatch.setattr(
                cc, "_replies", lambda *a, **k: pytest.fail("generated again")
            )  # the rotated run reuses them
    assert sens["rotations"] == ["R1"] and sens["text"]["parts"] == first


def test_a_missing_part_stops_before_the_model_loads(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    parts = _parts(tmp_path, tiny_text)
    parts[1]["source"] = f"file:{tmp_path / 'gone.txt'}"
    _mix_dir(tmp_path, monkeypatch, parts)
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))
    code, _, err, _ = _convert(cli, "gqa.yaml", tiny_llama, tmp_path / "a", "mix:test", *SMALL)
    assert code == 2 and "gone.txt: no such text file" in err and len(err.strip().splitlines()) == 1
    assert "part 'code'" in err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("damage", ["absent", "changed"])
def test_a_missing_or_changed_set_part_is_an_error_not_a_reweighting(tmp_path, monkeypatch, tiny_text, damage):
    """A part named through a manifest (`set:`) that is absent or differs from its sha256 stops the mix."""
    from quantkit.data import mix as calib_mix

    root = _mix_dir(tmp_path, monkeypatch, [{"name": "a", "weight": 1, "source": "set:mine"}])
    text = tmp_path / "mine.txt"
    text.write_text(tiny_text.read_text())
    digest = hashlib.sha256(text.read_bytes()).hexdigest()
    (root / "mine.yaml").write_text(yaml.safe_dump({"source": f"file:{text}", "sha256": digest}))
    calib_mix.check("test")  # intact: fine
    if damage == "absent":
        text.unlink()
    else:
        text.write_text(tiny_text.read_text() + " one more word")
    with pytest.raises(DataError, match="part 'a'"):
        calib_mix.check("test")


def test_gqa_recovery_draws_from_every_part(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    _mix_dir(tmp_path, monkeypatch, _parts(tmp_path, tiny_text))
    rec = "{tokens: 2048, max_minutes: 5, seq_len: 32, batch_size: 4, eval_every: 4, heldout_windows: 4}"
    out = tmp_path / "g"
    code, _, err, data = _convert(
        cli, "gqa.yaml", tiny_llama, out, "mix:test", *SMALL, "--set", f"steps[0].gqa.recover={rec}"
    )
    assert code == 0, err
    w = data["gqa"]["recover"]["windows"]
    assert w["source"] == "mix:test" and w["train"] == 2048 // 32 and w["heldout"] == 4 and "slots" not in w
    parts = {p["name"]: p for p in w["parts"]}
    assert [len(parts[n]["heldout_starts"]) for n in ("prose", "code", "chat")] == [2, 1, 1]
    used = sum(p["train_used"] for p in parts.values())
    assert used == w["train_used"] == data["gqa"]["recover"]["steps"] * 4
    assert parts["prose"]["train_used"] == pytest.approx(used / 2, abs=2)  # the weights hold in the visited prefix
    calib = {p["name"]: p for p in data["calibration"]["parts"]}
    assert [parts[n]["region"] for n in ("prose", "code", "chat")] == ["second-half", "second-half", "all"]
    for name, p in parts.items():
        half = p["stream_tokens"] // 2 if p["region"] == "second-half" else 0
        assert all(s >= half for s in p["train_starts"] + p["heldout_starts"])
        assert not set(p["train_starts"]) & set(p["heldout_starts"])
        cal = [(s, s + calib[name]["seq_len"]) for s in calib[name]["window_starts"]]
        assert not any(
            a < e and s < a + 32 for a in p["heldout_starts"] for s, e in cal
        )  # held out from the merge's windows too
        assert p["sha256"] == calib[name]["sha256"]


def test_eval_refuses_windows_a_mix_part_was_fitted_on(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    _mix_dir(tmp_path, monkeypatch, _parts(tmp_path, tiny_text))
    out = tmp_path / "q"
    code, _, err, _ = _convert(cli, "int4-w4a16-gptq-g64.yaml", tiny_llama, out, "mix:test", *SMALL)
    assert code == 0, err
    args = [
        "eval",
        str(out),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tmp_path / 'b.txt'}",
        "--seq-len",
        "32",
        "--max-tokens",
        "100000",
    ]
    code, _, err, _ = cli(*args, "--region", "second-half")
    assert code == 2 and "overlap the calibration" in err
    code, _, err, ev = cli(*args[:-1], "512", "--region", "first-half", "--json")  # a few windows are enough here
    assert code == 0, err
    assert any(r["source"] == f"file:{tmp_path / 'b.txt'}" for r in ev["overlap_check"]["fitted_texts"])


def test_run_key_follows_the_mix(tmp_path, monkeypatch, tiny_text):
    from quantkit.data.mix import fingerprint

    root = _mix_dir(tmp_path, monkeypatch, _parts(tmp_path, tiny_text))
    before = fingerprint("test")
    assert fingerprint("test") == before
    data = yaml.safe_load((root / "mix" / "test.yaml").read_text())
    data["parts"][0]["weight"] = 0.6
    (root / "mix" / "test.yaml").write_text(yaml.safe_dump(data))
    assert fingerprint("test") != before


def test_mix_recovery_preflight_matches_the_runtime_check(tiny_llama, tiny_text, tmp_path, monkeypatch):
    """The preflight (text parts only, before the model loads) refuses exactly when recovery would."""
    from types import SimpleNamespace

    import torch

    from quantkit.gqa.mix_windows import mix_recovery_windows, preflight_mix_recovery
    from quantkit.models.checkpoint import load_tokenizer
    from quantkit.recipe.schema import RecoverConfig

    parts = _parts(tmp_path, tiny_text)[:2]  # prose + code: no generation needed
    (tmp_path / "b.txt").write_text("def f(x):\n    return x + 1\n" * 40)  # a short code part
    _mix_dir(tmp_path, monkeypatch, parts)
    tok = load_tokenizer(tiny_llama)
    empty = SimpleNamespace(samples=[torch.zeros(1, 8, dtype=torch.long)], manifest={"parts": []})
    outcomes = set()
    for seq_len in (16, 64, 256):
        for heldout in (1, 4, 12):
            rec = RecoverConfig(seq_len=seq_len, heldout_windows=heldout, batch_size=2, tokens=4096)
            try:
                w = mix_recovery_windows(tok, "test", rec, empty, "k")
                ok = True
                assert len(w.heldout) == max(heldout, 2) and len(w.train) == 4096 // seq_len
            except DataError as exc:
                ok = False
                assert "part 'code' too short" in str(exc)
            try:
                preflight_mix_recovery(tok, "test", rec, "k")
                assert ok, (seq_len, heldout)
            except DataError:
                assert not ok, (seq_len, heldout)
            outcomes.add(ok)
    assert outcomes == {True, False}


def test_a_base_model_without_chat_template_leaves_the_chat_part_out(tiny_llama, tiny_text, tmp_path, monkeypatch):
    from quantkit.data.mix import build_mix
    from quantkit.models.checkpoint import load_tokenizer

    _mix_dir(tmp_path, monkeypatch, _parts(tmp_path, tiny_text))
    tok = load_tokenizer(tiny_llama)
    tok.chat_template = None
    cs = build_mix(
        tok, "test", samples=9, seq_len=32, seed=0, region="second-half", chat_template=False
    )  # no model needed
    assert [p["name"] for p in cs.manifest["parts"]] == ["prose", "code"] and cs.manifest["samples"] == 9
    assert cs.manifest["left_out"][0]["name"] == "chat" and "no chat template" in cs.manifest["left_out"][0]["reason"]
    assert cs.manifest["domains"] == {"prose": 6, "code": 3}  # 0.5 : 0.25, renormalised


def test_run_on_a_mix_reuses_the_artifact_until_the_mix_changes(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    """`quantkit run --calib mix:NAME` (what the quickstart does): the
    convert step's key covers the mix file, so a changed weight re-converts."""
    root = _mix_dir(tmp_path, monkeypatch, _parts(tmp_path, tiny_text))
    suite = tmp_path / "suite.yaml"
    (tmp_path / "gptq.yaml").write_text((RECIPES / "int4-w4a16-gptq-g64.yaml").read_text())
    suite.write_text("variants:\n  - name: int4\n    recipe: gptq.yaml\n")
    args = [
        "run",
        str(suite),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "run"),
        "--calib",
        "mix:test",
        "--eval-text",
        f"file:{tmp_path / 'b.txt'}",
        *SMALL,
        "--set",
        "eval.seq_len=32",
        "--set",
        "eval.max_tokens=64",
        "--skip-bench",
        "--json",
    ]
    code, _, err, rep = cli(*args)
    assert code == 0, err
    meta = json.loads((tmp_path / "run" / "artifacts" / "int4" / "quantkit.json").read_text())
    assert meta["calibration"]["source"] == "mix:test" and {p["name"] for p in meta["calibration"]["parts"]} == {
        "prose",
        "code",
        "chat",
    }
    code, _, err, _ = cli(*args)
    assert code == 0 and "[int4] convert: reusing" in err
    data = yaml.safe_load((root / "mix" / "test.yaml").read_text())
    data["parts"][0]["weight"] = 0.6
    (root / "mix" / "test.yaml").write_text(yaml.safe_dump(data))
    code, _, err, _ = cli(*args)
    assert code == 0 and "[int4] convert\n" in err and "[int4] convert: reusing" not in err


def test_the_chat_part_generates_only_what_its_windows_need_and_the_same_everywhere(tiny_llama, tmp_path, monkeypatch):
    """Generation runs in fixed seeded batches, only as many as the request's tokens need; a later,
    larger request extends the cache; a small request afterwards gets exactly what a fresh machine
    would (the first batches), not a window choice over everything generated so far."""
    import torch

    import quantkit.data.chat as cc
    from quantkit.data.mixconfig import ChatPart
    from quantkit.models.checkpoint import load_tokenizer

    tok, model = load_tokenizer(tiny_llama), torch.nn.Linear(1, 1)  # the model: only its dtype and device are read
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Question number {i}?" for i in range(5)))  # x 8 repeats: 40 asked, 3 batches of 16
    cfg = ChatPart(prompts="prompts.txt", repeats=8, max_new_tokens=8)
    calls = []

    def replies(model, tok, asked, cfg, seed):
        calls.append(seed)
        return [f"answer {seed} {i} " * 3 for i in range(len(asked))]

    monkeypatch.setattr(cc, "_replies", replies)

    def stream(home, need):
        monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / home))
        return cc.chat_stream(model, tok, cfg, prompts, seed=3, model_hash="h", tokens_needed=need)

    small, prov = stream("one", 10)
    assert len(calls) == 1 and prov["conversations"] == 16 and prov["of_prompts"] == 40
    full, prov_full = stream("one", None)
    assert len(calls) == 3 and prov_full["conversations"] == 40  # two more batches, the first from the cache
    assert torch.equal(full[: len(small)], small)
    again, prov_again = stream("one", 10)
    fresh, prov_fresh = stream("two", 10)
    assert (
        len(calls) == 4 and torch.equal(again, small) and prov_again["sha256"] == prov_fresh["sha256"] == prov["sha256"]
    )
    _, prov_two = stream("one", len(small) + 1)  # one token past the first batch: the second, no more
    assert len(calls) == 4 and prov_two["conversations"] == 32
