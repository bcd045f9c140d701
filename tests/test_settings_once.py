"""Each command's options exist once, as its settings record's fields (core/option_fields.py): the
click options (cli/_options.py) and the recipe section (recipe/section_fields.py) are made from
them. For every command with a settings record: its options are the record's fields (names,
flags, defaults), its recipe section's keys are too (types, defaults, values), and a value other
than the default reaches the settings the command builds, from the command line and from a recipe.
`quantkit load` parses its options into the LoadConfig it runs, and a lever study's `load:` section
is made from the same options but for the differences it declares: both reach that LoadConfig."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Literal, get_args, get_origin

import click
import pytest
import torch
from pydantic import ValidationError

from quantkit.bench.bench_settings import BenchSettings
from quantkit.cli._options import cli_fields
from quantkit.core.option_fields import (
    FLAG,
    FLOATS,
    INTS,
    MANY,
    ONOFF,
    SWITCH,
    WORDS,
    default_of,
    defaults,
    flag,
    section_key,
    spec,
)
from quantkit.errors import QuantkitError
from quantkit.evals.eval_settings import EvalSettings
from quantkit.export.exporter import ExportSettings
from quantkit.load.config import LoadConfig, Slo, build_config, default_workload
from quantkit.load.load_options import LoadOptions
from quantkit.load.named_workloads import parse_named
from quantkit.load.study import STUDY_LOAD_DEFAULTS, LoadSpec, Study, load_config
from quantkit.load.workload import LengthSpec, Workload
from quantkit.pipeline.pareto_settings import ParetoSettings
from quantkit.recipe.bench_options import BenchOptions
from quantkit.recipe.eval_options import EvalOptions
from quantkit.recipe.files import recipe_from_dict
from quantkit.recipe.schema import BenchConfig, EvalConfig


class Captured(QuantkitError):
    """Raised where a command hands its settings on: it stops there, exit 2."""


@dataclass(frozen=True)
class Command:
    name: str
    settings: type
    capture: tuple[str, str]  # (module, name) of the function that receives the settings
    settings_arg: Callable  # its arguments -> the settings
    args: Callable  # (model, tmp_path) -> the command's arguments but the options under test
    not_settings: frozenset  # its options that are no settings field
    given: frozenset = frozenset()  # settings fields the command fills from elsewhere (arguments, --debug)
    # fields -> (command-line value, the field's value) where the generic choice does not fit
    values: dict | None = None
    free: Callable | None = None  # (monkeypatch) -> None: lets a non-default value through checks this test skips
    moves: dict | None = None  # field -> the fields the command fills from it (the engine's device and threads)


def _bench_free(monkeypatch):
    monkeypatch.setattr("quantkit.bench.bench_settings.check_settings", lambda s: None)  # --tensor-parallel 2 on a CPU


COMMANDS = [
    Command(
        "bench",
        BenchSettings,
        ("quantkit.bench.bench_runner", "bench_many"),
        lambda sources, s, *a, **k: s,
        lambda model, tmp: [str(model)],
        frozenset(
            {"models", "shapes", "shape_bits", "probe", "as_json", "as_csv", "as_md", "plot", "out_json", "force"}
            | {"update_card", "plan_only"}
        ),
        values={
            "device": ("cpu:0", torch.device("cpu", 0)),
            "engine": ("eager", "eager"),
            "prompt_sweep": ("8,12", (8, 12)),
            "depths": ("0,64", (0, 64)),
            "kv_caches": ("q8_0", ("q8_0",)),
            "threads": ("3", 3),  # not the engine's own count on a small machine
        },
        given=frozenset({"seed"}),  # the prompts' seed: no option
        free=_bench_free,
        moves={"engine": {"device", "threads"}, "device": {"threads"}},
    ),
    Command(
        "eval",
        EvalSettings,
        ("quantkit.evals.eval_runner", "run_eval"),
        lambda model, base, s, runtime: s,
        lambda model, tmp: [str(model), "--baseline", str(model)],
        frozenset({"model", "baseline", "update_card", "plan_only", "as_json"}),
        values={
            "texts": ("set:a", ("set:a",)),
            "position_buckets": ("16,32", (16, 32)),
            "tasks": ("qk_facts,qk_cloze", ("qk_facts", "qk_cloze")),
            "device": ("cpu", "cpu"),
            "kv_cache": ("f16", "f16"),
            "engine": ("llamacpp", "llamacpp"),
        },
        moves={"tasks": {"texts"}},  # the default texts are read where no tasks are given
    ),
    Command(
        "export",
        ExportSettings,
        ("quantkit.cli.export_cmd", "exporter_for"),
        lambda fmt, s: s,
        lambda model, tmp: [str(model), "--format", "gguf"],
        frozenset({"artifact", "fmt", "out", "mixed", "mixed_types", "mixed_rounding", "as_json"}),
        # --mixed, --mixed-types and --mixed-rounding are read into the first two (test_export_mixed_options);
        # a run gives the others from its recipe's calibration
        given=frozenset({"mixed", "mixed_gptq", "seed", "region", "imatrix"}),
        values={"kl_text": ("set:a", "set:a"), "qtype": ("Q4_K_M", "Q4_K_M"), "calib": ("self", "self")},
    ),
    Command(
        "pareto",
        ParetoSettings,
        ("quantkit.pipeline.pareto", "check_out"),
        lambda s: s,
        lambda model, tmp: [str(model), "--out", str(tmp / "front")],
        frozenset({"model", "out", "plan_only", "as_json"}),
        given=frozenset({"model", "out", "debug", "kl"}),
        values={
            "calib": ("self", "self"),
            "sizes": ("4,5", (4.0, 5.0)),
            "anchors": ("q4_k_m,Q6_K", ("Q4_K_M", "Q6_K")),
            "texts": ("set:a", ("set:a",)),
            "mixed_types": ("q4_k,Q6_K", ("Q4_K", "Q6_K")),
            "ct_recipe": ("int4-w4a16-rtn", "int4-w4a16-rtn"),
            "lines": ("llamacpp", ("llamacpp",)),
        },
    ),
]
IDS = [c.name for c in COMMANDS]
# `quantkit load` parses its options into the LoadConfig it runs (levels, workload, SLO), so its
# options reach that record by the table below (test_every_load_option_reaches_the_config_it_runs)
LOAD = Command(
    "load",
    LoadOptions,
    ("quantkit.cli.load_cmd", "execute"),
    lambda cfg, **kw: cfg,
    lambda model, tmp: ["http://127.0.0.1:1", "--model", "m"],
    frozenset({"url", "model", "out", "keep_requests", "plot", "force", "as_json"}),
)


def _command(name: str) -> click.Command:
    from quantkit.cli import cli as group

    return group.commands[name]


@pytest.mark.parametrize("c", [*COMMANDS, LOAD], ids=[*IDS, LOAD.name])
def test_the_options_are_the_settings_fields(c):
    """Each field that is an option is a click option of the command under the field's name and
    flag, with the field's default; every other option is one the command lists as no setting, and
    every other field one it fills itself."""
    params = {p.name: p for p in _command(c.name).params}
    options = {f.name: f for f in cli_fields(c.settings)}
    assert set(params) == set(options) | c.not_settings, c.name
    assert set(options).isdisjoint(c.not_settings)
    assert {f.name for f in fields(c.settings)} == set(options) | c.given, c.name  # each field has its way in
    for name, f in options.items():
        p, default, kind = params[name], default_of(f), spec(f).cli
        assert flag(f) in p.opts, name
        if kind in (INTS, FLOATS, WORDS):  # its default as text, read back as the field's
            assert (p.default is None) == (not default), name
            read = {INTS: int, FLOATS: float, WORDS: str}[kind]
            assert p.default is None or tuple(read(x) for x in p.default.split(",")) == default, name
        elif kind == MANY:
            assert p.multiple, name  # none given: the field's default (settings_from_cli)
        else:
            assert p.default == default, name
            assert p.is_flag == (kind in (FLAG, SWITCH)), name
        if spec(f).choices:
            assert tuple(p.type.choices) == tuple(spec(f).choices), name


def _value(f, p: click.Option, values: dict) -> tuple[list[str], Any]:
    """Command-line words that set `f` to a value other than its default, and that value."""
    if f.name in values:
        text, want = values[f.name]
        return [flag(f), text], want
    kind, default = spec(f).cli, default_of(f)
    if kind == FLAG:
        return [flag(f)], True
    if kind == ONOFF:
        return [flag(f), "on"], True
    if kind == SWITCH:
        return [p.secondary_opts[0] if default else p.opts[0]], not default
    if isinstance(p.type, click.Choice):
        want = next(x for x in p.type.choices if x != default)
        return [flag(f), want], want
    base = spec(f).ge or 0
    want = (default or base) + 1 if p.type is click.INT else (default or base) + 0.5
    assert p.type in (click.INT, click.FLOAT), f"{f.name}: give the test a value for it"
    return [flag(f), str(want)], want


@pytest.mark.parametrize("c", COMMANDS, ids=IDS)
def test_every_option_reaches_the_settings_the_command_builds(cli, tiny_llama, tmp_path, monkeypatch, c):
    """Each option at a value other than its default, one at a time: the settings the command hands
    on hold it, and every other field its default."""
    seen = []

    def capture(*args, **kwargs):
        seen.append(c.settings_arg(*args, **kwargs))
        raise Captured("captured")

    monkeypatch.setattr(".".join(c.capture), capture)
    if c.free:
        c.free(monkeypatch)
    params = {p.name: p for p in _command(c.name).params}
    code, _, err, _ = cli(c.name, *c.args(tiny_llama, tmp_path))
    assert code == 2 and "captured" in err, err
    base = seen[-1]  # every option at its default
    for f in cli_fields(c.settings):
        words, want = _value(f, params[f.name], c.values or {})
        code, _, err, _ = cli(c.name, *c.args(tiny_llama, tmp_path), *words)
        assert code == 2 and "captured" in err, (f.name, err)
        got = seen[-1]
        assert getattr(got, f.name) == want != getattr(base, f.name), f.name
        moved = {g.name for g in fields(got) if g.name != f.name and getattr(got, g.name) != getattr(base, g.name)}
        assert moved <= (c.moves or {}).get(f.name, set()), (f.name, moved)  # nothing else moved


def _workload(**changed) -> Workload:
    """The workload that load's option defaults build (load/load_options.py, their one place), with `changed`."""
    return replace(default_workload(), **changed)


