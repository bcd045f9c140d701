"""The calibration mix file (`mix:NAME`): its schema and where it lives.

calib_data/mix/NAME.yaml lists parts, each a text SPEC (`set:NAME`, `file:PATH`) or the model's
own chat replies (`chat:`, data/chat.py), with a weight; data/mix.py builds the calibration set.
Apart from reading the texts (data/text.py) so that `parse_spec("mix:NAME")` can check the file
without importing how a mix is built.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from quantkit.core.yamlio import StrictConfig, format_validation_error
from quantkit.data.sources import SOURCES, one_of
from quantkit.errors import DataError
from quantkit.resources import calib_data_dir


class ChatPart(StrictConfig):
    prompts: str = Field(min_length=1)  # a file in calib_data/
    repeats: int = Field(1, ge=1)
    temperature: float = Field(0.7, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(256, ge=1)


class MixPart(StrictConfig):
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
        kind = self.source.split(":", 1)[0] if self.source is not None else None
        if kind is not None and not (kind in SOURCES and SOURCES[kind].mix_part):
            raise ValueError(f"source must be {one_of(mix_part=True)} (a mix part is a text, not self or another mix)")
        return self


class MixConfig(StrictConfig):
    description: str = ""
    parts: tuple[MixPart, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "MixConfig":
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError("part names must be unique")
        return self


def mix_file(name: str) -> Path:
    return calib_data_dir() / "mix" / f"{name}.yaml"


def load_mix(name: str) -> MixConfig:
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
