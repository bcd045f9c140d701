"""Calibration mixes (`mix:NAME`): several text domains in one calibration set, provenance per part.

A mix is calib_data/mix/NAME.yaml: parts, each a text SPEC (`set:NAME`, `file:PATH`) or the
model's own chat replies (`chat:`, quantkit/calib_chat.py), with a weight. Every part becomes one
token stream; a part's share of the samples is its weight (largest remainder, no part asked for
more windows than its region holds, the rest going to the parts with room), and its windows are
chosen in the recipe's region with the recipe's seed, exactly as a single text's are. A text
part that is missing or changed is an error, never a silent re-weighting: a mix calibrates the
same on every machine. The one part that may be left out is the chat part of a model with no
chat template (a note, and the manifest's `left_out` says why). Calibrating on one domain fits the
quantizer to it: GPTQ calibrated on encyclopedic text alone lost its whole advantage over RTN on
other text (docs/PERFORMANCE.md, "Calibration domains").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from quantkit.errors import DataError
from quantkit.progress import note
from quantkit.data.text import calib_data_dir, parse_spec, read_text, region_windows, tokenize_stream


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatPart(_Strict):
    prompts: str = Field(min_length=1)  # a file in calib_data/
    repeats: int = Field(1, ge=1)
    temperature: float = Field(0.7, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(256, ge=1)


class MixPart(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    domain: str = ""
    license: str = ""
    weight: float = Field(gt=0)
    source: str | None = None
    chat: ChatPart | None = None
    # None: the recipe's calibration.region (evaluation reads the other half). Generated text is
    # read by no evaluation, so the chat part may use all of its windows.
    region: Literal["all", "first-half", "second-half"] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "MixPart":
        if (self.source is None) == (self.chat is None):
            raise ValueError("a part holds exactly one of: source, chat")
        if self.source is not None and self.source.split(":", 1)[0] not in ("set", "file"):
            raise ValueError("source must be set:NAME or file:PATH (a mix part is a text, not self or another mix)")
        return self


class MixConfig(_Strict):
    description: str = ""
    parts: tuple[MixPart, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "MixConfig":
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError("part names must be unique")
        return self


@dataclass
class Stream:
    part: MixPart
    tokens: object  # 1-D LongTensor
    provenance: dict


def mix_file(name: str) -> Path:
    return calib_data_dir() / "mix" / f"{name}.yaml"


def load_mix(name: str) -> MixConfig:
    import yaml

    from quantkit.recipe.files import format_validation_error

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise DataError(f"mix:{name}: a mix is named by a plain name (a file in {calib_data_dir() / 'mix'})")
    path = mix_file(name)
    if not path.is_file():
        known = sorted(p.stem for p in (calib_data_dir() / "mix").glob("*.yaml"))
        raise DataError(f"mix:{name}: no mix {path.name} in {path.parent} (known: {', '.join(known) or 'none'})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return MixConfig.model_validate(data)
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except ValidationError as exc:
        raise DataError(format_validation_error(str(path), exc)) from None


def fingerprint(name: str) -> str:
    """A hash of everything a mix's calibration depends on before the model: its file and its parts' manifests and files' hashes."""
    mix = load_mix(name)
    h = hashlib.sha256(mix_file(name).read_bytes())
    for part in mix.parts:
        if part.source:
            spec = parse_spec(part.source)
            h.update(f"{part.source}:{spec.expect_sha256 or spec.path}".encode())
        else:
            h.update((calib_data_dir() / part.chat.prompts).read_bytes() if (calib_data_dir() / part.chat.prompts).is_file() else b"")
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


def streams(mix: MixConfig, tok, *, model=None, model_hash: str = "", seed: int = 0) -> tuple[list[Stream], list[dict]]:
    """One token stream per available part, and the parts left out (with why)."""
    from quantkit.data.chat import chat_stream

    out, left_out = [], []
    for part in mix.parts:
        if part.chat is not None:  # a base model has no chat template, and no chat to imitate
            reason = None if getattr(tok, "chat_template", None) else "the tokenizer has no chat template"
            s = None if reason else Stream(part, *chat_stream(model, tok, part.chat, calib_data_dir() / part.chat.prompts,
                                                               seed=seed, model_hash=model_hash))
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
    import torch

    from quantkit.data.calib import _chat_wrap

    spans = region_windows(len(s.tokens), seq_len, region)
    order = torch.randperm(len(spans), generator=torch.Generator().manual_seed(seed)).tolist()[:n]
    chosen = sorted(spans[i] for i in order)
    batch = [s.tokens[a:b].unsqueeze(0) for a, b in chosen]
    if chat_template and s.part.chat is None:  # the chat part is in the template already
        batch = _chat_wrap(tokenizer, [tokenizer.decode(b[0]) for b in batch], seq_len)
    return batch, [a for a, _ in chosen]


def build_mix(tokenizer, name: str, *, samples: int, seq_len: int, seed: int, region: str, chat_template: bool,
              model=None, model_hash: str = ""):
    """A CalibrationSet from `mix:NAME`; the manifest lists every part with its windows and hashes."""
    from quantkit.data.calib import CalibrationSet, duplicate_fraction

    mix = load_mix(name)
    parts, left_out = streams(mix, tokenizer, model=model, model_hash=model_hash, seed=seed)
    weights = [s.part.weight for s in parts]
    capacity = [len(region_windows(len(s.tokens), seq_len, s.part.region or region)) for s in parts]
    asked, counts = allocate(weights, samples), allocate(weights, samples, capacity)
    batch, records = [], []
    for s, want, n in zip(parts, asked, counts):
        got, starts = _text_windows(tokenizer, s, n, seq_len, seed, s.part.region or region, chat_template)
        batch += got
        records.append({"name": s.part.name, "domain": s.part.domain, "license": s.part.license, "weight": s.part.weight,
                        "share": round(s.part.weight / sum(weights), 4), **s.provenance, "region": s.part.region or region, "seq_len": seq_len,
                        "stream_tokens": len(s.tokens), "requested_samples": want, "samples": len(got), "window_starts": starts})
    if not batch:
        raise DataError(f"mix:{name}: no part holds one {seq_len}-token window in region {region}")
    if len(batch) < samples:  # every part is full: say so, the manifest records both numbers
        note(f"calibration mix: {len(batch)} of {samples} windows delivered (every part's region holds fewer "
             f"{seq_len}-token windows than its share)")
    manifest = {
        "source": f"mix:{name}",
        "kind": "mix",
        "mix": {"name": name, "file": f"calib_data/mix/{name}.yaml", "sha256": hashlib.sha256(mix_file(name).read_bytes()).hexdigest(),
                "description": mix.description},
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
    from quantkit.data.chat import read_prompts

    mix = load_mix(name)
    for part in mix.parts:
        if part.chat is not None:
            read_prompts(calib_data_dir() / part.chat.prompts)
            continue
        _read_part(part)
