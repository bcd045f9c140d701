"""The self-check before timing : KL against transformers' load of the artifact,
recorded in the JSON, and no speed reported for a model that computes something else."""

import pytest
import torch
from fixtures import RECIPES

from quantkit.bench import selfcheck
from quantkit.evals.accuracy_stats import kl_full

FAST = ["--prompt-len", "16", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--warmups", "0", "--json"]


@pytest.fixture(scope="module")
def int4_art(tiny_llama, tmp_path_factory):
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    out = tmp_path_factory.mktemp("art") / "int4"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTKIT_HOME", str(out.parent / "home"))
        res = CliRunner().invoke(
            group,
            [
                "convert",
                str(RECIPES / "int4-w4a16-rtn.yaml"),
                "--model",
                str(tiny_llama),
                "--set",
                "steps[0].quantize.group_size=32",
                "--out",
                str(out),
                "--json",
            ],
            catch_exceptions=False,
        )
    assert res.exit_code == 0, res.stderr
    return out


def test_bucket_kl_is_exact_on_full_rows_and_a_lower_bound_on_partial_ones():
    g = torch.Generator().manual_seed(0)
    a = torch.log_softmax(torch.randn(4, 50, generator=g), -1)
    b = torch.log_softmax(torch.randn(4, 50, generator=g), -1)
    exact = kl_full(a, b)
    assert torch.allclose(selfcheck.kl_rows(a, b), exact)
    top = b.topk(10, -1).indices
    partial = torch.full_like(b, float("nan")).scatter(-1, top, b.gather(-1, top))
    lower = selfcheck.kl_rows(a, partial)
    assert (lower <= exact + 1e-6).all() and (lower > 0).all()
    assert torch.allclose(
        selfcheck.kl_rows(a, torch.full_like(a, float("nan")).scatter(-1, top, a.gather(-1, top))),
        torch.zeros(4),
        atol=1e-6,
    )


def test_compare_threshold_and_non_finite():
    a = torch.log_softmax(torch.randn(3, 20), -1)
    assert selfcheck.compare(a, a)["passed"] and selfcheck.compare(a, a)["mean_kl"] == pytest.approx(0.0, abs=1e-7)
    far = torch.log_softmax(torch.randn(3, 20) * 5, -1)
    res = selfcheck.compare(a, far)
    assert not res["passed"] and res["mean_kl"] > selfcheck.THRESHOLD
    bad = a.clone()
    bad[1, 3] = float("nan")
    assert selfcheck.compare(a, bad)["reason"] == "non-finite log-probabilities"
    assert selfcheck.THRESHOLD >= 10 * 3.9e-3  # above the measured bf16/INT4 noise by an order of magnitude


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("partial", [False, True], ids=["full", "top-k"])
def test_a_non_finite_reference_fails_the_self_check(value, partial):
    """The reference's NaN made the KL NaN, which compares false with the threshold: failed by name."""
    a = torch.log_softmax(torch.randn(3, 20), -1)
    ref = a.clone()
    ref[0, 2] = value
    res = selfcheck.compare(ref, a, partial=partial)
    assert res["status"] == "failed" and not res["passed"]
    assert res["reason"] == "non-finite reference log-probabilities"


def test_self_check_passes_and_is_recorded(cli, int4_art):
    code, _, err, data = cli("bench", str(int4_art), *FAST, "--engine", "eager")
    assert code == 0, err
    check = data["rows"][0]["self_check"]
    assert check["status"] == "passed" and 0 <= check["mean_kl"] < selfcheck.THRESHOLD
    assert check["positions"] == 4 and check["exact"] and check["reference_dtype"] == "float32"
    assert "transformers" in check["reference"]


@pytest.mark.parametrize("corruption", ["groups_reversed", "zero_point_off"])
def test_self_check_refuses_a_wrong_scale_layout(cli, int4_art, tiny_llama, monkeypatch, corruption):
    """The bench's loader reading the scales in the wrong layout still runs, and would be timed:
    the self-check refuses it (exit 1, the KL in the JSON, no speed)."""
    import quantkit.bench.loader as loader

    real = loader._unpack

    def wrong(sd, prefix, scheme):
        q, scale, zp = real(sd, prefix, scheme)
        if corruption == "groups_reversed":
            return q, scale.flip(-1), zp
        return q, scale, torch.full((q.shape[0], scale.shape[-1]), 3, dtype=torch.int8)

    monkeypatch.setattr(loader, "_unpack", wrong)
    out_json = int4_art.parent / f"res-{corruption}.json"
    code, out, err, _ = cli(
        "bench", str(int4_art), str(tiny_llama), *FAST[:-1], "--engine", "eager", "--out", str(out_json)
    )
    assert code == 1
    assert "not benchmarked: int4-w4a16-rtn: self-check failed: next-token mean KL" in out
    import json

    data = json.loads(out_json.read_text())
    assert [r["name"] for r in data["rows"]] == ["llama-gqa"]  # the dense model is still timed
    failed = data["failed"][0]
    assert failed["self_check"]["mean_kl"] > selfcheck.THRESHOLD and not failed["self_check"]["passed"]
    assert "tpot_ms" not in failed


def test_no_self_check_is_recorded(cli, int4_art, monkeypatch):
    monkeypatch.setattr(selfcheck, "reference_logprobs", lambda *a, **k: pytest.fail("loaded a reference"))
    code, _, err, data = cli("bench", str(int4_art), *FAST, "--engine", "eager", "--no-self-check")
    assert code == 0, err
    assert data["rows"][0]["self_check"] == {"status": "skipped", "reason": "--no-self-check"}