# load's options -> (command-line words, words the value needs beside it, the LoadConfig fields it
# sets and their values) where the field is not one of LoadConfig's of the same name at a generic
# value; whatever else differs from a run with only the words beside it is a failure.
LOAD_VALUES = {
    "concurrency": (["--concurrency", "2,4"], [], {"levels": (2, 4)}),
    "rate": (["--rate", "0.5,1"], [], {"mode": "rate", "levels": (0.5, 1.0)}),
    "prompt_len": (["--prompt-len", "64"], [], {"workload": _workload(prompt_len=LengthSpec(64, 64))}),
    "shared_prefix": (["--shared-prefix", "16"], [], {"workload": _workload(shared_prefix=16)}),
    "turns": (["--turns", "2"], ["--api", "chat"], {"workload": _workload(turns=2)}),
    "headers": (["--header", "X-Key: v"], [], {"headers": {"X-Key": "v"}}),
    "session_header": (["--session-header", "x-session-id"], [], {"session_header": "x-session-id"}),
    "slo": (["--slo", "ttft=500"], [], {"slo": Slo(ttft_ms=500)}),
    "api": (["--api", "chat"], [], {"api": "chat"}),
    "engine": (["--engine", "vllm"], [], {"engine": "vllm"}),
    "no_stop": (["--no-stop"], [], {"stop_at_saturation": False}),
    "workload": (["--workload", "copy"], [], {"workload": parse_named("copy")}),
    "search": (["--search"], ["--concurrency", "1,4", "--slo", "ttft=100"], {"search": True}),
    "attribution": (["--attribution", "b.json"], [], {"attribution": "bound of b.json"}),
    "admission": (["--admission", "2"], ["--rate", "1"], {"admission": 2}),
    "class_priority": (["--class-priority", "short=0,long=1"], [], {"class_priority": {"short": 0, "long": 1}}),
    "label": (["--label", "run-a"], [], {"label": "run-a"}),
}


