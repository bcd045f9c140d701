"""The GQA step's wiring: checks before any work, then merge (and recover) a loaded model."""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager

import torch

from quantkit.core.roofline import kv_bytes
from quantkit.data.text import parse_spec, read_text, region_windows, tokenize_stream
from quantkit.errors import DataError, RecipeError
from quantkit.gqa.gqa_layouts import head_counts, layout_for
from quantkit.gqa.groups import contiguous_groups, search_groups
from quantkit.gqa.layer import Stats, group_loss, merged_heads, read_heads, write_heads
from quantkit.gqa.merge_stats import attention_modules, moments
from quantkit.gqa.mix_windows import mix_recovery_windows, preflight_mix_recovery
from quantkit.gqa.recover import distill, trained_names
from quantkit.gqa.transfer import transfer
from quantkit.gqa.windows import Windows
from quantkit.models.checkpoint import cast_model
from quantkit.progress import bar, note


def preflight_gqa(cfg: dict, gqa, key: str) -> None:
    """One clear line, before loading anything, for a request the step cannot honour."""
    model_type = cfg.get("model_type", "?")
    layout = layout_for(model_type, key)  # GPT-2/OPT-style MHA and other layouts stop here
    heads, kv, _ = head_counts(cfg)
    if heads % gqa.kv_heads:
        raise RecipeError(f"{key}.kv_heads: {gqa.kv_heads} does not divide the {heads} query heads of this model")
    if gqa.kv_heads >= kv:
        raise RecipeError(f"{key}.kv_heads: {gqa.kv_heads} is not below the model's {kv} KV heads")
    if kv % gqa.kv_heads:
        raise RecipeError(
            f"{key}.kv_heads: {gqa.kv_heads} does not divide the model's {kv} KV heads (a group merges whole KV heads)"
        )
    if layout.qk_norm and gqa.merge != "mean":
        raise RecipeError(
            f"{key}.merge: {model_type} normalises q and k per head after the projection, which undoes a folded "
            "compensation; use merge: mean (recover may follow)"
        )


@contextmanager
def single_thread():
    """The merge math is many small float64 factorisations; with 2 threads on a shared machine
    a 192 x 192 eigh took 2 s instead of 5 ms (thread hand-off), so it runs on one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def merge_model(
    model, layout, kv_heads: int, grouping: str, kind: str, sigmas, context: int, values=None
) -> list[dict]:
    """Merge every layer in place; returns per layer the groups and the relative merge error."""
    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    inv_freq = rotary_frequencies(model, layout)
    report = []
    with single_thread(), bar("gqa merge", total=len(attention_modules(model, layout))) as update:
        for i, attn in enumerate(attention_modules(model, layout)):
            stats = Stats(sigmas[i], inv_freq, context, values[i] if values else None) if sigmas is not None else None
            if inv_freq is None:
                inv_freq = torch.zeros(attn.head_dim // 2, dtype=torch.float64)
            h = read_heads(attn, n_heads, n_kv)
            if grouping == "searched" and kv_heads > 1:
                search_stats = stats or Stats(torch.eye(h.q.shape[2], dtype=torch.float64), inv_freq, context)
                groups = search_groups(n_kv, kv_heads, lambda g: group_loss(h, g, search_stats, kind))
            else:
                groups = contiguous_groups(n_kv, kv_heads)
            new, order, loss = merged_heads(h, groups, stats, kind)
            write_heads(attn, new, groups, order, layout.qk_norm)
            report.append({"layer": i, "groups": groups, "relative_error": loss})
            update(i + 1)
    cfg.num_key_value_heads = kv_heads
    return report


def rotary_frequencies(model, layout):
    """theta_j of the model's rotate-half RoPE (None where it has no single `inv_freq`, e.g. Gemma3)."""
    try:
        inv = model.get_submodule(layout.rotary).inv_freq
    except AttributeError:
        return None
    return inv.detach().double().cpu()


