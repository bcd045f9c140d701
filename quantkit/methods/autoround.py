"""AutoRound through llm-compressor's AutoRoundModifier (needs the `auto-round` package)."""

from __future__ import annotations

from quantkit.errors import QuantkitError

INSTALL = "pip install auto-round"
# auto-round seeds torch, numpy and random with this (its default) for every decoder layer it tunes
# (transformers.set_seed in BaseCompressor.__init__); llm-compressor does not pass another.
AUTOROUND_SEED = 42


def check_installed(key: str) -> None:
    """Before anything loads: llm-compressor imports auto_round only when the modifier is built."""
    from importlib.util import find_spec

    if find_spec("auto_round") is None:
        raise QuantkitError(f"{key}: method autoround needs the auto-round package, which is not installed: {INSTALL}")


def check_samples(cfg, calibration_samples: int, key: str) -> None:
    if cfg.samples is not None and cfg.samples > calibration_samples:
        raise QuantkitError(f"{key}.samples: {cfg.samples} tuning samples, but calibration.samples gives only "
                            f"{calibration_samples} windows; raise calibration.samples or lower samples")


def tuning_samples(cfg, samples: list) -> list:
    """The first N calibration windows (N: `samples`, else the preset's count, else all of them)."""
    return samples[: cfg.resolved_samples(len(samples))]


def modifier(cfg, groups: dict, ignore: list):
    from llmcompressor.modifiers.autoround import AutoRoundModifier

    # torch.compile of the tuning loop: a C++ toolchain and minutes of compiling on a CPU; eager is
    # what the speed figures in docs/PERFORMANCE.md measured.
    return AutoRoundModifier(config_groups=groups, ignore=ignore, iters=cfg.iters, lr=cfg.lr,
                             batch_size=cfg.batch_size, enable_torch_compile=False)
