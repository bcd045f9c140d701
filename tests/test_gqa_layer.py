"""gqa.layer on a real model: reading, compensating and writing heads back keeps the model exact."""

import torch

from quantkit.gqa import keys as K
from quantkit.gqa.gqa_layouts import LAYOUTS
from quantkit.gqa.layer import Heads, read_heads, write_heads
from quantkit.gqa.merge_stats import attention_modules
from quantkit.models.checkpoint import load_model


def _logits(model):
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_rope_commuting_compensation_with_the_identity_merge_keeps_logits(tiny_dir):
    """Each KV head stays itself but is divided per plane by a random complex c; its query heads
    take conj(c) (fold_query). RoPE commutes with c, so the logits must not move."""
    model = load_model(tiny_dir / "qwen2", dtype="float32")  # 4 query heads, 2 KV heads, q/k/v biases
    ref = _logits(model)
    g = torch.Generator().manual_seed(1)
    for attn in attention_modules(model, LAYOUTS["qwen2"]):
        h = read_heads(attn, 4, 2)
        c = torch.complex(
            torch.rand(2, 16, generator=g, dtype=torch.float64) + 0.5,
            torch.randn(2, 16, generator=g, dtype=torch.float64),
        )
        k = torch.stack([K.unplanes(K.planes(h.k[a]) / c[a][:, None]) for a in range(2)])
        q = torch.stack([K.fold_query(h.q[i], c[i // 2]) for i in range(4)])
        write_heads(attn, Heads(q, k, h.v, h.o), [[0], [1]], [0, 1, 2, 3], None)
    new = _logits(model)
    assert not torch.equal(
        attention_modules(model, LAYOUTS["qwen2"])[0].k_proj.weight,
        load_model(tiny_dir / "qwen2", dtype="float32").model.layers[0].self_attn.k_proj.weight,
    )
    assert (ref - new).abs().max() < 1e-4


def test_a_wrong_compensation_is_caught(tiny_dir):
    """The same edit without folding conj(c) into the queries must change the logits (the test above can fail)."""
    model = load_model(tiny_dir / "qwen2", dtype="float32")
    ref = _logits(model)
    attn = attention_modules(model, LAYOUTS["qwen2"])[0]
    h = read_heads(attn, 4, 2)
    c = torch.full((16,), complex(0.8, 0.6), dtype=torch.complex128)
    k = torch.stack([K.unplanes(K.planes(h.k[a]) / c[:, None]) for a in range(2)])
    write_heads(attn, Heads(h.q, k, h.v, h.o), [[0], [1]], [0, 1, 2, 3], None)
    assert (ref - _logits(model)).abs().max() > 1e-3
