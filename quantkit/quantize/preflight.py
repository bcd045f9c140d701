"""Checks that run before any work: the architecture loads, group sizes divide every layer."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError

from quantkit.errors import DataError, ModelError, QuantkitError, RecipeError
from quantkit.models import headers, scheme_facts
from quantkit.models.checkpoint import check_loading_info, check_remote_code, context_length, context_source, one_line


def meta_model(config_dict: dict, trust_remote_code: bool = False, path: Path | None = None):
    """The model skeleton on the meta device (no memory), to read layer shapes.

    A model type transformers does not know is built from the checkpoint's own code (`auto_map`)
    only with `trust_remote_code` and the checkpoint's `path`; without them nothing is imported."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg_dict = dict(config_dict)
    model_type = cfg_dict.pop("model_type", None)
    where = f"{path}/config.json" if path is not None else "config.json"
    remote = model_type not in CONFIG_MAPPING
    if remote:
        if path is None:
            raise ModelError(f"unsupported architecture {model_type!r}: transformers does not know this model type")
        check_remote_code(path, config_dict, trust_remote_code)
    try:
        if remote:
            config = AutoConfig.from_pretrained(str(path), trust_remote_code=True)
        else:
            config = AutoConfig.for_model(model_type, **cfg_dict)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        raise ModelError(f"{where}: transformers refuses this {model_type} config ({one_line(exc)})") from None
    except (OSError, ImportError, AttributeError, SyntaxError) as exc:  # the checkpoint's own code failed to import
        raise ModelError(
            f"{where}: the model code of this checkpoint failed to load ({type(exc).__name__}: {one_line(exc)})"
        ) from None
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError:
        raise ModelError(
            f"unsupported architecture {model_type!r}: not a causal language model in transformers"
        ) from None
    except (TypeError, KeyError, AttributeError, RuntimeError) as exc:
        raise ModelError(
            f"{where}: cannot build the {model_type} model from this config ({type(exc).__name__}: {one_line(exc)})"
        ) from None


# Legacy names transformers renames on load for every model (conversion_mapping's "legacy" list).
_LEGACY_NAMES = re.compile(r"(LayerNorm\.(gamma|beta)|\.weight_[gv])$")


def check_weights(skeleton, cfg: dict, path: Path) -> None:
    """The checkpoint's tensors (safetensors headers) against the skeleton's parameters, as the
    load reports them (checkpoint.check_loading_info: the same line), so a plan or a check says
    what the run would. Only where names map one to one: not for a quantized checkpoint, a
    model whose weights transformers converts on load (fused MoE experts, renamed multimodal
    keys), custom model code, or legacy names; the load itself checks those."""
    table = headers.checkpoint_entries(path)
    if not table or "quantization_config" in cfg or _renamed_on_load(skeleton, table):
        return
    found = {n: list(e.shape) for n, e in table.items()}
    groups: dict[int, list[tuple[str, object]]] = {}
    for name, p in skeleton.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append((name, p))
    prefix = getattr(skeleton, "base_model_prefix", "")
    if prefix and not any(n.startswith(prefix + ".") for n in found):  # a base model's checkpoint: loaded under it
        names = {n for members in groups.values() for n, _ in members}
        found = {(n if n in names else f"{prefix}.{n}"): s for n, s in found.items()}
    tied = getattr(skeleton, "_tied_weights_keys", None)
    tied = tied if isinstance(tied, dict) else {}
    optional = [re.compile(p) for p in getattr(skeleton, "_keys_to_ignore_on_load_missing", None) or ()]
    missing, mismatched = [], []
    for members in groups.values():
        names = [n for n, _ in members]
        if not any(n in found or tied.get(n) in found or any(o.search(n) for o in optional) for n in names):
            missing.append(names[0])
        for n, p in members:
            if n in found and found[n] != list(p.shape):
                mismatched.append((n, found[n], list(p.shape)))
    check_loading_info(path, {"missing_keys": missing, "mismatched_keys": mismatched})


def _renamed_on_load(skeleton, table) -> bool:
    from transformers.conversion_mapping import get_model_conversion_mapping

    custom = getattr(skeleton, "is_custom_code", None)
    if callable(custom) and custom():
        return True
    if any(_LEGACY_NAMES.search(n) for n in table):
        return True
    return bool(get_model_conversion_mapping(skeleton, add_legacy=False))


def check_context(cfg: dict, seq_len: int, what: str) -> None:
    """A window longer than the model's context: positions it never learned (or, with learned
    position embeddings, an index error), so its figures would describe a model nobody runs."""
    limit = context_length(cfg)
    if limit is not None and seq_len > limit:
        raise DataError(
            f"{what} {seq_len} is longer than the model's context of {limit} tokens ({context_source(cfg)}); "
            "use at most that"
        )


def check_not_inside(out: Path, src: Path, option: str = "--out") -> None:
    """An output inside the source checkpoint would change the checkpoint it was made from
    (its hash, what a directory loader picks up)."""

    o, s = (Path(os.path.abspath(Path(p).expanduser())).resolve() for p in (out, src))
    if s in o.parents:
        raise QuantkitError(
            f"{option} {out} is inside the source checkpoint ({s}); choose a directory outside it (nothing was changed)"
        )


