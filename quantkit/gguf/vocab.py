"""The tokenizer as llama.cpp reads it: tokens, token types, merges, pre-tokenizer, special ids.

Byte-level BPE tokenizers (GPT-2 style: SmolLM, Qwen2, Llama 3, and the test fixtures) are exported;
llama.cpp tokenizes them as `tokenizer.ggml.model = gpt2` with the regexes its `tokenizer.ggml.pre`
name selects (src/llama-vocab.cpp). The name is chosen from the tokenizer.json pre-tokenizer itself,
a table below, so an unknown pre-tokenizer is refused rather than tokenized differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf

from quantkit.errors import ModelError
from quantkit.models.checkpoint import load_tokenizer, read_json

# The Split regexes of Qwen2's and Llama 3's tokenizer.json (llama-vocab.cpp lists them as the originals).
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# pre-tokenizer steps -> the llama.cpp pre-tokenizer whose regexes do the same split (llama-vocab.cpp,
# llm_tokenizer_bpe): GPT2 = the GPT-2 regex; SMOLLM = "\p{N}" then the GPT-2 regex (digits one by one).
PRE_TOKENIZERS: dict[tuple, str] = {
    (("bytelevel", True),): "gpt-2",
    (("digits", True), ("bytelevel", True)): "smollm",
    (("split", _QWEN2), ("bytelevel", False)): "qwen2",
    (("split", _LLAMA3), ("bytelevel", False)): "llama-bpe",
}
NORMALIZERS = (None, "NFC")  # Qwen2's tokenizer.json NFC-normalises; llama.cpp's qwen2 reads the same vocab


@dataclass(frozen=True)
class VocabInfo:
    model: str
    pre: str
    n_tokens: int
    n_padded: int
    special: dict
    add_bos: bool
    add_eos: bool


def _steps(pre: dict | None) -> tuple | None:
    if not isinstance(pre, dict):
        return None
    kind = pre.get("type")
    if kind == "Sequence":
        out: tuple = ()
        for p in pre.get("pretokenizers") or []:
            s = _steps(p)
            if s is None:
                return None
            out += s
        return out
    if kind == "ByteLevel" and not pre.get("add_prefix_space", False):
        return (("bytelevel", bool(pre.get("use_regex", True))),)
    if kind == "Digits":
        return (("digits", bool(pre.get("individual_digits", False))),)
    if kind == "Split" and pre.get("behavior") == "Isolated" and not pre.get("invert", False):
        pattern = (pre.get("pattern") or {}).get("Regex")
        return (("split", pattern),) if pattern else None
    return None


def _normalizer(norm: dict | None) -> str | None | bool:
    if norm is None:
        return None
    if norm.get("type") == "Sequence":
        parts = [_normalizer(n) for n in norm.get("normalizers") or []]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else False
    return norm.get("type")


def pre_tokenizer_name(tj: dict, where: Path) -> str:
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ModelError(
            f"{where}: a {model.get('type')} tokenizer; GGUF export supports byte-level BPE tokenizers only"
        )
    steps = _steps(tj.get("pre_tokenizer"))
    if not steps or not any(s[0] == "bytelevel" for s in steps):
        raise ModelError(
            f"{where}: not a byte-level BPE tokenizer (SentencePiece-style tokenizers are not exported to GGUF)"
        )
    norm = _normalizer(tj.get("normalizer"))
    if norm not in NORMALIZERS:
        raise ModelError(f"{where}: tokenizer normalizer {norm!r} has no llama.cpp counterpart")
    name = PRE_TOKENIZERS.get(steps)
    if name is None:
        raise ModelError(
            f"{where}: this tokenizer's pre-tokenizer matches none llama.cpp runs that quantkit knows "
            f"({', '.join(sorted(set(PRE_TOKENIZERS.values())))}); llama.cpp would split text differently"
        )
    return name


def _eos(path: Path, tok) -> int | None:
    """What transformers' generate() stops on: generation_config's eos (its first), else the tokenizer's."""
    gen = path / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except (OSError, ValueError):
            eos = None
        if isinstance(eos, list) and eos:
            eos = eos[0]
        if isinstance(eos, int):
            return eos
    return tok.eos_token_id


def add_vocab(writer, path: Path, vocab_size: int, config: dict) -> VocabInfo:
    """Write tokenizer.* keys for the artifact at `path` (its embedding has `vocab_size` rows)."""

    if not (path / "tokenizer.json").is_file():
        raise ModelError(f"{path}: no tokenizer.json (GGUF export reads the fast tokenizer's definition)")
    tj = read_json(path / "tokenizer.json")
    pre = pre_tokenizer_name(tj, path / "tokenizer.json")
    tok = load_tokenizer(path)
    vocab = tok.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise ModelError(
            f"{path}: the tokenizer has ids up to {max(vocab.values())} but the embedding has {vocab_size} rows"
        )
    added = {i: t for i, t in tok.added_tokens_decoder.items()}
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):  # embedding rows without a token become unused placeholders, as llama.cpp expects
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(path, load_merges=True, n_vocab=vocab_size)
    special.special_token_ids, special.add_special_token = {}, {}  # set below from the tokenizer's behaviour
    special.add_to_gguf(writer, quiet=True)
    ids = {
        "bos": tok.bos_token_id if tok.bos_token_id is not None else config.get("bos_token_id"),
        "eos": _eos(path, tok),
        "unk": tok.unk_token_id,
        "pad": tok.pad_token_id if tok.pad_token_id is not None else config.get("pad_token_id"),
    }
    ids = {k: v for k, v in ids.items() if isinstance(v, int) and 0 <= v < vocab_size}
    for kind, tid in ids.items():
        getattr(writer, f"add_{kind}_token_id")(tid)
    with_special = tok("a")["input_ids"]
    plain = tok("a", add_special_tokens=False)["input_ids"]
    add_bos = len(with_special) > len(plain) and with_special[0] == ids.get("bos")
    add_eos = len(with_special) > len(plain) and with_special[-1] == ids.get("eos")
    writer.add_add_bos_token(bool(add_bos))
    writer.add_add_eos_token(bool(add_eos))
    return VocabInfo("gpt2", pre, len(by_id), vocab_size - len(by_id), ids, bool(add_bos), bool(add_eos))
