"""GQA recovery windows from a calibration mix (`mix:NAME`): every part's second half, interleaved by weight.

Recovery distils the original model on whatever text it is given; trained on one domain, the
merged K/V fit that domain and lose more on other text than on it. From a mix,
each part gives windows of its own stream's second half (evaluation reads first halves); the
training order is one schedule of `tokens // seq_len` slots in which each part holds its weight's
share, spread evenly so every batch mixes domains, each part cycling through its shuffled windows.
The held-out windows (early stopping, best weights) come from every part — at least one each —
and avoid that part's calibration windows, as recovery on one text does.
"""

from __future__ import annotations

import torch

from quantkit.data.mix import allocate, streams, text_stream
from quantkit.data.mixconfig import load_mix
from quantkit.data.text import region_windows
from quantkit.errors import DataError
from quantkit.gqa.windows import Windows

REGION = "second-half"


def interleave(counts: list[int]) -> list[int]:
    """Part index per slot: part i holds counts[i] slots, spread evenly (the part
    furthest behind its share goes next)."""
    total, used, out = sum(counts), [0] * len(counts), []
    for k in range(total):
        i = max(range(len(counts)), key=lambda j: (counts[j] * (k + 1) / total - used[j], -j))
        used[i] += 1
        out.append(i)
    return out


def heldout_counts(weights: list[float], heldout: int) -> list[int]:
    """Held-out windows per part by weight, at least one each (then the total is at least the number of parts)."""
    counts = allocate(weights, max(heldout, len(weights)))
    for i in [i for i, c in enumerate(counts) if c == 0]:
        counts[i] = 1
        counts[max(range(len(counts)), key=lambda j: (counts[j], -j))] -= 1  # from the part with most to spare
    return counts


def _too_short(key: str, part: str, tokens: int, windows: int, need: int, seq_len: int) -> DataError:
    return DataError(
        f"{key}.recover: calibration mix part {part!r} too short: {tokens} tokens give {windows} windows of "
        f"{seq_len} in its second half; recovery needs at least {need} from it (held out + one to train)"
    )


def _calibration_spans(calib_set, part: str) -> list[tuple[int, int]]:
    for r in (calib_set.manifest.get("parts") or []) if calib_set is not None else []:
        if r.get("name") == part:
            return [(s, s + r["seq_len"]) for s in r.get("window_starts", [])]
    return []


def _split(n_spans: int, spans, used, held_n: int) -> tuple[list[int], list[int]]:
    order = torch.randperm(n_spans, generator=torch.Generator().manual_seed(0)).tolist()
    clean = [i for i in order if not any(s < spans[i][1] and spans[i][0] < e for s, e in used)]
    held = (clean if len(clean) >= held_n else order)[:held_n]
    return [i for i in order if i not in held], held


def mix_recovery_windows(
    tok, name: str, cfg, calib_set, key: str, *, model=None, model_hash: str = "", seed: int = 0
) -> Windows:
    """Training (a weighted schedule over the parts) and held-out windows from `mix:NAME`."""
    parts, left_out = streams(load_mix(name), tok, model=model, model_hash=model_hash, seed=seed)
    weights = [p.part.weight for p in parts]
    held_n = heldout_counts(weights, cfg.heldout_windows)
    slots_n = allocate(weights, max(cfg.batch_size, cfg.tokens // cfg.seq_len))
    train, heldout, slots, records = [], [], [], []
    per_part = []
    for p, h in zip(parts, held_n):
        spans = region_windows(len(p.tokens), cfg.seq_len, p.part.region or REGION)
        if len(spans) < h + 1:
            raise _too_short(key, p.part.name, len(p.tokens), len(spans), h + 1, cfg.seq_len)
        tr, held = _split(len(spans), spans, _calibration_spans(calib_set, p.part.name), h)
        per_part.append((p, spans, tr))
        heldout += [p.tokens[spans[i][0] : spans[i][1]].unsqueeze(0) for i in held]
        records.append(
            {
                "name": p.part.name,
                "domain": p.part.domain,
                "weight": p.part.weight,
                "source": p.provenance.get("source"),
                "sha256": p.provenance.get("sha256"),
                "seq_len": cfg.seq_len,
                "stream_tokens": len(p.tokens),
                "region": p.part.region or REGION,
                "train_windows": len(tr),
                "heldout_starts": sorted(spans[i][0] for i in held),
            }
        )
    visits = [0] * len(parts)
    for k in interleave(slots_n):
        p, spans, tr = per_part[k]
        a, b = spans[tr[visits[k] % len(tr)]]
        visits[k] += 1
        train.append(p.tokens[a:b].unsqueeze(0))
        slots.append([k, a])
    record = {"source": f"mix:{name}", "seq_len": cfg.seq_len, "parts": records, "left_out": left_out, "slots": slots}
    return Windows(train, heldout, record)


def preflight_mix_recovery(tok, name: str, cfg, key: str) -> None:
    """The text parts' lengths, before the model loads (the chat part is generated later and checked then)."""
    present = [(p, None if p.chat is not None else text_stream(p, tok)) for p in load_mix(name).parts]
    chat = bool(getattr(tok, "chat_template", None))
    present = [(p, s) for p, s in present if (p.chat is not None and chat) or s is not None]  # as streams() leaves them
    for (p, s), h in zip(present, heldout_counts([p.weight for p, _ in present], cfg.heldout_windows)):
        spans = region_windows(len(s.tokens), cfg.seq_len, p.region or REGION) if s is not None else None
        if spans is not None and len(spans) < h + 1:
            raise _too_short(key, p.name, len(s.tokens), len(spans), h + 1, cfg.seq_len)
