"""Calibration sets: N samples x seq_len tokens, seeded, with a manifest that says what was used."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from pathlib import Path

import torch

from quantkit.core.atomic import write_bytes
from quantkit.data import mix
from quantkit.data.samples import CalibrationSet, duplicate_fraction, seeded_windows, window_batch
from quantkit.data.sources import TextSpec
from quantkit.data.text import parse_spec, read_text, region_windows, tokenize_stream
from quantkit.errors import DataError
from quantkit.home import subdir


def from_text(
    tokenizer, spec: TextSpec, *, samples: int, seq_len: int, seed: int, region: str, chat_template: bool
) -> CalibrationSet:
    text = read_text(spec)
    stream = tokenize_stream(tokenizer, text.text)
    windows = region_windows(len(stream), seq_len, region)
    if not windows:
        raise DataError(f"{spec}: {len(stream)} tokens, too short for one {seq_len}-token window in region {region}")
    chosen = seeded_windows(windows, samples, seed)
    batch = window_batch(tokenizer, stream, chosen, seq_len, chat_template)
    manifest = {
        **text.provenance,
        "kind": spec.kind,
        "seq_len": seq_len,
        "samples": len(batch),
        "requested_samples": samples,
        "seed": seed,
        "region": region,
        "stream_tokens": len(stream),
        "window_starts": [s for s, _ in chosen],
        "tokens": sum(b.shape[1] for b in batch),
        "duplicate_fraction": duplicate_fraction(batch),
        "chat_template": chat_template,
    }
    return CalibrationSet(batch, manifest)


def self_text(
    model, tokenizer, *, samples: int, seq_len: int, seed: int, chat_template: bool, model_hash: str
) -> CalibrationSet:
    """Data-free calibration: the FP model writes its own text (seeded sampling, temperature 1).

    Sequences start from BOS (or an empty chat turn) and are sampled in one batch; cached on
    disk by (model hash, settings) so repeated conversions do not regenerate them.
    """
    key = hashlib.sha256(json.dumps([model_hash, samples, seq_len, seed, chat_template]).encode()).hexdigest()[:24]
    cache = subdir("calib") / f"self-{key}.pt"
    batch = _cached_samples(cache, samples, seq_len)
    if batch is None:
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise DataError("calibration.chat_template: the model's tokenizer has no chat template")
        batch = _generate(model, tokenizer, samples, seq_len, seed, chat_template)
        _save_samples(cache, batch)
    manifest = {
        "source": "self",
        "kind": "self",
        "seq_len": seq_len,
        "samples": len(batch),
        "requested_samples": samples,
        "seed": seed,
        "tokens": sum(b.shape[1] for b in batch),
        "duplicate_fraction": duplicate_fraction(batch),
        "chat_template": chat_template,
        "generation": {"temperature": 1.0, "top_k": 0, "start": "chat turn" if chat_template else "BOS"},
    }
    return CalibrationSet(batch, manifest)


def _cached_samples(cache: Path, samples: int, seq_len: int):
    """The cached generated samples, or None when absent or unreadable (a damaged cache is regenerated)."""

    if not cache.is_file():
        return None
    try:
        rows = torch.load(cache, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
        return None
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[0] != samples or rows.dtype != torch.long:
        return None
    return [row.unsqueeze(0) for row in rows]


def _save_samples(cache: Path, batch) -> None:
    buf = io.BytesIO()
    torch.save(torch.stack([b[0] for b in batch]), buf)
    write_bytes(cache, buf.getvalue())


def check_source(spec_str: str | None, key: str) -> None:
    """Before any model loads: the calibration text exists, is text, and (hf:) is reachable.

    Reading it here costs a second read of a file; an offline `hf:` source or a binary file
    otherwise fails only after the model has loaded (minutes on a large one)."""
    if not spec_str:
        raise DataError(
            f"{key}: this variant needs calibration text: set calibration.source in the recipe or "
            "pass --calib file:PATH (or --calib self)"
        )
    spec = parse_spec(spec_str)
    if spec.source.parts:
        mix.check(spec.set_name)
    elif not spec.source.generated:
        read_text(spec)


def _generate(model, tokenizer, samples: int, seq_len: int, seed: int, chat_template: bool, batch_size: int = 32):
    if chat_template:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Write something."}], add_generation_prompt=True, return_dict=False
        )
        prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
    else:
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        prompt = [bos]
    torch.manual_seed(seed)
    out = []
    with torch.inference_mode():
        for start in range(0, samples, batch_size):
            n = min(batch_size, samples - start)
            ids = torch.tensor([prompt] * n, dtype=torch.long, device=model.device)
            gen = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=seq_len - len(prompt) if not chat_template else seq_len,
                min_new_tokens=seq_len - len(prompt) if not chat_template else seq_len,
                pad_token_id=tokenizer.eos_token_id,
            )
            for row in gen:
                out.append(row[:seq_len].unsqueeze(0).cpu().clone())
    return out


def build(
    model_path: Path,
    tokenizer,
    spec_str: str,
    *,
    samples: int,
    seq_len: int,
    seed: int,
    region: str,
    chat_template: bool,
    model=None,
    model_hash: str = "",
) -> CalibrationSet:
    """A calibration set from a text SPEC; `self` needs the loaded FP model."""
    spec = parse_spec(spec_str)
    if spec.source.generated:
        if model is None:
            raise DataError("the 'self' calibration source needs the source model")
        return self_text(
            model,
            tokenizer,
            samples=samples,
            seq_len=seq_len,
            seed=seed,
            chat_template=chat_template,
            model_hash=model_hash,
        )
    if spec.source.parts:
        return mix.build_mix(
            tokenizer,
            spec.set_name,
            samples=samples,
            seq_len=seq_len,
            seed=seed,
            region=region,
            chat_template=chat_template,
            model=model,
            model_hash=model_hash,
        )
    return from_text(
        tokenizer, spec, samples=samples, seq_len=seq_len, seed=seed, region=region, chat_template=chat_template
    )
