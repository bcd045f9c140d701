"""Calibration mixes (`mix:NAME`): several text domains in one calibration set, provenance per part.

A mix is calib_data/mix/NAME.yaml (its schema: data/mixconfig.py): parts, each a text SPEC
(`set:NAME`, `file:PATH`) or the model's own chat replies (`chat:`, data/chat.py), with a weight. Every part becomes one
token stream; a part's share of the samples is its weight (largest remainder, no part asked for
more windows than its region holds, the rest going to the parts with room), and its windows are
chosen in the recipe's region with the recipe's seed, exactly as a single text's are. A text
part that is missing or changed is an error, never a silent re-weighting: a mix calibrates the
same on every machine. The one part that may be left out is the chat part of a model with no
chat template (a note, and the manifest's `left_out` says why). Calibrating on one domain fits the
quantizer to it: GPTQ calibrated on encyclopedic text alone lost its whole advantage over RTN on
other text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from quantkit.data.chat import chat_stream, read_prompts
from quantkit.data.mixconfig import MixConfig, MixPart, load_mix, mix_file
from quantkit.data.samples import CalibrationSet, duplicate_fraction, seeded_windows, window_batch
from quantkit.data.text import parse_spec, read_text, region_windows, tokenize_stream
from quantkit.errors import DataError
from quantkit.progress import note
from quantkit.resources import calib_data_dir


@dataclass
class Stream:
    part: MixPart
    tokens: object  # 1-D LongTensor
    provenance: dict


def fingerprint(name: str) -> str:
    """A hash of everything a mix's calibration depends on before the model: its file and
    its parts' manifests and files' hashes."""
    mix = load_mix(name)
    h = hashlib.sha256(mix_file(name).read_bytes())
    for part in mix.parts:
        if part.source:
            spec = parse_spec(part.source)
            h.update(f"{part.source}:{spec.expect_sha256 or spec.path}".encode())
        else:
            h.update(
                (calib_data_dir() / part.chat.prompts).read_bytes()
                if (calib_data_dir() / part.chat.prompts).is_file()
                else b""
            )
    return h.hexdigest()


def _read_part(part: MixPart):
    """A text part's text; a missing or unreadable one names the part (a mix is all of its parts)."""
    try:
        return read_text(parse_spec(part.source))
    except DataError as exc:
        raise DataError(f"calibration mix: part {part.name!r}: {exc}") from None


def text_stream(part: MixPart, tok) -> Stream:
    text = _read_part(part)
    return Stream(part, tokenize_stream(tok, text.text), dict(text.provenance))


def _has_chat(tok) -> bool:
    return bool(getattr(tok, "chat_template", None))


def writes_with(name: str, tok) -> bool:
    """Whether mix NAME's windows need the model loaded: it has a chat part (the model's own replies)
    and this tokenizer has the chat template that part is generated with."""
    return _has_chat(tok) and any(p.chat is not None for p in load_mix(name).parts)


def streams(
    mix: MixConfig, tok, *, model=None, model_hash: str = "", seed: int = 0, chat_tokens: dict[str, int] | None = None
) -> tuple[list[Stream], list[dict]]:
    """One token stream per available part, and the parts left out (with why). `chat_tokens`: how
    many tokens each generated part must hold at least (by part name; absent: all its prompts)."""

    out, left_out = [], []
    for part in mix.parts:
        if part.chat is not None:  # a base model has no chat template, and no chat to imitate
            reason = None if _has_chat(tok) else "the tokenizer has no chat template"
            s = (
                None
                if reason
                else Stream(
                    part,
                    *chat_stream(
                        model,
                        tok,
                        part.chat,
                        calib_data_dir() / part.chat.prompts,
                        seed=seed,
                        model_hash=model_hash,
                        tokens_needed=(chat_tokens or {}).get(part.name),
                    ),
                )
            )
        else:
            s, reason = text_stream(part, tok), None
        if s is None:
            note(f"calibration mix: part {part.name!r} left out ({reason}); its share goes to the other parts")
            left_out.append({"name": part.name, "domain": part.domain, "weight": part.weight, "reason": reason})
        else:
            out.append(s)
    if not out:
        raise DataError("calibration mix: no part is available")
    return out, left_out