def test_every_load_option_reaches_the_config_it_runs(cli, monkeypatch):
    """Each of load's options at a value other than its default, one at a time: the LoadConfig the
    command runs holds it, and nothing else moved."""
    seen = []

    def capture(cfg, **kwargs):
        seen.append(cfg)
        raise Captured("captured")

    monkeypatch.setattr("quantkit.cli.load_cmd.execute", capture)
    monkeypatch.setattr("quantkit.load.bench_bound.read_attribution", lambda path: f"bound of {path}")
    params = {p.name: p for p in _command("load").params}
    config_fields = {g.name for g in fields(LoadConfig)}

    def run(*words: str) -> LoadConfig:
        code, _, err, _ = cli("load", *LOAD.args(None, None), *words)
        assert code == 2 and "captured" in err, (words, err)
        return seen[-1]

    for f in cli_fields(LoadOptions):
        if f.name in LOAD_VALUES:
            words, also, want = LOAD_VALUES[f.name]
        else:
            assert f.name in config_fields, f"{f.name}: give LOAD_VALUES its value"
            words, value = _value(f, params[f.name], {})
            also, want = [], {f.name: value}
        base, got = run(*also), run(*also, *words)
        assert {name: getattr(got, name) for name in want} == want, f.name
        assert all(getattr(base, name) != value for name, value in want.items()), f.name
        moved = {g for g in config_fields - set(want) if getattr(got, g) != getattr(base, g)}
        assert not moved, (f.name, moved)


