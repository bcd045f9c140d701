"""The exporter registry (export/export_registry.py): its formats, how an exporter is picked, what each
takes of each scheme; and that a new format is one Exporter subclass plus one registry entry, which
`quantkit export --format` and a run's `export: {formats: [...]}` then both write."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from quantkit.core.record_checks import checked
from quantkit.errors import QuantkitError, RecipeError
from quantkit.export import export_registry
from quantkit.export.export_registry import EXPORTERS, capability_table, check_formats, exporter_for, formats
from quantkit.export.exporter import EXACT, LOSSY, REFUSED, Exporter, ExportSettings, Verdict
from quantkit.models import scheme_facts as sf


def test_formats_and_the_pick():
    assert {"compressed-tensors", "gguf"} <= set(formats()) and formats() == sorted(set(formats()))
    assert exporter_for("gguf").name == "gguf"
    assert exporter_for("gguf", ExportSettings(qtype="Q4_K_M")).name == "gguf-kquant"  # selected by --type
    with pytest.raises(QuantkitError, match=f"unknown export format 'onnx'; valid: {', '.join(formats())}$"):
        exporter_for("onnx")
    with pytest.raises(RecipeError, match=r"export.formats\[1\]: unknown export format 'onnx'"):
        check_formats(["gguf", "onnx"])


def test_capabilities_are_decided_on_scheme_facts():
    gguf = EXPORTERS["gguf"]
    assert gguf.takes(sf.int_weights(4, 128, True)).kind == EXACT
    assert gguf.takes(sf.MXFP4).kind == EXACT
    assert gguf.takes(sf.bnb_4bit("nf4", False)).kind == REFUSED
    table = capability_table()
    assert all(f"`{n}`" in table for n in EXPORTERS) and table.count("\n| ") >= len(export_registry.SCHEMES)


@dataclass(frozen=True)
class ToyRecord:
    """What the toy format wrote: its file, hash, size and tensor count."""

    out: str
    sha256: str
    bytes: int
    tensors: int

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> ToyRecord:
        return cls(**checked(cls, data, "toy export record"))


class Toy(Exporter):
    """A format written in a test only: the artifact's tensor names and shapes, as one JSON file."""

    name = "toy"
    format = "toy"
    writes = "the tensor names and shapes, as JSON"

    def takes(self, facts: sf.SchemeFacts) -> Verdict:
        return Verdict(EXACT, "names and shapes only")

    def check(self, settings: ExportSettings) -> None:
        if settings.qtype is not None:
            raise QuantkitError("--type applies to --format gguf; toy writes names and shapes")

    def out_name(self, stem: str, settings: ExportSettings) -> str:
        return f"{stem}.toy.json"

    def export(self, artifact: Path, out: Path | None, settings: ExportSettings) -> ToyRecord:
        from quantkit.models.headers import read_header

        artifact = Path(artifact)
        out = Path(out) if out is not None else artifact.parent / self.out_name(artifact.name, settings)
        shapes = {}
        for f in sorted(artifact.glob("*.safetensors")):
            _, header = read_header(f)
            shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
        data = json.dumps(shapes, sort_keys=True).encode()
        out.write_bytes(data)
        return ToyRecord(str(out), hashlib.sha256(data).hexdigest(), len(data), len(shapes))

    def kept(self, record: ToyRecord) -> dict:
        return {**super().kept(record), "out": record.out, "tensors": record.tensors}


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(EXPORTERS, "toy", Toy())  # the one registry line


def test_a_new_format_is_one_class_and_one_entry(toy, cli, tiny_llama, tmp_path):
    """Listed (--format's choices, the refusal of an unknown format, the capability table), written,
    and refused where its check says, with nothing but the class and its registry line."""
    code, out, err, _ = cli("export", "--help")
    assert code == 0 and "toy" in out
    with pytest.raises(QuantkitError, match="valid: compressed-tensors, gguf, toy$"):
        exporter_for("onnx")
    assert "| `toy` | `toy` | the tensor names and shapes, as JSON |" in capability_table()
    code, out, err, rec = cli("export", str(tiny_llama), "--format", "toy", "--out", str(tmp_path / "m.json"), "--json")
    assert code == 0, err
    assert rec["tensors"] > 0 and json.loads((tmp_path / "m.json").read_text())
    code, out, err, _ = cli("export", str(tiny_llama), "--format", "toy", "--out", str(tmp_path / "n.json"))
    assert code == 0 and out.startswith("wrote --format toy (") and rec["sha256"][:12] in out, err
    code, out, err, _ = cli(
        "export", str(tiny_llama), "--format", "toy", "--type", "Q4_K_M", "--out", str(tmp_path / "t")
    )
    assert code == 2 and "error: --type applies to --format gguf; toy writes names and shapes" in err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("name", list(EXPORTERS))
def test_every_exporter_states_what_it_is(name):
    """Each registered exporter names its format, what it writes, a verdict with a reason on every
    scheme the docs table shows, and an output name."""
    e = EXPORTERS[name]
    assert e.name == name and e.format in formats() and e.writes
    assert e.selected_by is None or e.selected_by in ExportSettings.__dataclass_fields__
    for _, facts in export_registry.SCHEMES:
        v = e.takes(facts)
        assert v.kind in (EXACT, LOSSY, REFUSED) and v.reason
    assert e.out_name("m", ExportSettings())


def _recipe(tmp_path, formats) -> Path:
    p = tmp_path / "suite.yaml"
    p.write_text(
        "variants:\n  - name: int4\n    steps:\n      - quantize: {method: rtn, group_size: 64}\n"
        f"export: {{formats: [{', '.join(formats)}]}}\n"
    )
    return p


def test_a_run_writes_every_format_its_recipe_names(toy, cli, tiny_llama, tmp_path):
    args = ["run", str(_recipe(tmp_path, ["toy"])), "--model", str(tiny_llama), "--out", str(tmp_path / "r")]
    args += ["--skip-eval", "--skip-bench", "--json"]
    code, out, err, rep = cli(*args)
    assert code == 0, err
    for name in ("baseline", "int4"):
        made = rep["variants"][name]["exports"]["toy"]
        assert Path(made["out"]) == tmp_path / "r" / "toy" / f"{name}.toy.json" and made["tensors"] > 0
        assert "gguf" not in rep["variants"][name]
    code, out, err, again = cli(*args)  # unchanged: reused, as every step
    assert code == 0 and "export toy: reusing" in err
    assert again["variants"]["int4"]["exports"] == rep["variants"]["int4"]["exports"]


def test_a_run_refuses_an_unknown_format_before_anything_runs(cli, tiny_llama, tmp_path):
    args = ["run", str(_recipe(tmp_path, ["gguf", "onnx"])), "--model", str(tiny_llama), "--out", str(tmp_path / "r")]
    code, out, err, _ = cli(*args)
    assert code == 2 and "export.formats[1]: unknown export format 'onnx'" in err
    assert not (tmp_path / "r").exists()
