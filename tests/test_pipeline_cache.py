"""A run's step records are reused only when their typed from_json reads them, by key and by value:
a damaged or edited record (a negative or missing KL, a negative TPOT, a list that is null, a depth
that is text) is done again with a note, never trusted and never a TypeError that stops the run."""

import copy
import json
from pathlib import Path

import pytest

from quantkit.bench.bench_records import BenchResult
from quantkit.core.eval_results import EvalResult
from quantkit.core.record_checks import RecordError
from quantkit.pipeline.cache import StepCache
from quantkit.pipeline.serving import made_record

HERE = Path(__file__).parent


def _eval() -> dict:
    return EvalResult.from_json(json.loads((HERE / "eval_v1.json").read_text())).to_json()


def _bench() -> dict:
    return BenchResult.from_json(json.loads((HERE / "bench_v2.json").read_text())).to_json()


def _text(d):
    return d["texts"][0]


EVAL_DAMAGES = {
    "a negative KL": lambda d: _text(d)["kld"].__setitem__("mean", -0.5),
    "a KL that is null (NaN)": lambda d: _text(d)["kld"].__setitem__("mean", None),
    "a KL that is text": lambda d: _text(d)["kld"].__setitem__("p99", "0.1"),
    "a KL that is a boolean": lambda d: _text(d)["kld"].__setitem__("max", True),
    "an infinite perplexity": lambda d: _text(d).__setitem__("ppl", 1e400),
    "a zero baseline perplexity": lambda d: _text(d).__setitem__("baseline_ppl", 0),
    "ΔPPL below -100%": lambda d: _text(d).__setitem__("delta_ppl_pct", -150.0),
    "top-1 above 1": lambda d: _text(d).__setitem__("top1_agreement", 1.5),
    "no tokens": lambda d: _text(d).__setitem__("tokens", 0),
    "tokens as text": lambda d: _text(d).__setitem__("tokens", "100"),
    "texts null": lambda d: d.__setitem__("texts", None),
    "a text that is a list": lambda d: d["texts"].__setitem__(0, [1, 2]),
    "windows null": lambda d: _text(d).__setitem__("windows", None),
    "the label a number": lambda d: _text(d).__setitem__("label", 3),
    "negative seconds": lambda d: d.__setitem__("seconds", -1.0),
    "no processes": lambda d: d.__setitem__("world_size", 0),
}

BENCH_DAMAGES = {
    "a negative TPOT": lambda d: d["rows"][0].__setitem__("tpot_ms", -50.0),
    "a zero TPOT": lambda d: d["rows"][0].__setitem__("tpot_ms", 0),
    "a TPOT that is null": lambda d: d["rows"][0].__setitem__("tpot_ms", None),
    "a negative TTFT": lambda d: d["rows"][0].__setitem__("ttft_ms", -3.0),
    "negative bytes": lambda d: d["rows"][0].__setitem__("bytes_per_token", -1e6),
    "a depth that is text": lambda d: d["rows"][0].__setitem__("depth", "4096"),
    "a negative depth": lambda d: d["rows"][0].__setitem__("depth", -1),
    "a negative prompt length": lambda d: d["rows"][0].__setitem__("prompt_len", -1),
    "no generated tokens": lambda d: d["rows"][0].__setitem__("gen_len", 0),
    "rows null": lambda d: d.__setitem__("rows", None),
    "rows an object": lambda d: d.__setitem__("rows", {"a": 1}),
    "a row that is text": lambda d: d["rows"].__setitem__(0, "row"),
    "failed null": lambda d: d.__setitem__("failed", None),
    "notes null": lambda d: d["rows"][0].__setitem__("notes", None),
    "the sweep a number": lambda d: d["rows"][0].__setitem__("prompt_sweep", 3),
    "flash attention as text": lambda d: d["rows"][0].__setitem__("flash_attn", "off"),
    "settings a list": lambda d: d.__setitem__("settings", []),
}


@pytest.mark.parametrize("damage", EVAL_DAMAGES, ids=list(EVAL_DAMAGES))
def test_a_damaged_eval_record_is_refused_by_its_reader(damage):
    data = _eval()
    EVAL_DAMAGES[damage](data)
    with pytest.raises(RecordError) as info:
        EvalResult.from_json(data)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("damage", BENCH_DAMAGES, ids=list(BENCH_DAMAGES))
def test_a_damaged_bench_record_is_refused_by_its_reader(damage):
    data = _bench()
    BENCH_DAMAGES[damage](data)
    with pytest.raises(RecordError) as info:
        BenchResult.from_json(data)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "reader, make, damages",
    [(EvalResult.from_json, _eval, EVAL_DAMAGES), (BenchResult.from_json, _bench, BENCH_DAMAGES)],
    ids=["eval", "bench"],
)
def test_the_step_cache_redoes_a_record_its_reader_refuses(tmp_path, capsys, reader, make, damages):
    cache = StepCache(tmp_path / "steps.json", {"good": make()})
    assert cache.read("good", reader, "[v] step") is not None
    assert cache.read("missing", reader, "[v] step") is None
    for name, damage in damages.items():
        data = copy.deepcopy(make())
        damage(data)
        cache.data["bad"] = data
        assert cache.read("bad", reader, "[v] step") is None, name
        err = capsys.readouterr().err
        assert "[v] step: the stored result does not read (" in err and "doing it again" in err, name


def test_a_made_record_is_checked_before_its_file_is_trusted():
    good = {"gguf": "/r/gguf/a.gguf", "gguf_type": "Q4_K_M", "sha256": "ab" * 32, "bytes": 10}
    assert made_record(good) == good
    for key, bad in (("gguf", 5), ("gguf_type", None), ("sha256", None), ("bytes", -1), ("bytes", "10")):
        with pytest.raises(RecordError, match=key):
            made_record({**good, key: bad})