def test_a_load_option_not_given_is_the_fields_default():
    """LoadConfig's defaults are what build_config makes of LoadOptions' (those of a field of the
    option's name are the option's own)."""
    built = build_config(LoadOptions(), url="http://127.0.0.1:1", model="m")
    assert built == LoadConfig(url="http://127.0.0.1:1", model="m", mode="concurrency", levels=built.levels)
    option_defaults = defaults(LoadOptions)
    parsed = {"workload", "headers", "slo", "attribution", "class_priority"}  # read into other types
    for g in fields(LoadConfig):
        if g.name in option_defaults and g.name not in parsed:
            assert default_of(g) == option_defaults[g.name], g.name


def test_a_studys_load_section_is_the_load_options():
    """A lever study's `load:` keys are load's options a study sets, under their keys, with their
    defaults but the study's declared own (STUDY_LOAD_DEFAULTS)."""
    keyed = {section_key(f): f for f in fields(LoadOptions) if spec(f).recipe}
    assert list(LoadSpec.model_fields) == list(keyed)
    renamed = {f.name: key for key, f in keyed.items() if key != f.name}
    assert renamed == {"timeout_s": "timeout"}  # the study's spelling
    for key, f in keyed.items():
        want = STUDY_LOAD_DEFAULTS.get(f.name, default_of(f))
        assert LoadSpec.model_fields[key].default == want, key
    assert set(STUDY_LOAD_DEFAULTS) <= {f.name for f in keyed.values()}
    assert {f.name for f in fields(LoadOptions) if not spec(f).recipe} == {"headers", "server_pid", "label"}


# A study's load keys -> (its value in the YAML, values beside it, the LoadConfig fields it sets).
STUDY_VALUES = {
    "concurrency": ("2,4", {}, {"levels": (2, 4)}),
    "rate": (0.5, {}, {"mode": "rate", "levels": (0.5,)}),
    "prompt_len": (64, {}, {"workload": _workload(prompt_len=LengthSpec(64, 64))}),
    "shared_prefix": (16, {}, {"workload": _workload(shared_prefix=16)}),
    "turns": (2, {"api": "chat"}, {"workload": _workload(turns=2)}),
    "session_header": ("x-session-id", {}, {"session_header": "x-session-id"}),
    "slo": ("ttft=500", {}, {"slo": Slo(ttft_ms=500)}),
    "api": ("chat", {}, {"api": "chat"}),
    "engine": ("vllm", {}, {"engine": "vllm"}),  # not llama-server's own, llamacpp
    "timeout": (5.0, {}, {"timeout_s": 5.0}),
    "no_stop": (True, {}, {"stop_at_saturation": False}),
    "workload": ("copy", {}, {"workload": parse_named("copy")}),
    "search": (True, {"concurrency": "1,4", "slo": "ttft=100"}, {"search": True}),
    "attribution": ("b.json", {}, {"attribution": "bound of b.json"}),
    "admission": (2, {"rate": "1"}, {"admission": 2}),
    "class_priority": ("short=0", {}, {"class_priority": {"short": 0}}),
}


