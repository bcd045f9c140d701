"""`quantkit run`'s report by position in the window: a row per bucket of each variant's domains,
beside the TPOT its bench measured at a KV depth inside the bucket where its rows have a depth
(pipeline/report.py depth_pairs), the buckets alone where they have none."""

from types import SimpleNamespace

from fixtures import RECIPES

from quantkit.core.eval_results import Interval95, KLSummary, PositionBucket
from quantkit.pipeline.accuracy import DecodeAt, PositionRow, position_table
from quantkit.pipeline.depths import depth_pairs


def _bucket(lo: int, hi: int) -> PositionBucket:
    kld = KLSummary(0.1 * hi / 512, 0.1, 0.5, 1.0)
    return PositionBucket(lo, hi, 8 * (hi - lo), 20.0, 18.0, 11.1, kld, 0.8, Interval95((9.0, 13.0), (0.05, 0.2)))


def test_each_bucket_is_paired_with_the_bench_rows_at_a_depth_inside_it():
    buckets = [_bucket(0, 512), _bucket(512, 2048), _bucket(2048, 8191)]
    rows = [
        SimpleNamespace(name="int4", engine="llamacpp", depth=d, tpot_ms=8.0 + d / 1000) for d in (0, 1024, 4096)
    ] + [SimpleNamespace(name="int4", engine="eager", depth=None, tpot_ms=30.0)]  # a row measured without --depth
    pairs = depth_pairs(buckets, rows)
    assert [(b.lo, [r.depth for r in at]) for b, at in pairs] == [(0, [0]), (512, [1024]), (2048, [4096])]
    # bench rows of a version without depths: read by attribute, no pairs, the buckets stand alone
    old = [SimpleNamespace(name="int4", engine="compiled", tpot_ms=5.0)]
    assert [at for _, at in depth_pairs(buckets, old)] == [[], [], []]


def test_the_position_table_shows_tpot_at_depth_only_where_it_was_measured():
    b = _bucket(512, 2048)
    with_depth = PositionRow("int4", "transformers", "text", "exact", b, (DecodeAt("llamacpp", 1024, 9.02),))
    table = position_table([with_depth])
    assert (
        "TPOT ms at depth" in table
        and "| int4 | text | 512–2048 | 12,288 |" in table
        and "9.02 @ 1,024 (llamacpp)" in table
    )
    assert "KL (exact) mean [95% CI]" in table
    alone = position_table([PositionRow("int4", "transformers", "text", "topk-256 lower bound", b, ())])
    assert "TPOT" not in alone and "KL (top-256 lower bound) mean" in alone
    assert PositionRow.from_json(with_depth.to_json()) == with_depth


def test_run_reports_each_variant_by_position(cli, tiny_llama, tiny_text, tmp_path):
    (tmp_path / "int4-w4a16-rtn.yaml").write_text((RECIPES / "int4-w4a16-rtn.yaml").read_text())
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "description: by position\nvariants:\n  - name: int4-rtn\n    recipe: int4-w4a16-rtn.yaml\n"
        f"eval:\n  texts: [file:{tiny_text}]\n  seq_len: 64\n  max_tokens: 256\n  position_buckets: [16, 32]\n"
    )
    sets = ["--set", "calibration.samples=4", "--set", "calibration.seq_len=64", "--skip-bench"]
    out = tmp_path / "run"
    code, _, err, rep = cli("run", str(suite), "--model", str(tiny_llama), "--out", str(out), *sets, "--json")
    assert code == 0, err
    pos = rep["positions"]
    assert [(p["name"], p["bucket"]["lo"], p["bucket"]["hi"]) for p in pos] == [
        (name, lo, hi) for name in ("baseline", "int4-rtn") for lo, hi in ((0, 16), (16, 32), (32, 63))
    ]
    assert all(p["decode"] == [] and p["kl_kind"] == "exact" for p in pos)  # no bench: the buckets alone
    ev = rep["variants"]["int4-rtn"]["eval"]
    assert ev["schema_version"] == 2 and [b["lo"] for b in ev["texts"][0]["positions"]] == [0, 16, 32]
    assert all(a["kl_kind"] == "exact" for a in rep["accuracy"]) and rep["schema_version"] == 5
    md = (out / "report.md").read_text()
    assert "**Accuracy by position in the window**" in md and "| int4-rtn | text | 32–63 |" in md
    assert "TPOT ms at depth" not in md and "KL (exact)" in md
    # a re-run reuses the stored eval, read back through its record
    code, _, err, again = cli("run", str(suite), "--model", str(tiny_llama), "--out", str(out), *sets, "--json")
    assert code == 0 and "eval: reusing" in err and again["positions"] == pos


def test_compare_names_each_run_s_kl(cli, tmp_path):
    """A run before eval named its KL (report schema 1) held the top-256 bound: compare says so, so a
    bound is never read beside an exact KL as the same figure."""
    import json

    for name, version, kind in (("old", 1, None), ("new", 2, "exact")):
        d = tmp_path / name
        d.mkdir()
        row = {"name": "int4", "tpot_ms": 10.0, "delta_ppl_pct": 5.0, "kld_mean": 0.1, "status": "ok"}
        report = {"kind": "quantkit-run", "recipe": "demo", "date": "d", "host": "h", "device": {}, "fit": None}
        (d / "report.json").write_text(
            json.dumps({**report, "schema_version": version, "rows": [{**row, **({"kl_kind": kind} if kind else {})}]})
        )
    code, _, err, data = cli("compare", str(tmp_path / "old"), str(tmp_path / "new"), "--json")
    assert code == 0, err
    (v,) = data["variants"]
    assert v["old"]["kl_kind"] == "topk-256 lower bound" and v["new"]["kl_kind"] == "exact"
    code, out, _, _ = cli("compare", str(tmp_path / "old"), str(tmp_path / "new"))
    assert "old KL (top-256 lower bound)" in out and "new KL (exact)" in out