def is_ignored(name: str, ignore: tuple[str, ...]) -> bool:
    """llm-compressor's convention: 're:REGEX' patterns or exact module names (or name suffixes)."""
    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif name == pattern or name.endswith("." + pattern):
            return True
    return False


def quantizable_linears(model, ignore: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    return {
        name: (mod.out_features, mod.in_features)
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and not is_ignored(name, ignore)
    }


def check_quantizes_something(model, cfg, key: str) -> None:
    """A quantize step whose `ignore` covers every linear layer would ship the unmodified model
    under a quantized name (16 bits per weight reported as its INT4 variant)."""
    ignore = tuple(getattr(cfg, "ignore", ()))
    if not quantizable_linears(model, ignore):
        raise RecipeError(
            f"{key}.ignore: {list(ignore)} matches every linear layer of this model; nothing would be quantized"
        )


def check_overrides_match(linears: dict[str, tuple[int, int]], cfg, key: str) -> None:
    """An override target that matches no quantized linear would leave the layers it names at the
    base scheme without a word (a typo, or a layer list none of whose layers this model has). A
    target is one regex: an alternation that matches some of its layers passes."""
    for j, ov in enumerate(getattr(cfg, "overrides", ())):
        for t in ov.targets:
            if not any(_matches((t,), name) for name in linears):
                raise RecipeError(
                    f"{key}.overrides[{j}]: target {t!r} matches no quantized linear layer of this model "
                    "(`quantkit sensitivity MODEL --budget BITS --text SPEC` prints overrides for it)"
                )


def _matches(targets, name: str) -> bool:
    """An override's targets against a module name, as compressed-tensors matches `re:` targets."""
    return any(re.match(t, name) for t in targets)


def _override_for(name: str, overrides) -> object | None:
    for ov in overrides:
        if _matches(ov.targets, name):
            return ov
    return None


def check_group_sizes(linears: dict[str, tuple[int, int]], cfg, key: str) -> None:
    """Every quantized layer's input columns must be a multiple of its group size."""
    bad: dict[int, list[tuple[str, int]]] = {}
    for name, (_, cols) in linears.items():
        ov = _override_for(name, getattr(cfg, "overrides", ()))
        gs = ov.group_size if ov is not None else getattr(cfg, "group_size", -1)
        if gs > 0 and cols % gs:
            bad.setdefault(gs, []).append((name, cols))
    if not bad:
        return
    gs, layers = next(iter(bad.items()))
    name, cols = layers[0]
    more = f" (and {len(layers) - 1} more layers)" if len(layers) > 1 else ""
    if "group_size" not in getattr(type(cfg), "model_fields", {"group_size": 0}):  # a block the format fixes (FP4)
        raise RecipeError(
            f"{key}: the {gs}-value blocks of {getattr(cfg, 'scheme', 'this format')} do not divide the {cols} input "
            f"columns of {name}{more}; the format fixes its block size: add those layers to ignore"
        )
    widths = sorted({c for _, c in linears.values()})
    work = [g for g in (32, 64, 128) if all(w % g == 0 for w in widths)]
    raise RecipeError(
        f"{key}: group_size {gs} does not divide the {cols} input columns of {name}{more}; "
        f"sizes that work for every layer: {', '.join(map(str, work + [-1]))} (-1 = "
        "per channel), or add those layers to ignore"
    )


# Modules vLLM loads as one fused kernel (its packed_modules_mapping for Llama, Mistral, Qwen2):
# compressed-tensors' vLLM loader refuses a fused layer whose shards have different schemes.
FUSED_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _scheme_label(name: str, cfg) -> str:
    """How a linear is stored, as facts (models/scheme_facts.py) told in words: two shards agree when
    their facts do (bits, group and symmetry alike), not when a name does."""
    if is_ignored(name, tuple(getattr(cfg, "ignore", ()))):
        return "not quantized"
    ov = _override_for(name, getattr(cfg, "overrides", ()))
    if ov is not None:
        f = scheme_facts.int_weights(ov.bits, ov.group_size, ov.symmetric)
    else:  # the step's own scheme (a method config without facts: one unknown scheme, the same for every shard)
        f = (getattr(cfg, "facts", None) or (scheme_facts.unknown(str(getattr(cfg, "method", "?"))),))[0]
    group = "per channel" if f.group_size is None else f"g{f.group_size}"
    return f"{f.label} {group}{'' if f.symmetric else ' asymmetric'}"


def check_fused_shards(model, cfg, key: str) -> None:
    """Modules vLLM fuses (q/k/v, gate/up) must share one scheme: ignore and overrides take all or none."""

    names = {name for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    for fused, shards in FUSED_SHARDS.items():
        for name in sorted(n for n in names if n.endswith("." + shards[0])):
            parent = name[: -len(shards[0])]
            members = [parent + s for s in shards if parent + s in names]
            labels = {m: _scheme_label(m, cfg) for m in members}
            if len(set(labels.values())) > 1:
                found = ", ".join(f"{m.rsplit('.', 1)[1]}: {lab}" for m, lab in labels.items())
                raise RecipeError(
                    f"{key}: vLLM serves {'/'.join(shards)} of {parent.rstrip('.')} "
                    f"as one fused {fused} and needs one scheme "
                    "for all of them, but the recipe gives them different ones "
                    f"({found}); target all of {', '.join(shards)} "
                    "in the same override or ignore entry"
                )