def test_every_study_load_key_reaches_the_config_it_runs(monkeypatch):
    """Each key of a study's `load:` at a value other than its default: the lever's LoadConfig
    holds it, and nothing else moved."""
    monkeypatch.setattr("quantkit.load.study.read_attribution", lambda path: f"bound of {path}")
    config_fields = {g.name for g in fields(LoadConfig)}

    def config(load: dict) -> LoadConfig:
        study = Study.model_validate(
            {"name": "s", "server": {"engine": "llama-server", "model": "m"}, "load": load, "levers": [{"name": "a"}]}
        )
        return load_config(study, study.levers[0])

    for key, info in LoadSpec.model_fields.items():
        if key in STUDY_VALUES:
            value, also, want = STUDY_VALUES[key]
        else:
            assert key in config_fields, f"{key}: give STUDY_VALUES its value"
            value = (info.default or 0) + (1 if info.annotation in (int, int | None) else 0.5)
            also, want = {}, {key: value}
        base, got = config(also), config({**also, key: value})
        assert {name: getattr(got, name) for name in want} == want, key
        assert all(getattr(base, name) != v for name, v in want.items()), key
        moved = {g for g in config_fields - set(want) if getattr(got, g) != getattr(base, g)}
        assert not moved, (key, moved)


@pytest.mark.parametrize(
    "args, mixed, gptq",
    [
        ([], None, True),
        (["--mixed"], "default", True),
        (["--mixed", "--mixed-types", "Q4_K,Q6_K", "--mixed-rounding", "llama-quantize"], "Q4_K,Q6_K", False),
    ],
)
def test_export_mixed_options(cli, tiny_llama, monkeypatch, args, mixed, gptq):
    """export's --mixed, --mixed-types and --mixed-rounding: one field, the types --mixed chooses among."""
    from quantkit.quantize.kquant_chooser import DEFAULT_TYPES

    seen = []

    def capture(fmt, s):
        seen.append(s)
        raise Captured("captured")

    monkeypatch.setattr("quantkit.cli.export_cmd.exporter_for", capture)
    code, _, err, _ = cli("export", str(tiny_llama), "--format", "gguf", "--type", "Q4_K_M", *args)
    assert code == 2 and "captured" in err, err
    want = ",".join(DEFAULT_TYPES) if mixed == "default" else mixed
    assert (seen[-1].mixed, seen[-1].mixed_gptq) == (want, gptq)