def _too_few_self(key: str, have: int, cfg) -> DataError:
    return DataError(
        f"{key}.recover: {have} windows of {cfg.seq_len} tokens from the calibration samples; "
        f"need at least {cfg.heldout_windows + cfg.batch_size}"
    )


def _too_short(key: str, tokens: int, windows: int, cfg) -> DataError:
    return DataError(
        f"{key}.recover: calibration text too short: {tokens} tokens give {windows} windows of "
        f"{cfg.seq_len} in its second half; recovery needs at least {cfg.heldout_windows + cfg.batch_size} "
        f"({cfg.heldout_windows} held out + one batch)"
    )


def preflight_recovery_text(tok, spec: str | None, cfg, calibration, key: str) -> None:
    """recovery_windows' length check before the model is loaded: from the text's token count, or
    for `self` text from samples x seq_len (each sample is cut into seq_len // recover.seq_len windows)."""

    if spec is None:  # reported by the calibration step: no source at all
        return
    need = cfg.heldout_windows + cfg.batch_size
    if parse_spec(spec).source.parts:
        return preflight_mix_recovery(tok, parse_spec(spec).set_name, cfg, key)
    if parse_spec(spec).source.generated:
        have = calibration.samples * (calibration.seq_len // cfg.seq_len)
        if have < need:
            raise _too_few_self(key, have, cfg)
        return
    tokens = len(tokenize_stream(tok, read_text(parse_spec(spec)).text))
    windows = len(region_windows(tokens, cfg.seq_len, "second-half"))
    if windows < need:
        raise _too_short(key, tokens, windows, cfg)


def recovery_windows(
    tok, spec: str | None, cfg, calib_set, key: str, *, model=None, model_hash: str = "", seed: int = 0
) -> Windows:
    """Training and held-out windows of `cfg.seq_len` tokens from the second half of the text.

    Evaluation reads the first half, so neither set overlaps it; the held-out windows also avoid
    the merge's calibration windows. With `self` text, the calibration samples are cut up.
    """

    if spec is not None and parse_spec(spec).source.parts:  # every part's second half, by weight (gqa/mix_windows.py)
        return mix_recovery_windows(
            tok, parse_spec(spec).set_name, cfg, calib_set, key, model=model, model_hash=model_hash, seed=seed
        )
    if spec is None or parse_spec(spec).source.generated:
        pieces = [
            s[:, i : i + cfg.seq_len]
            for s in (calib_set.samples if calib_set else [])
            for i in range(0, s.shape[1] - cfg.seq_len + 1, cfg.seq_len)
        ]
        if len(pieces) < cfg.heldout_windows + cfg.batch_size:
            raise _too_few_self(key, len(pieces), cfg)
        record = {"source": "self", "seq_len": cfg.seq_len, "cut_from": "the calibration samples"}
        return Windows(pieces[cfg.heldout_windows :], pieces[: cfg.heldout_windows], record)
    text = read_text(parse_spec(spec))
    stream = tokenize_stream(tok, text.text)
    spans = region_windows(len(stream), cfg.seq_len, "second-half")
    if len(spans) < cfg.heldout_windows + cfg.batch_size:
        raise _too_short(key, len(stream), len(spans), cfg)
    used = _calibration_spans(calib_set)
    order = torch.randperm(len(spans), generator=torch.Generator().manual_seed(0)).tolist()
    clean = [i for i in order if not any(s < spans[i][1] and spans[i][0] < e for s, e in used)]
    held = (clean if len(clean) >= cfg.heldout_windows else order)[: cfg.heldout_windows]
    train = [i for i in order if i not in held]
    take = lambda idx: [stream[spans[i][0] : spans[i][1]].unsqueeze(0) for i in idx]  # noqa: E731
    record = {
        "source": text.provenance.get("source"),
        "sha256": text.provenance.get("sha256"),
        "seq_len": cfg.seq_len,
        "region": "second-half",
        "stream_tokens": len(stream),
        "train_starts": [spans[i][0] for i in train],
        "heldout_starts": sorted(spans[i][0] for i in held),
    }
    return Windows(take(train), take(held), record)


def _calibration_spans(calib_set) -> list[tuple[int, int]]:
    if calib_set is None or "window_starts" not in calib_set.manifest:
        return []
    n = calib_set.manifest["seq_len"]
    return [(s, s + n) for s in calib_set.manifest["window_starts"]]


def _transfer(model, teacher, names: list[str], windows, cfg):
    """Attention transfer on the first training windows (gqa/transfer.py), in the recovery's time
    budget: returns its record (None when off) and the config distillation runs with."""
    if not cfg.transfer_steps:
        return None, cfg

    used = windows.train[: 8 * cfg.batch_size]
    record = transfer(
        model,
        teacher,
        [(n, model.get_submodule(n)) for n in names],
        [teacher.get_submodule(n) for n in names],
        trained_names(model, names, cfg.train),
        used,
        cfg,
    )
    return record, cfg.model_copy(update={"max_minutes": max(0.05, cfg.max_minutes - record["minutes"])})


def apply_gqa(model, tok, gqa, calib_set, *, src, src_hash: str = "", calib_spec: str | None = None, calibration=None):
    """Merge KV heads (and optionally recover); returns the model (float32, in memory) and its meta."""
    key = "steps.gqa"
    cfg = model.config
    layout = layout_for(cfg.model_type, key)
    n_heads, n_kv, head_dim = head_counts(cfg.to_dict())
    layers = len(attention_modules(model, layout))
    windows = (
        recovery_windows(
            tok,
            calib_spec,
            gqa.recover,
            calib_set,
            key,
            model=model,
            model_hash=src_hash,
            seed=calibration.seed if calibration is not None else 0,
        )
        if gqa.recover
        else None
    )
    teacher = cast_model(copy.deepcopy(model), torch.bfloat16).eval() if gqa.recover else None
    t0 = time.perf_counter()
    sigmas = values = None
    if calib_set is not None and (gqa.merge == "calibrated" or gqa.grouping == "searched"):
        with bar("gqa statistics", total=len(calib_set.samples)) as update:
            sigmas, values = moments(
                model, layout, calib_set.samples, values=gqa.merge == "calibrated", progress=update
            )
    context = calib_set.manifest.get("seq_len", 512) if calib_set is not None else 512
    report = merge_model(model, layout, gqa.kv_heads, gqa.grouping, gqa.merge, sigmas, context, values)
    meta = {
        "kv_heads_before": n_kv,
        "kv_heads_after": gqa.kv_heads,
        "query_heads": n_heads,
        "merge": gqa.merge,
        "grouping": gqa.grouping,
        "groups": [r["groups"] for r in report],
        "relative_merge_error": [r["relative_error"] for r in report] if sigmas is not None else None,
        "kv_bytes_per_token_before": kv_bytes(layers, n_kv, head_dim),
        "kv_bytes_per_token_after": kv_bytes(layers, gqa.kv_heads, head_dim),
        "merge_seconds": round(time.perf_counter() - t0, 1),
        "recover": None,
    }
    if gqa.recover:
        names = [f"{layout.layers}.{i}.{layout.attn}" for i in range(layers)]
        transferred, rec = _transfer(model, teacher, names, windows, gqa.recover)
        log = distill(model, teacher, names, windows, rec, note)
        del teacher
        meta["recover"] = {
            "steps": log.steps,
            "tokens": log.tokens,
            "minutes": round(log.minutes, 2),
            "heldout_kl": [[s, round(k, 5)] for s, k in log.heldout_kl],
            "best_step": log.best_step,
            "stop": log.stop,
            "train": gqa.recover.train,
            "lr": gqa.recover.lr,
            "seconds_per_step": round(log.seconds_per_step, 2),
            "seconds_per_step_by_threads": log.threads,
            "windows": windows.describe(log.steps, gqa.recover.batch_size),
            "transfer": transferred,
        }
    return model, meta
