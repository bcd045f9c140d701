"""The llama.cpp scorer's exact KL: llama.cpp's whole rows of a GGUF against the baseline's whole
rows (recomputed from its cached pass), equal to the full-vocabulary KL computed by hand; the
top-256 bound below it."""

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from fixtures import RECIPES
from installed import needs_llama_cpp


@pytest.fixture(scope="module")
def int4_gguf(tiny_dir, tmp_path_factory) -> Path:
    """A Q4_0 GGUF of an RTN g32 INT4 artifact of the fixture."""
    from quantkit.cli import cli as group

    root = tmp_path_factory.mktemp("llamacpp-kl")
    env = {"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}
    recipe = RECIPES / "int4-w4a16-rtn.yaml"
    for args in (
        ["convert", str(recipe), "--model", str(tiny_dir / "llama-gqa"), "--out", str(root / "int4")],
        ["export", str(root / "int4"), "--format", "gguf", "--out", str(root / "int4.gguf")],
    ):
        extra = ["--set", "steps[0].quantize.group_size=32"] if args[0] == "convert" else []
        res = CliRunner().invoke(group, [*args, *extra], catch_exceptions=False, env=env)
        assert res.exit_code == 0, res.stderr
    return root / "int4.gguf"


@needs_llama_cpp
def test_llamacpp_exact_kl_equals_the_full_vocabulary_kl_by_hand(cli, int4_gguf, tiny_dir, tiny_text):
    from quantkit.bench.engines.engine import EngineSettings
    from quantkit.bench.engines.llamacpp_engine import Engine
    from quantkit.data.text import parse_spec
    from quantkit.evals.perplexity import text_windows
    from quantkit.models.checkpoint import load_model, load_tokenizer

    base = tiny_dir / "llama-gqa"
    args = ["eval", "--engine", "llamacpp", str(int4_gguf), "--baseline", str(base), "--text", f"file:{tiny_text}"]
    args += ["--seq-len", "32", "--max-tokens", "128", "--json"]
    code, _, err, exact = cli(*args)
    assert code == 0, err
    code, _, err, bound = cli(*args, "--kl", "topk")
    assert code == 0, err
    assert exact["kl_kind"] == exact["texts"][0]["kl_kind"] == "exact" and exact["scorer"]["engine"] == "llamacpp"
    assert bound["kl_kind"] == "topk-256 lower bound"
    # by hand: llama.cpp's rows of the GGUF and transformers' rows of the baseline, float64, whole vocabulary
    w = text_windows(
        load_tokenizer(base), parse_spec(f"file:{tiny_text}"), seq_len=32, max_tokens=128, region="first-half"
    )
    assert list(w.starts) == exact["windows"]["window_starts"]
    model = load_model(base, dtype="float32", device=torch.device("cpu"))
    engine = Engine.load(int4_gguf, EngineSettings(device=torch.device("cpu"), max_tokens=32))
    try:
        kl = []
        with torch.inference_mode():
            for ids in w.tokens:
                lb = torch.log_softmax(model(input_ids=ids[None]).logits[0, :-1].double(), -1)
                lm = torch.as_tensor(engine.window_logprobs([int(t) for t in ids])[:-1]).double()
                lm = torch.log_softmax(lm, -1)  # float32 rows renormalised in float64
                kl.append((lb.exp() * (lb - lm)).sum(-1))
    finally:
        engine.close()
    hand = torch.cat(kl)
    assert exact["kld"]["mean"] == pytest.approx(float(hand.mean()), rel=1e-4)
    assert exact["kld"]["p99"] == pytest.approx(float(torch.quantile(hand, 0.99)), rel=1e-3)
    assert 0 < bound["kld"]["mean"] <= exact["kld"]["mean"] and bound["ppl"] == exact["ppl"]
