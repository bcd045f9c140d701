"""Eval results as records (core/eval_results.py): one JSON form with a schema version, the keys
scripts read kept, older files read through the migration, a bad key one line where it is read."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from quantkit.core.eval_results import (
    KL_EXACT,
    PRIMARY_KEYS,
    SCHEMA_VERSION,
    EvalResult,
    Interval95,
    KLSummary,
    PositionBucket,
    TaskDelta,
    TextResult,
    WindowsInfo,
    topk_kind,
)
from quantkit.core.record_checks import RecordError

V1 = Path(__file__).with_name("eval_v1.json")  # `quantkit run`'s eval of the demo's INT4 GPTQ g64, before schema 2


def _result() -> EvalResult:
    kld = KLSummary(0.3, 0.2, 2.0, 7.0)
    ci = Interval95((1.0, 3.0), (0.25, 0.35))
    bucket = PositionBucket(0, 511, 4088, 22.0, 17.0, 29.4, kld, 0.74, ci)
    text = TextResult(
        label="world-factbook",
        text="set:world-factbook",
        ppl=22.0,
        baseline_ppl=17.0,
        delta_ppl_pct=29.4,
        kld=kld,
        kl_kind=KL_EXACT,
        top1_agreement=0.74,
        ci95=ci,
        tokens=4088,
        positions=(bucket,),
        score_seconds=7.5,
        baseline_cached=True,
        windows=WindowsInfo(512, 8, 8, tuple(range(0, 4096, 512)), {"source": "set:world-factbook", "split": "all"}),
        overlap_check={"checked": []},
    )
    task = TaskDelta("acc", 0.5, 0.1, 0.6, 0.1, -0.1, 0.05, 20, "paired per-item differences")
    return EvalResult(
        model="out/int4",
        baseline="demo",
        engine="transformers",
        baseline_engine="transformers",
        split="all",
        dtype="float32",
        device={"device": "cpu"},
        baseline_check={"match": True},
        kl_kind=KL_EXACT,
        texts=(text, replace(text, label="shakespeare-plays", text="set:shakespeare-plays")),
        tasks={"qk_facts": task},
        tasks_backend="hf",
        scorer={"engine": "transformers", "batch_size": 1},
        primary_text="world-factbook",
        seconds=12.0,
    )


def test_a_result_round_trips_through_its_json_with_a_schema_version_and_the_one_text_keys():
    r = _result()
    data = json.loads(json.dumps(r.to_json()))
    assert data["kind"] == "quantkit-eval" and data["schema_version"] == SCHEMA_VERSION
    assert data["kl_kind"] == "exact" and all(t["kl_kind"] == "exact" for t in data["texts"])
    # what scripts written for one text read, at the top level: the first text's figures
    assert data["delta_ppl_pct"] == 29.4 and data["kld"]["mean"] == 0.3 and data["top1_agreement"] == 0.74
    assert data["windows"]["count"] == 8 and data["windows"]["source"] == "set:world-factbook"
    assert set(PRIMARY_KEYS) <= set(data) and data["positions"][0]["lo"] == 0
    assert EvalResult.from_json(data) == r


def test_a_non_finite_figure_is_null_in_the_json_and_nan_when_read():
    from quantkit.core.atomic import strict_json

    r = _result()
    one = replace(r.texts[0], ci95=Interval95((float("nan"),) * 2, (float("nan"),) * 2))  # a single window
    data = json.loads(strict_json(replace(r, texts=(one,)).to_json()))
    assert data["texts"][0]["ci95"]["kld_mean"] == [None, None]
    back = EvalResult.from_json(data).primary.ci95.kld_mean
    assert all(v != v for v in back)  # NaN


def test_a_schema_1_result_reads_as_a_bound_without_buckets():
    old = json.loads(V1.read_text())
    assert "schema_version" not in old and old["kl_method"].startswith("top-256")
    r = EvalResult.from_json(old)
    assert r.kl_kind == topk_kind(256) == "topk-256 lower bound" and r.schema_version == SCHEMA_VERSION
    assert [t.label for t in r.texts] == ["world-factbook", "shakespeare-plays"]
    assert all(t.kl_kind == r.kl_kind and t.positions == () for t in r.texts)
    assert r.primary.kld.mean == old["texts"][0]["kld"]["mean"] and r.primary.windows.count == 8
    again = r.to_json()
    assert again["schema_version"] == SCHEMA_VERSION and "kl_method" not in again
    assert EvalResult.from_json(again) == r
    # the baseline against itself was exact in schema 1 too (KL 0 from the baseline pass)
    same = {
        **old,
        "texts": [{**t, "kl_method": "identical checkpoint: computed from the baseline pass"} for t in old["texts"]],
    }
    assert EvalResult.from_json(same).kl_kind == "exact"


@pytest.mark.parametrize(
    "break_it, needle",
    [
        (lambda d: d.update(tokenz=1), "unknown key 'tokenz'"),
        (lambda d: d["texts"][1].pop("kld"), "texts[1]: missing key 'kld'"),
        (lambda d: d["texts"][0]["kld"].update(p95=1.0), "unknown key 'p95'"),
        (lambda d: d["texts"][0].update(kl_kind="top-256"), "kl_kind 'top-256'"),
        (lambda d: d["texts"][0]["windows"].pop("count"), "missing key 'count'"),
        (lambda d: d.update(schema_version=9), "schema 9: this quantkit reads 1, 2"),
        (lambda d: d["texts"][0]["positions"][0].update(lo="x"), "positions"),
    ],
)
def test_a_bad_key_is_one_line_where_the_file_is_read(break_it, needle):
    data = json.loads(json.dumps(_result().to_json()))
    break_it(data)
    with pytest.raises(RecordError) as exc:
        EvalResult.from_json(data)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_the_model_card_reads_old_and_new_results_and_names_the_kl():
    from quantkit.artifacts.card import results_table

    old = results_table({"eval": json.loads(V1.read_text())})
    assert "world-factbook: KL divergence vs baseline, top-256 lower bound (mean / p99)" in old
    new = results_table({"eval": _result().to_json()})
    assert "KL divergence vs baseline, exact (mean / p99) | 0.3000 / 2.000 |" in new
    assert "| qk_facts acc | 0.5000 (baseline 0.6000, delta -0.1000 +- 0.0500) |" in new
