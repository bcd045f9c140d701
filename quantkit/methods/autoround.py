"""AutoRound through llm-compressor's AutoRoundModifier (the auto-round package, a dependency)."""

from __future__ import annotations

import inspect

from quantkit.errors import QuantkitError
from quantkit.methods.llmc import weight_groups


def check_samples(cfg, recipe, key: str) -> None:
    """Before loading: the tuning windows come out of the calibration set, so there must be enough."""
    available = recipe.calibration.samples
    if cfg.samples is not None and cfg.samples > available:
        raise QuantkitError(
            f"{key}.samples: {cfg.samples} tuning samples, but calibration.samples gives only "
            f"{available} windows; raise calibration.samples or lower samples"
        )


def tuning_samples(cfg, samples: list) -> list:
    """The first N calibration windows (N: `samples`, else the preset's count, else all of them)."""
    return samples[: cfg.resolved_samples(len(samples))]


def modifiers(cfg) -> list:
    from llmcompressor.modifiers.autoround import AutoRoundModifier

    # torch.compile of the tuning loop needs a C++ toolchain and minutes of compiling on a CPU; eager needs neither.
    return [
        AutoRoundModifier(
            config_groups=weight_groups(cfg),
            ignore=list(cfg.ignore),
            iters=cfg.iters,
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            enable_torch_compile=False,
        )
    ]


def runtime() -> dict:
    """auto-round seeds torch, numpy and random with its `seed` argument for every decoder layer it
    tunes (transformers.set_seed in BaseCompressor.__init__); llm-compressor passes none, so the
    default applies. Read from auto-round itself, so quantkit.json records the seed that ran."""

    from auto_round import AutoRound

    return {"autoround_seed": inspect.signature(AutoRound).parameters["seed"].default}