def _literal(annotation) -> tuple | None:
    """A Literal's values, alone or with None."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    inner = [a for a in get_args(annotation) if get_origin(a) is Literal]
    return get_args(inner[0]) if inner else None


# Each recipe section made from a settings record: the section, the record, the keys of the
# section that are not its options, and values other than the defaults (key -> (in the recipe,
# in the settings)) where the generic choice does not fit.
SECTIONS = {"bench": (BenchConfig, BenchOptions, {"engine", "engines"}), "eval": (EvalConfig, EvalOptions, {"engines"})}


@pytest.mark.parametrize("section", list(SECTIONS))
def test_the_recipe_section_is_the_settings_fields(section):
    """The section's keys are the options a recipe sets, each with the field's default, values and bound."""
    model, options, own = SECTIONS[section]
    keyed = {f.name: f for f in fields(options) if spec(f) and spec(f).recipe}
    assert set(model.model_fields) == set(keyed) | own
    for name, f in keyed.items():
        info = model.model_fields[name]
        assert info.default == default_of(f), name
        if spec(f).choices:
            assert set(_literal(info.annotation)) - {None} == set(spec(f).choices), name
    engine = default_of(next(f for f in fields(options) if f.name == "engine"))
    assert model().engines == (engine,)  # the section's default engine is the command's


def test_the_names_the_options_take_are_the_registries():
    """The engines and backends the options name below their packages are the registered ones."""
    from quantkit.bench.engines import ENGINES
    from quantkit.evals.lmeval import BACKENDS
    from quantkit.evals.scorers import SCORERS
    from quantkit.recipe.bench_options import BENCH_ENGINES
    from quantkit.recipe.eval_options import EVAL_ENGINES, TASK_BACKENDS

    assert BENCH_ENGINES is ENGINES
    assert (EVAL_ENGINES, TASK_BACKENDS) == (tuple(SCORERS), tuple(BACKENDS))


def _recipe(bench: dict):
    return recipe_from_dict({"steps": [{"quantize": {"method": "rtn"}}], "bench": bench})


BENCH_RECIPE_VALUES = {
    "device": ("cpu:0", torch.device("cpu", 0)),
    "prompt_sweep": ([8, 12], (8, 12)),
    "depths": ([0, 64], (0, 64)),
    "threads": (3, 3),  # not the engine's own count on a small machine
}


def test_every_bench_key_of_a_recipe_reaches_the_settings():
    """A recipe's bench key at a value other than its default arrives in the settings `quantkit run`
    benches with (BenchSettings.from_recipe), for an engine that has the setting."""
    from quantkit.bench.engines import engine_class

    base = BenchSettings.from_recipe(_recipe({}).bench, "eager")
    for f in fields(BenchOptions):
        if not (spec(f) and spec(f).recipe):
            continue
        if f.name in BENCH_RECIPE_VALUES:
            given, want = BENCH_RECIPE_VALUES[f.name]
        elif spec(f).choices:
            given = want = next(x for x in spec(f).choices if x != default_of(f))
        elif isinstance(default_of(f), bool):
            given = want = not default_of(f)
        else:
            given = want = (default_of(f) or spec(f).ge or 0) + 1
        engine = "llamacpp" if f.name == "flash_attn" else "eager"
        assert f.name != "flash_attn" or engine_class(engine).flash_attn_lever
        got = BenchSettings.from_recipe(_recipe({f.name: given}).bench, engine)
        assert getattr(got, f.name) == want != getattr(base, f.name), f.name


@pytest.mark.parametrize(
    "bench, key",
    [
        ({"prompt_len": 0}, "prompt_len"),
        ({"gen_len": 1}, "gen_len"),
        ({"repeats": 0}, "repeats"),
        ({"warmups": -1}, "warmups"),
        ({"min_seconds": -0.5}, "min_seconds"),
        ({"threads": 0}, "threads"),
        ({"depths": [-1]}, "depths"),
        ({"depths": [8, 8]}, "each depth at most once"),
        ({"depths": [8], "prompt_sweep": [16]}, "prompt_sweep and depths"),
        ({"flash_attn": "sometimes"}, "flash_attn"),
        ({"dtype": "int8"}, "dtype"),
        ({"device": "gpu"}, "device"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_a_recipe_refuses_what_the_command_refuses(bench, key):
    """The bounds, values and combinations of the options, as the section checks them."""
    with pytest.raises((ValidationError, QuantkitError), match=key):
        _recipe(bench)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--prompt-len", "0"], "--prompt-len must be at least 1, not 0"),
        (["--gen-len", "1"], "--gen-len must be at least 2, not 1"),
        (["--min-seconds", "nan"], "--min-seconds must be a finite number, at least 0, not nan"),
        (["--sweep", "0,8"], "--sweep 0,8: each must be at least 1"),
        (["--threads", "0"], "--threads must be at least 1, not 0"),
    ],
)
def test_the_command_refuses_the_same_bounds_in_one_line(cli, tiny_llama, args, says):
    code, _, err, _ = cli("bench", str(tiny_llama), *args)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
