"""gqa.stats: the calibration pass reproduces what transformers' attention computes."""

import torch

from quantkit.gqa.gqa_layouts import LAYOUTS
from quantkit.gqa.merge_stats import _attended_values, attention_modules, moments
from quantkit.models.checkpoint import load_model


def test_attended_values_match_the_model_attention(tiny_dir):
    model = load_model(tiny_dir / "qwen2", dtype="float32")  # 4 query heads, 2 KV heads, q/k/v biases
    seen = {}

    def capture(module, args, kwargs):
        seen["hidden"], seen["pos"] = kwargs["hidden_states"], kwargs["position_embeddings"]

    def out(module, args):
        seen["attn_out"] = args[0]

    attn = attention_modules(model, LAYOUTS["qwen2"])[1]
    h1 = attn.register_forward_pre_hook(capture, with_kwargs=True)
    h2 = attn.o_proj.register_forward_pre_hook(out)
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(input_ids=ids)
        z = _attended_values(attn, seen["hidden"], *seen["pos"], 4, 2)  # (B, H, L, 2 KV heads x 32)
    h1.remove(), h2.remove()
    own = torch.stack(
        [z[:, h, :, (h // 2) * 32 : (h // 2 + 1) * 32] for h in range(4)], dim=2
    )  # each head's own KV head
    assert torch.allclose(own.reshape(2, 40, -1), seen["attn_out"], atol=1e-5)


def test_moments_shapes_and_bias_row(tiny_dir):
    model = load_model(tiny_dir / "llama-gqa", dtype="float32")
    ids = [
        torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(i)) for i in range(3)
    ]
    xs, zs = moments(model, LAYOUTS["llama"], ids, values=True)
    assert len(xs) == 2 and xs[0].shape == (129, 129) and zs[0].shape == (64, 64)
    assert torch.isclose(xs[0][-1, -1], torch.tensor(1.0, dtype=torch.float64))  # E[1 * 1]
    assert torch.allclose(xs[0], xs[0].T) and torch.linalg.eigvalsh(zs[1]).min() > -1e-6
