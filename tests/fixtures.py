"""Tiny random checkpoints on disk (Llama MHA/GQA, Mistral, Qwen2 with q/k/v biases), a small tokenizer,
and where the shipped data lies."""

from __future__ import annotations

import random
from pathlib import Path

from quantkit.resources import shipped_dir

# The shipped recipes, studies and texts where quantkit itself finds them (quantkit/resources.py):
# tests name them through these, never by their place in the source tree.
RECIPES = shipped_dir("recipes")
STUDIES = shipped_dir("studies")
CALIB_DATA = shipped_dir("calib_data")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = (
    "the a model token layer weight cache key value head query attention memory bandwidth latency "
    "prefill decode quantize group scale zero point bit integer float matrix vector kernel compute "
    "time first output per second byte read write server request queue batch fast slow small large "
    "river mountain city north south east west old new red blue green stone water light dark"
).split()


def synthetic_text(n_sentences: int = 3000, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_sentences):
        n = rng.randint(5, 14)
        words = [rng.choice(WORDS) for _ in range(n)]
        lines.append(" ".join(words).capitalize() + ".")
    return "\n".join(" ".join(lines[i : i + 5]) for i in range(0, len(lines), 5))


def build_tokenizer(out: Path, vocab_size: int = 384):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    bpe.train_from_iterator(
        [synthetic_text(400, seed=1)], vocab_size=vocab_size, special_tokens=specials, show_progress=False
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        pad_token="<|endoftext|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    return tok


ARCHS = {
    "llama-mha": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=4)),
    "llama-gqa": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
}


def build_checkpoint(
    out: Path, arch: str, tokenizer_dir: Path, seed: int = 0, dtype: str = "float16", **sizes: int
) -> Path:
    """A tiny random checkpoint; `sizes` replace the config's (intermediate_size=80: a width blocks do not divide)."""
    import torch
    import transformers

    cfg_name, model_name, extra = ARCHS[arch]
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    shape = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, head_dim=32)
    config = getattr(transformers, cfg_name)(
        vocab_size=len(tok),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **{**shape, **extra, **sizes},
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():  # larger-than-init weights so quantization error is visible in logits
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
