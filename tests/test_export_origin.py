"""A GGUF carries its origin: `quantkit.source.sha256` is the checkpoint the artifact was converted
from, `quantkit.artifact.sha256` the artifact, `quantkit.provenance` the texts it was fitted on. So
`eval --engine llamacpp` makes the same baseline and overlap checks for a GGUF moved away from its
export record as for one beside it, and says so loudly when a GGUF's origin is unknown."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures import RECIPES
from gguf_helpers import without_quantkit_keys
from installed import needs_llama_cpp

SMALL_CALIB = ["--set", "calibration.samples=8", "--set", "calibration.seq_len=64"]


@pytest.fixture(scope="module")
def ggufs(tiny_dir, tiny_text, tmp_path_factory) -> dict[str, Path]:
    """A GPTQ artifact calibrated on the fixture text; its GGUF beside its record, the same GGUF moved
    to another folder alone, a copy without quantkit's keys, and the F16 GGUF of the source itself."""
    from quantkit.cli import cli as group

    root = tmp_path_factory.mktemp("export-origin")
    src = root / "src"
    shutil.copytree(tiny_dir / "llama-gqa", src)
    env = {"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}

    def run(*args):
        res = CliRunner().invoke(group, list(args), catch_exceptions=False, env=env)
        assert res.exit_code == 0, res.stderr

    run(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(src),
        "--out",
        str(root / "art"),
        "--calib",
        f"file:{tiny_text}",
        *SMALL_CALIB,
    )
    run("export", str(root / "art"), "--format", "gguf", "--out", str(root / "beside" / "int4.gguf"))
    run("export", str(src), "--format", "gguf", "--out", str(root / "f16" / "f16.gguf"))
    (root / "moved").mkdir()
    shutil.copy(root / "beside" / "int4.gguf", root / "moved" / "int4.gguf")
    without_quantkit_keys(root / "moved" / "int4.gguf", root / "moved" / "foreign.gguf")
    return {
        "src": src,
        "art": root / "art",
        "beside": root / "beside" / "int4.gguf",
        "moved": root / "moved" / "int4.gguf",
        "foreign": root / "moved" / "foreign.gguf",
        "f16": root / "f16" / "f16.gguf",
    }


def test_the_gguf_names_the_checkpoint_converted_from_and_the_artifact(ggufs):
    from quantkit.gguf.read import open_reader, origin
    from quantkit.models.checkpoint import checkpoint_hash

    meta = json.loads((ggufs["art"] / "quantkit.json").read_text())
    o = origin(open_reader(ggufs["moved"]))
    assert o.source_sha256 == checkpoint_hash(ggufs["src"]) == meta["source"]["sha256"]
    assert o.artifact_sha256 == checkpoint_hash(ggufs["art"]) != o.source_sha256
    assert o.provenance["source"]["sha256"] == o.source_sha256 and o.provenance["calibration"] == meta["calibration"]
    record = json.loads(ggufs["beside"].with_name("int4.quantkit.json").read_text())
    assert record["origin"]["sha256"] == o.source_sha256 and record["source"]["sha256"] == o.artifact_sha256
    f16 = origin(open_reader(ggufs["f16"]))  # a checkpoint that records no conversion is its own origin
    assert f16.source_sha256 == f16.artifact_sha256 == checkpoint_hash(ggufs["src"]) and f16.provenance is None


def test_a_moved_gguf_is_checked_from_what_it_carries(ggufs, tiny_dir, capsys):
    from quantkit.errors import DataError
    from quantkit.evals.checks import check_baseline, fitted_texts
    from quantkit.evals.gguf import source_meta
    from quantkit.models.checkpoint import checkpoint_hash

    beside, _, _ = source_meta(ggufs["beside"])
    moved, exported_from, found = source_meta(ggufs["moved"])
    assert (
        "quantkit.provenance" in found["found_via"]
        and "warning" not in found
        and exported_from == checkpoint_hash(ggufs["src"])
    )
    assert moved["source"]["sha256"] == beside["source"]["sha256"] == exported_from
    assert [r["starts"] for r in fitted_texts(moved)] == [r["starts"] for r in fitted_texts(beside)] != [[]]
    other = tiny_dir / "llama-mha"
    with pytest.raises(DataError, match="is not the checkpoint"):
        check_baseline(ggufs["moved"], other, moved, checkpoint_hash(other), False)
    assert "warning" not in capsys.readouterr().err


def test_an_unknown_origin_is_a_warning_on_stderr_and_in_the_record(ggufs, capsys):
    from quantkit.evals.gguf import source_meta

    meta, exported_from, found = source_meta(ggufs["foreign"])
    assert meta == {} and exported_from is None
    assert found["found_via"] == "unknown origin" and "unknown origin" in found["warning"]
    assert found["warning"] in capsys.readouterr().err


EVAL = ["--seq-len", "64", "--json"]


@needs_llama_cpp
@pytest.mark.parametrize("which", ["beside", "moved"])
def test_eval_refuses_another_baseline_with_or_without_the_record(cli, ggufs, tiny_dir, tiny_text, which):
    other = tiny_dir / "llama-mha"  # the same vocabulary, another model
    code, _, err, _ = cli(
        "eval",
        "--engine",
        "llamacpp",
        str(ggufs[which]),
        "--baseline",
        str(other),
        "--text",
        f"file:{tiny_text}",
        "--max-tokens",
        "128",
        *EVAL,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not the checkpoint" in err, err


@needs_llama_cpp
@pytest.mark.parametrize("which", ["beside", "moved"])
def test_eval_refuses_the_calibration_text_with_or_without_the_record(cli, ggufs, tiny_text, which):
    code, _, err, _ = cli(
        "eval",
        "--engine",
        "llamacpp",
        str(ggufs[which]),
        "--baseline",
        str(ggufs["src"]),
        "--text",
        f"file:{tiny_text}",
        "--region",
        "second-half",
        "--max-tokens",
        "1000000",
        *EVAL,
    )
    assert code == 2 and "overlap the calibration windows" in err, err


@needs_llama_cpp
def test_eval_of_a_moved_gguf_against_its_source(cli, ggufs, tiny_text):
    code, _, err, data = cli(
        "eval",
        "--engine",
        "llamacpp",
        str(ggufs["moved"]),
        "--baseline",
        str(ggufs["src"]),
        "--text",
        f"file:{tiny_text}",
        "--max-tokens",
        "128",
        *EVAL,
    )
    assert code == 0, err
    assert data["baseline_check"]["match"] is True and "quantkit.provenance" in data["baseline_check"]["found_via"]


@needs_llama_cpp
def test_eval_of_a_gguf_of_unknown_origin_warns_and_records_it(cli, ggufs, tiny_dir, tiny_text):
    code, _, err, data = cli(
        "eval",
        "--engine",
        "llamacpp",
        str(ggufs["foreign"]),
        "--baseline",
        str(tiny_dir / "llama-mha"),
        "--text",
        f"file:{tiny_text}",
        "--max-tokens",
        "128",
        *EVAL,
    )
    assert code == 0, err
    assert "unknown origin" in err and data["baseline_check"]["match"] is None
    assert (
        data["baseline_check"]["found_via"] == "unknown origin"
        and "unknown origin" in data["baseline_check"]["warning"]
    )