def allocate(weights: list[float], total: int, capacity: list[int | None] | None = None) -> list[int]:
    """Split `total` by weight (largest remainder, ties to the earlier part), none above its capacity.

    A capped part takes its capacity and the rest is split again among the others; the sum is
    below `total` only when every part is full.
    """
    n = len(weights)
    cap = list(capacity) if capacity is not None else [None] * n
    counts, active, left = [0] * n, [i for i in range(n) if cap[i] != 0], total
    while left > 0 and active:
        wsum = sum(weights[i] for i in active)
        exact = {i: left * weights[i] / wsum for i in active}
        share = {i: int(exact[i]) for i in active}
        for i in sorted(active, key=lambda i: (-(exact[i] - share[i]), i))[: left - sum(share.values())]:
            share[i] += 1
        over = [i for i in active if cap[i] is not None and share[i] >= cap[i]]
        if not over:
            for i in active:
                counts[i] += share[i]
            break
        for i in over:  # fill the capped parts, then split what remains among the rest
            counts[i], left = cap[i], left - cap[i]
            active.remove(i)
    return counts


def _text_windows(tokenizer, s: Stream, n: int, seq_len: int, seed: int, region: str, chat_template: bool):
    """n seeded windows of one part's stream (as calib.from_text chooses them) and their starts."""
    chosen = seeded_windows(region_windows(len(s.tokens), seq_len, region), n, seed)
    wrap = chat_template and s.part.chat is None  # the chat part is in the template already
    return window_batch(tokenizer, s.tokens, chosen, seq_len, wrap), [a for a, _ in chosen]


def build_mix(
    tokenizer,
    name: str,
    *,
    samples: int,
    seq_len: int,
    seed: int,
    region: str,
    chat_template: bool,
    model=None,
    model_hash: str = "",
):
    """A CalibrationSet from `mix:NAME`; the manifest lists every part with its windows and hashes."""
    mix = load_mix(name)
    # A generated part is generated only as far as its windows need: its share of the samples,
    # as allocated below among the parts that will be present, in whole windows.
    present = [p for p in mix.parts if p.chat is None or _has_chat(tokenizer)]
    shares = dict(zip([p.name for p in present], allocate([p.weight for p in present], samples)))
    chat_tokens = {p.name: shares[p.name] * seq_len for p in present if p.chat is not None}
    parts, left_out = streams(mix, tokenizer, model=model, model_hash=model_hash, seed=seed, chat_tokens=chat_tokens)
    weights = [s.part.weight for s in parts]
    capacity = [len(region_windows(len(s.tokens), seq_len, s.part.region or region)) for s in parts]
    asked, counts = allocate(weights, samples), allocate(weights, samples, capacity)
    batch, records = [], []
    for s, want, n in zip(parts, asked, counts):
        got, starts = _text_windows(tokenizer, s, n, seq_len, seed, s.part.region or region, chat_template)
        batch += got
        records.append(
            {
                "name": s.part.name,
                "domain": s.part.domain,
                "license": s.part.license,
                "weight": s.part.weight,
                "share": round(s.part.weight / sum(weights), 4),
                **s.provenance,
                "region": s.part.region or region,
                "seq_len": seq_len,
                "stream_tokens": len(s.tokens),
                "requested_samples": want,
                "samples": len(got),
                "window_starts": starts,
            }
        )
    if not batch:
        raise DataError(f"mix:{name}: no part holds one {seq_len}-token window in region {region}")
    if len(batch) < samples:  # every part is full: say so, the manifest records both numbers
        note(
            f"calibration mix: {len(batch)} of {samples} windows delivered (every part's region holds fewer "
            f"{seq_len}-token windows than its share)"
        )
    manifest = {
        "source": f"mix:{name}",
        "kind": "mix",
        "mix": {
            "name": name,
            "file": f"calib_data/mix/{name}.yaml",
            "sha256": hashlib.sha256(mix_file(name).read_bytes()).hexdigest(),
            "description": mix.description,
        },
        "seq_len": seq_len,
        "samples": len(batch),
        "requested_samples": samples,
        "seed": seed,
        "region": region,
        "tokens": sum(b.shape[1] for b in batch),
        "duplicate_fraction": duplicate_fraction(batch),
        "chat_template": chat_template,
        "domains": {r["domain"] or r["name"]: r["samples"] for r in records},
        "parts": records,
        "left_out": left_out,
    }
    return CalibrationSet(batch, manifest)


def check(name: str) -> None:
    """Before any model loads: the mix is valid and every text part is there and intact."""

    mix = load_mix(name)
    for part in mix.parts:
        if part.chat is not None:
            read_prompts(calib_data_dir() / part.chat.prompts)
            continue
        _read_part(part)
