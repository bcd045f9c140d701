"""Hostile and broken input through the CLI: every kind is one line naming the file, exit 2, no
traceback, nothing written, and code shipped with a checkpoint runs only with --trust-remote-code."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from fixtures import RECIPES

RTN = ["--set", "steps[0].quantize.group_size=32"]

BINARY = bytes(range(256)) * 4 + os.urandom(512)
PASSWD = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"


def one_line_error(code: int, err: str, *needles: str) -> None:
    """Exit 2 and one `error:` line, the last (progress notes such as `loading X` may come before it)."""
    assert code == 2, err
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


def rtn_recipe(tmp_path: Path) -> Path:
    p = tmp_path / "rtn.yaml"
    p.write_text("steps:\n  - quantize: {method: rtn, group_size: 32}\n")
    return p


def convert(cli, model, out, *extra):
    return cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(model),
        "--out",
        str(out),
        *RTN,
        *extra,
        "--json",
    )


# ---------------------------------------------------------------- C1: recipe files and includes


@pytest.mark.parametrize(
    "content",
    [
        BINARY,
        PASSWD.encode(),
        b"- a\n- list\n",
        b"just a sentence\n",
        b"\x00\x00\x00\x00",
        "steps: [\u00e9]".encode("latin-1"),
        b"a: &x [1]\nb: *x\n",
        b"[" * 200000,
    ],
    ids=["binary", "passwd", "list", "scalar", "nul", "latin1", "alias", "deep"],
)
def test_a_file_that_is_not_a_recipe_is_one_line(cli, tmp_path, content):
    p = tmp_path / "r.yaml"
    p.write_bytes(content)
    code, _, err, _ = cli("recipe", "validate", str(p))
    one_line_error(code, err, str(p))
    code, _, err, _ = cli("convert", str(p), "--model", "x", "--out", str(tmp_path / "o"))
    one_line_error(code, err, str(p))
    assert not (tmp_path / "o").exists()


def test_a_huge_file_is_not_a_recipe(cli, tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("# " + "x" * (2 << 20) + "\nsteps: []\n")
    code, _, err, _ = cli("recipe", "validate", str(p))
    one_line_error(code, err, str(p), "larger than")


def outside_refs(tmp_path: Path) -> dict[str, str]:
    """Ways an include can leave the recipe's tree: `..`, an absolute path, a symlink inside it."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "q.yaml").write_text("steps:\n  - quantize: {method: rtn}\n")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True, exist_ok=True)
    link = tree / "link.yaml"
    if not link.exists():
        link.symlink_to(outside / "q.yaml")
    linkdir = tree / "linkdir"
    if not linkdir.exists():
        linkdir.symlink_to(outside)
    loop = tree / "loop.yaml"
    if not loop.is_symlink():
        loop.symlink_to(tree / "loop.yaml")
    return {
        "dotdot": "../outside/q.yaml",
        "deep-dotdot": "sub/../../outside/q.yaml",
        "absolute": str(outside / "q.yaml"),
        "symlink": "link.yaml",
        "symlinked-dir": "linkdir/q.yaml",
        "etc-passwd": "/etc/passwd",
        "loop": "loop.yaml",
        "not-a-string": "[a, b]",
        "dev-zero": "/dev/zero",
    }


@pytest.mark.parametrize(
    "kind",
    ["dotdot", "deep-dotdot", "absolute", "symlink", "symlinked-dir", "etc-passwd", "dev-zero", "loop", "not-a-string"],
)
def test_includes_are_confined_to_the_recipe_tree(cli, tmp_path, kind):
    ref = outside_refs(tmp_path)[kind]
    suite = tmp_path / "tree" / "suite.yaml"
    suite.write_text(f"variants:\n  - name: q\n    recipe: {ref}\n")
    code, _, err, _ = cli("recipe", "validate", str(suite))
    expect = {"loop": "symlink loop", "not-a-string": "expected a recipe file name"}.get(
        kind, "outside the recipe's directory"
    )
    one_line_error(code, err, str(suite), "variants[0].recipe", expect)
    if kind in ("loop", "not-a-string", "etc-passwd", "dev-zero"):
        return
    code, _, err, _ = cli("recipe", "validate", "--include-dir", str(tmp_path / "tree" / "sub"), str(suite))
    one_line_error(code, err, "outside the recipe's directory")  # allowing another directory does not open this one
    code, _, err, data = cli("recipe", "validate", "--include-dir", str(tmp_path / "outside"), str(suite), "--json")
    assert code == 0, err  # the user's explicit allowance opens that directory
    assert data["valid"][0]["variants"] == ["q"]


def test_includes_inside_the_tree_and_its_subdirectories(tmp_path):
    from quantkit.recipe.files import load_recipe

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "q.yaml").write_text("steps:\n  - quantize: {method: rtn}\n")
    (tmp_path / "sub" / "alias.yaml").symlink_to(tmp_path / "sub" / "q.yaml")  # a symlink that stays inside is fine
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "variants:\n  - name: a\n    recipe: sub/q.yaml\n  - name: b\n    recipe: sub/alias.yaml\n"
        "  - name: c\n    recipe: sub/../sub/q.yaml\n"
    )
    assert [v.steps[0].quantize.method for v in load_recipe(suite).variants] == ["rtn"] * 3


@pytest.mark.parametrize(
    "content",
    [BINARY, PASSWD.encode(), b"- a list\n", b"", b"description: only words\n", b"steps: []\n"],
    ids=["binary", "passwd", "list", "empty", "no-steps", "empty-steps"],
)
def test_an_included_file_that_is_not_a_recipe_names_that_file(cli, tmp_path, content):
    (tmp_path / "inc.yaml").write_bytes(content)
    suite = tmp_path / "suite.yaml"
    suite.write_text("variants:\n  - name: int4\n    recipe: inc.yaml\n")
    code, _, err, _ = cli("recipe", "validate", str(suite))
    one_line_error(code, err, str(tmp_path / "inc.yaml"), f"included by {suite}")


@pytest.mark.parametrize(
    "typo,key",
    [
        ("stepz:\n  - quantize: {method: rtn}\n", "stepz: unknown key"),
        ("steps:\n  - quantize: {method: rtn, bitz: 4}\n", "steps[0].quantize.bitz: unknown key"),
        ("steps:\n  - quantize: {method: rtn}\ncalibration: {samplez: 4}\n", "calibration.samplez: unknown key"),
    ],
)
def test_included_recipes_are_validated_strictly(cli, tmp_path, typo, key):
    """A typo in an included recipe once made `run` report the unmodified model as the INT4 variant."""
    (tmp_path / "int4.yaml").write_text(typo)
    suite = tmp_path / "suite.yaml"
    suite.write_text("variants:\n  - name: fp16\n    baseline: true\n  - name: int4\n    recipe: int4.yaml\n")
    code, _, err, _ = cli("recipe", "validate", str(suite))
    one_line_error(code, err, f"{tmp_path / 'int4.yaml'} (included by {suite}: variants[1].recipe)", key)


@pytest.mark.parametrize(
    "variants,message",
    [
        ("  - name: int4\n", "variants[0] (int4): no steps"),
        ("  - name: int4\n    steps: []\n", "variants[0] (int4): no steps"),
        (
            "  - name: a\n    baseline: true\n  - name: b\n    baseline: true\n",
            "more than one variant has baseline: true",
        ),
        ("  - name: a\n    baseline: true\n    steps:\n      - quantize: {method: rtn}\n", "it takes no steps"),
        ("  - name: a\n    recipe: q.yaml\n    steps:\n      - quantize: {method: rtn}\n", "either recipe: or steps:"),
    ],
)
def test_a_variant_converts_something_unless_it_is_the_baseline(cli, tmp_path, variants, message):
    (tmp_path / "q.yaml").write_text("steps:\n  - quantize: {method: rtn}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text("variants:\n" + variants)
    code, _, err, _ = cli("recipe", "validate", str(suite))
    one_line_error(code, err, str(suite), message)


def test_an_empty_recipe_is_an_error(cli, tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("description: nothing\n")
    code, _, err, _ = cli("recipe", "validate", str(p))
    one_line_error(code, err, "no steps and no variants")


@pytest.mark.parametrize("name", ["/tmp/x", "../../x", "a/b", "..", ".hidden", "-rf", "a\\b", "x" * 101, "with space"])
@pytest.mark.parametrize("where", ["recipe", "variant", "included"])
def test_names_are_plain_names(cli, tmp_path, name, where):
    (tmp_path / "q.yaml").write_text(f"name: {json.dumps(name)}\nsteps:\n  - quantize: {{method: rtn}}\n")
    p = tmp_path / "r.yaml"
    if where == "recipe":
        p.write_text(f"name: {json.dumps(name)}\nsteps:\n  - quantize: {{method: rtn}}\n")
    elif where == "variant":
        p.write_text(f"variants:\n  - name: {json.dumps(name)}\n    steps:\n      - quantize: {{method: rtn}}\n")
    else:
        p.write_text("variants:\n  - recipe: q.yaml\n")
    code, _, err, _ = cli("recipe", "validate", str(p))
    one_line_error(code, err, "name: must be a plain name")


def _reserved_spellings() -> list[str]:
    from quantkit.recipe.schema import RESERVED_NAMES

    return [spelling for name in RESERVED_NAMES for spelling in (name, name.upper(), name.capitalize())]


RTN_STEPS = "steps:\n  - quantize: {method: rtn}\n"


@pytest.mark.parametrize("name", _reserved_spellings())
@pytest.mark.parametrize(
    "where", ["variant", "included variant", "included file's name", "one-variant recipe", "file name", "--set"]
)
def test_names_run_gives_its_own_rows_are_refused(cli, tmp_path, name, where):
    """A quantized variant named like a row `quantkit run` adds itself (the unmodified checkpoint's
    "baseline") would take that row over: refused in one line naming the file and key, wherever the
    name comes from, in any letter case (names are file names on case-insensitive file systems too)."""
    (tmp_path / "q.yaml").write_text(RTN_STEPS)
    (tmp_path / f"{name}.yaml").write_text(RTN_STEPS)
    p = tmp_path / "r.yaml"
    extra, needle, where_in_file = [], str(p), "variants[0]: "
    if where == "variant":
        p.write_text(f"variants:\n  - name: {name}\n    steps:\n      - quantize: {{method: rtn}}\n")
    elif where == "included variant":
        p.write_text(f"variants:\n  - name: {name}\n    recipe: q.yaml\n")
    elif where == "included file's name":  # the included file names itself; the variant takes that name
        (tmp_path / "q.yaml").write_text(f"name: {name}\n{RTN_STEPS}")
        p.write_text("variants:\n  - recipe: q.yaml\n")
        needle, where_in_file = str(tmp_path / "q.yaml"), ""
    elif where == "one-variant recipe":
        p.write_text(f"name: {name}\n{RTN_STEPS}")
        where_in_file = ""
    elif where == "file name":  # a recipe without name: takes its file's
        p = tmp_path / f"{name}.yaml"
        needle, where_in_file = str(p), ""
    else:
        p.write_text("variants:\n  - name: int4\n    steps:\n      - quantize: {method: rtn}\n")
        extra, needle = ["--set", f"variants[0].name={name}"], f"--set variants[0].name={name}"
    code, _, err, _ = cli("recipe", "validate", str(p), *extra)
    one_line_error(code, err, needle, f"{where_in_file}name {name!r} is reserved", "unmodified source checkpoint")


def test_a_run_refuses_a_variant_named_baseline_before_writing(cli, tiny_llama, tmp_path):
    """The reported case: a suite whose one variant, named baseline, is INT4 RTN ran (exit 0) and
    reported the INT4 figures as "the unmodified source checkpoint"."""
    (tmp_path / "int4-w4a16-rtn.yaml").write_text((RECIPES / "int4-w4a16-rtn.yaml").read_text())
    suite = tmp_path / "suite.yaml"
    suite.write_text("variants:\n  - name: baseline\n    recipe: int4-w4a16-rtn.yaml\n")
    out = tmp_path / "run"
    code, _, err, _ = cli(
        "run", str(suite), "--model", str(tiny_llama), "--out", str(out), "--skip-eval", "--skip-bench"
    )
    one_line_error(code, err, str(suite), "variants[0]: name 'baseline' is reserved")
    assert not out.exists()


def test_the_unmodified_checkpoint_may_keep_its_name_and_names_differ_in_more_than_case(cli, tmp_path):
    from quantkit.recipe.files import load_recipe

    p = tmp_path / "r.yaml"
    p.write_text(
        "variants:\n  - name: baseline\n    baseline: true\n  - name: int4\n"
        "    steps:\n      - quantize: {method: rtn}\n"
    )
    assert [v.name for v in load_recipe(p).variants] == ["baseline", "int4"]
    p.write_text(
        "variants:\n  - name: int4\n    steps:\n      - quantize: {method: rtn}\n"
        "  - name: INT4\n    steps:\n      - quantize: {method: rtn, group_size: 64}\n"
    )
    code, _, err, _ = cli("recipe", "validate", str(p))
    one_line_error(code, err, str(p), "variant names must be unique, ignoring case")


def test_run_never_writes_outside_its_directory(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    p = tmp_path / "work" / "r.yaml"
    p.write_text("name: ../../escaped\nsteps:\n  - quantize: {method: rtn}\n")
    code, _, err, _ = cli("run", str(p), "--model", "x")
    one_line_error(code, err, "name: must be a plain name")
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "escaped").exists()


def test_default_names_from_odd_file_names_are_plain(tmp_path):
    from quantkit.recipe.files import load_recipe

    p = tmp_path / "my recipe (v2).yaml"
    p.write_text("steps:\n  - quantize: {method: rtn}\n")
    r = load_recipe(p)
    assert r.name == "my-recipe-v2-" and r.all_variants()[0].name == "my-recipe-v2-"


def test_bad_set_value_is_one_line(cli, tmp_path):
    code, _, err, _ = cli("recipe", "validate", str(rtn_recipe(tmp_path)), "--set", "steps=[")
    one_line_error(code, err, "--set steps=[", "not valid YAML")


# ---------------------------------------------------------------- C2: broken checkpoints


def broken_copy(src: Path, dst: Path, name: str, content) -> Path:
    shutil.copytree(src, dst)
    if content is None:
        (dst / name).unlink()
    elif callable(content):
        (dst / name).write_text(json.dumps(content(json.loads((dst / name).read_text()))))
    else:
        (dst / name).write_bytes(content)
    return dst


def _drop(*keys):
    return lambda cfg: {k: v for k, v in cfg.items() if k not in keys}


CONFIGS = {
    "invalid-json": b'{"model_type": "llama", ',
    "binary": BINARY,
    "a-list": b"[1, 2, 3]",
    "no-model-type": _drop("model_type"),
    "no-hidden-size": _drop("hidden_size"),
    "no-layers": _drop("num_hidden_layers"),
    "no-sizes": _drop("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"),
    "string-size": lambda c: {**c, "hidden_size": "128"},
    "negative-size": lambda c: {**c, "num_hidden_layers": -2},
    "heads-do-not-divide": lambda c: {**c, "num_attention_heads": 3, "head_dim": None},
    "wrong-width": lambda c: {**c, "intermediate_size": 128},
}
CONFIG_MESSAGES = {
    "invalid-json": "not valid JSON",
    "binary": "not valid JSON",
    "a-list": "expected a JSON object",
    "no-model-type": "no model_type",
    "no-hidden-size": "missing hidden_size",
    "no-layers": "missing num_hidden_layers",
    "no-sizes": "missing hidden_size, num_hidden_layers, num_attention_heads, vocab_size",
    "string-size": "hidden_size must be a positive integer",
    "negative-size": "num_hidden_layers must be a positive integer",
    "heads-do-not-divide": "not a multiple of the number of attention heads",
    "wrong-width": "describes [128, 128]",
}


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_broken_config_json_is_one_line(cli, tiny_llama, tiny_text, tmp_path, kind):
    model = broken_copy(tiny_llama, tmp_path / "m", "config.json", CONFIGS[kind])
    code, _, err, _ = convert(cli, model, tmp_path / "out")
    one_line_error(code, err, str(model), CONFIG_MESSAGES[kind])
    assert not (tmp_path / "out").exists()
    if kind not in ("heads-do-not-divide", "wrong-width"):  # eval refuses before it loads anything
        code, _, err, _ = cli("eval", str(model), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}")
        one_line_error(code, err, "config.json")


def _tokenizer_json(mutate):
    def edit(tok: dict) -> dict:
        return mutate(dict(tok))

    return edit


TOKENIZERS = {
    "tokenizer.json binary": ("tokenizer.json", BINARY),
    "tokenizer.json truncated": ("tokenizer.json", b'{"version": "1.0", "added_tokens": [{"id": 0, "content'),
    "tokenizer.json no model": (
        "tokenizer.json",
        _tokenizer_json(lambda t: {k: v for k, v in t.items() if k != "model"}),
    ),
    "tokenizer.json bad model": (
        "tokenizer.json",
        _tokenizer_json(lambda t: {**t, "model": {"type": "BPE", "vocab": 5}}),
    ),
    "tokenizer.json a list": ("tokenizer.json", b"[]"),
    "tokenizer_config.json invalid": ("tokenizer_config.json", b"{not json"),
    "tokenizer_config.json a list": ("tokenizer_config.json", b"[1, 2]"),
}


@pytest.mark.parametrize("kind", list(TOKENIZERS))
def test_broken_tokenizer_files_are_one_line(cli, tiny_llama, tiny_text, tmp_path, kind):
    name, content = TOKENIZERS[kind]
    model = broken_copy(tiny_llama, tmp_path / "m", name, content)
    code, _, err, _ = cli(
        "eval", str(model), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--seq-len", "64"
    )
    one_line_error(code, err, str(model))
    code, _, err, _ = convert(cli, model, tmp_path / "out")
    one_line_error(code, err, str(model))
    assert not (tmp_path / "out").exists()


def test_weights_that_do_not_match_the_config_are_refused(tiny_llama, tmp_path):
    from safetensors.torch import load_file, save_file

    from quantkit.errors import ModelError
    from quantkit.models.checkpoint import load_model

    state = load_file(tiny_llama / "model.safetensors")
    key = "model.layers.0.self_attn.q_proj.weight"
    missing = broken_copy(tiny_llama, tmp_path / "missing", "config.json", lambda c: c)
    save_file(
        {k: v for k, v in state.items() if k != key}, str(missing / "model.safetensors"), metadata={"format": "pt"}
    )
    with pytest.raises(ModelError, match=f"no weights for {key}"):  # transformers would fill it with random numbers
        load_model(missing, dtype="float32")
    shaped = broken_copy(tiny_llama, tmp_path / "shaped", "config.json", lambda c: c)
    save_file({**state, key: state[key][:8]}, str(shaped / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ModelError, match=rf"{key} has shape \[8, 128\] in the weights but the config.json describes \[128, 128\]"
    ):
        load_model(shaped, dtype="float32")


@pytest.mark.parametrize(
    "header",
    [b"[1, 2]", b'{"w": {"dtype": "F16", "shape": [2], "data_offsets": "x"}}', b'{"w": 5}'],
    ids=["list", "bad-offsets", "not-a-table"],
)
def test_malformed_safetensors_headers(tiny_llama, tmp_path, header):
    import struct

    from quantkit.errors import ModelError
    from quantkit.models.checkpoint import check_checkpoint

    model = broken_copy(
        tiny_llama, tmp_path / "m", "model.safetensors", struct.pack("<Q", len(header)) + header + b"\0" * 16
    )
    with pytest.raises(ModelError, match="not a valid safetensors file"):
        check_checkpoint(model)


@pytest.mark.parametrize(
    "index",
    [b"{broken", b'{"weight_map": ["a"]}', b'{"weight_map": {"w": "../../etc/passwd"}}'],
    ids=["invalid-json", "not-a-map", "escaping-path"],
)
def test_malformed_safetensors_index(tiny_llama, tmp_path, index):
    from quantkit.errors import ModelError
    from quantkit.models.checkpoint import check_checkpoint

    model = broken_copy(tiny_llama, tmp_path / "m", "config.json", lambda c: c)
    (model / "model.safetensors.index.json").write_bytes(index)
    with pytest.raises(ModelError, match="model.safetensors.index.json"):
        check_checkpoint(model)


# ---------------------------------------------------------------- C2/C3: broken text


def _parquet(table: dict) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table(table), buf)
    return buf.getvalue()


LATIN1 = ("Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, d\u00e9j\u00e0 vu. " * 400).encode("latin-1")
TEXTS = {  # file name -> (bytes, or None for a parquet table built in the test; what the error says)
    "random-bytes.txt": (os.urandom(20000), "not UTF-8 text"),
    "latin1.txt": (LATIN1, "not UTF-8 text"),
    "utf16-no-bom.txt": (("plain words in utf-16 " * 400).encode("utf-16-le"), "not UTF-8 text"),
    "latin1.jsonl": (
        ("\n".join(json.dumps({"text": "caf"}) for _ in range(3)) + '\n{"text": "caf\xe9"}\n').encode("latin-1") * 50,
        "not UTF-8 text",
    ),
    "binary.jsonl": (BINARY, "not"),
    "no-text-column.parquet": (None, "no 'text' column"),
    "int-text-column.parquet": (None, "not strings"),
    "garbage.parquet": (BINARY, "not a readable parquet file"),
    "empty.txt": (b"", "no text"),
    "whitespace.txt": (b" \n\n\t \n", "no text"),
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_text_that_is_not_text_is_refused_before_any_model_loads(cli, tiny_llama, tmp_path, monkeypatch, name):
    import quantkit.evals.scorers.transformers_scorer as hf
    import quantkit.quantize.convert as qc

    content, message = TEXTS[name]
    if name == "no-text-column.parquet":
        content = _parquet({"body": ["a", "b"]})
    elif name == "int-text-column.parquet":
        content = _parquet({"text": [1, 2]})
    path = tmp_path / name
    path.write_bytes(content)
    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before reading the text"))
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("loaded the model before reading the text"))
    code, _, err, _ = cli(
        "eval", str(tiny_llama), "--baseline", str(tiny_llama), "--text", f"file:{path}", "--seq-len", "64"
    )
    one_line_error(code, err, str(path), message)
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "out"),
        "--calib",
        f"file:{path}",
    )
    one_line_error(code, err, str(path), message)
    assert not (tmp_path / "out").exists()


def test_self_as_eval_text_needs_a_model_that_loads(cli, tiny_llama, tmp_path):
    """`--text self` of a checkpoint with broken weights: one line, not a traceback."""
    model = broken_copy(tiny_llama, tmp_path / "m", "model.safetensors", b"\x08\0\0\0\0\0\0\0{}      ")
    code, _, err, _ = cli(
        "eval", str(tiny_llama), "--baseline", str(model), "--text", "self", "--seq-len", "16", "--max-tokens", "32"
    )
    assert code == 2 and "Traceback" not in err


# ---------------------------------------------------------------- C4: remote code

CONFIG_PY = """
import os

from transformers import PretrainedConfig

if os.environ.get("QK_REMOTE_MARKER"):
    open(os.environ["QK_REMOTE_MARKER"], "a").write("configuration imported\\n")


class TinyCustomConfig(PretrainedConfig):
    model_type = "tiny-custom"

    def __init__(self, vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=512, **kwargs):
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.num_attention_heads, self.intermediate_size = num_attention_heads, intermediate_size
        self.max_position_embeddings = max_position_embeddings
        super().__init__(**kwargs)
"""

MODELING_PY = '''
import os

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_tinycustom import TinyCustomConfig

if os.environ.get("QK_REMOTE_MARKER"):
    open(os.environ["QK_REMOTE_MARKER"], "a").write("modeling imported\\n")


class Block(nn.Module):
    """Pre-LayerNorm block: fused qkv attention (learned positions, no RoPE) and a GELU MLP."""

    def __init__(self, c):
        super().__init__()
        self.heads = c.num_attention_heads
        self.ln1, self.ln2 = nn.LayerNorm(c.hidden_size), nn.LayerNorm(c.hidden_size)
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.proj = nn.Linear(c.hidden_size, c.hidden_size)
        self.fc_in = nn.Linear(c.hidden_size, c.intermediate_size)
        self.fc_out = nn.Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(a)
        return x + self.fc_out(F.gelu(self.fc_in(self.ln2(x))))


class TinyCustomForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = TinyCustomConfig
    base_model_prefix = "tiny"
    _no_split_modules = ["Block"]

    def __init__(self, config):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.wte

    def set_input_embeddings(self, value):
        self.wte = value

    def forward(self, input_ids=None, attention_mask=None, labels=None, use_cache=None, **kwargs):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        return CausalLMOutputWithPast(logits=self.lm_head(self.ln_f(x)))
'''


def build_custom(out: Path, tokenizer_dir: Path) -> Path:
    """A checkpoint of an architecture transformers does not know, with its code and `auto_map`
    (its weights written directly, so building it imports none of that code)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    (out / "configuration_tinycustom.py").write_text(CONFIG_PY)
    (out / "modeling_tinycustom.py").write_text(MODELING_PY)
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    h, i, layers, vocab, pos = 64, 128, 2, len(tok), 512
    g = torch.Generator().manual_seed(0)
    rnd = lambda *shape, s=0.08: torch.randn(*shape, generator=g) * s  # noqa: E731
    state = {
        "wte.weight": rnd(vocab, h),
        "wpe.weight": rnd(pos, h, s=0.02),
        "ln_f.weight": torch.ones(h),
        "ln_f.bias": torch.zeros(h),
        "lm_head.weight": rnd(vocab, h),
    }
    for n in range(layers):
        p = f"blocks.{n}."
        state.update(
            {
                p + "ln1.weight": torch.ones(h),
                p + "ln1.bias": torch.zeros(h),
                p + "ln2.weight": torch.ones(h),
                p + "ln2.bias": torch.zeros(h),
                p + "qkv.weight": rnd(3 * h, h),
                p + "qkv.bias": torch.zeros(3 * h),
                p + "proj.weight": rnd(h, h),
                p + "proj.bias": torch.zeros(h),
                p + "fc_in.weight": rnd(i, h),
                p + "fc_in.bias": torch.zeros(i),
                p + "fc_out.weight": rnd(h, i),
                p + "fc_out.bias": torch.zeros(h),
            }
        )
    save_file(
        {k: v.half().contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    cfg = {
        "model_type": "tiny-custom",
        "architectures": ["TinyCustomForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_tinycustom.TinyCustomConfig",
            "AutoModelForCausalLM": "modeling_tinycustom.TinyCustomForCausalLM",
        },
        "vocab_size": vocab,
        "hidden_size": h,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "intermediate_size": i,
        "max_position_embeddings": pos,
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tok.save_pretrained(str(out))
    return out


def test_remote_code_never_runs_without_the_flag(cli, tiny_dir, tiny_text, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("QK_REMOTE_MARKER", str(marker))
    model = build_custom(tmp_path / "untrusted_custom", tiny_dir / "tokenizer")
    code, _, err, _ = convert(cli, model, tmp_path / "out")
    one_line_error(code, err, "defined by code in the checkpoint", "modeling_tinycustom.py", "--trust-remote-code")
    code, _, err, _ = cli(
        "eval", str(model), "--baseline", str(model), "--text", f"file:{tiny_text}", "--seq-len", "64"
    )
    one_line_error(code, err, "--trust-remote-code")
    code, _, err, _ = cli(
        "eval", str(tiny_dir / "llama-gqa"), "--baseline", str(model), "--text", f"file:{tiny_text}", "--seq-len", "64"
    )
    one_line_error(code, err, "--trust-remote-code")
    assert not marker.exists(), marker.read_text()
    assert not [m for m in sys.modules if "untrusted_custom" in m]
    assert not (tmp_path / "out").exists()


def test_trust_remote_code_converts_evaluates_and_verifies(cli, tiny_dir, tiny_text, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("QK_REMOTE_MARKER", str(marker))
    model = build_custom(tmp_path / "trusted_custom", tiny_dir / "tokenizer")
    out = tmp_path / "int4"
    code, _, err, data = convert(cli, model, out, "--trust-remote-code")
    assert code == 0, err
    assert "modeling imported" in marker.read_text()
    v = data["verification"]
    assert v["status"] == "passed" and v["mean_kl"] <= v["threshold_mean_kl"] and v["top1_agreement"] > 0.99
    assert (out / "modeling_tinycustom.py").is_file() and (out / "configuration_tinycustom.py").is_file()
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"].endswith(
        "TinyCustomForCausalLM"
    )
    code, _, err, ev = cli(
        "eval",
        str(out),
        "--baseline",
        str(model),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "256",
        "--trust-remote-code",
        "--json",
    )
    assert code == 0, err
    assert ev["baseline_check"]["match"] is True and 0 < ev["kld"]["mean"] < 0.5 and ev["top1_agreement"] > 0.5


# ---------------------------------------------------------------- C5: offline hub text, before the model


def test_offline_hf_text_fails_before_the_model_loads(cli, tiny_llama, tmp_path, monkeypatch):
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking the text"))
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "out"),
        "--calib",
        "hf:nobody/no-such-dataset:train",
    )
    one_line_error(code, err, "hf:nobody/no-such-dataset:train")
    assert not (tmp_path / "out").exists()


def test_unreachable_hub_fails_fast_without_retries(tiny_llama, monkeypatch):
    """Without HF_HUB_OFFLINE, `datasets` retries for ~25 s when the Hub cannot be reached: one
    short probe answers first."""
    import time

    import datasets
    from huggingface_hub import constants

    from quantkit.data.text import parse_spec, read_text
    from quantkit.errors import OfflineError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setattr(
        datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked before the Hub was probed")
    )
    t = time.perf_counter()
    with pytest.raises(OfflineError, match="unreachable"):
        read_text(parse_spec("hf:org/data:train"))
    assert time.perf_counter() - t < 10


def test_a_directory_the_user_cannot_write_is_one_line(cli, tiny_llama, tmp_path, monkeypatch):
    """A PermissionError on the user's own path is exit 2 naming it, not "an unexpected failure"."""
    import quantkit.quantize.convert as qc

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / "out"))

    monkeypatch.setattr(qc, "prepare", denied)
    code, _, err, _ = convert(cli, tiny_llama, tmp_path / "ro" / "out")
    one_line_error(code, err, f"{tmp_path / 'ro' / 'out'}: Permission denied")


@pytest.mark.parametrize("text", ["hf:nobody/no-such-dataset:train", "file:{tmp}/random.bin.txt"])
def test_run_checks_its_eval_text_before_converting_anything(cli, tiny_llama, tmp_path, monkeypatch, text):
    import quantkit.quantize.convert as qc

    (tmp_path / "random.bin.txt").write_bytes(os.urandom(4096))
    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("converted before checking the eval text"))
    code, _, err, _ = cli(
        "run",
        str(rtn_recipe(tmp_path)),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "run"),
        "--eval-text",
        text.format(tmp=tmp_path),
        "--skip-bench",
    )
    one_line_error(code, err, text.format(tmp=tmp_path).split(":", 1)[1].split(":")[0])


# ---------------------------------------------------------------- A6: the reload check


def test_reload_check_catches_a_precision_slip_the_old_threshold_passed(tiny_llama):
    """Weights rounded to bf16 on the way to disk: mean KL between 1e-5 and 1e-3 (2.1e-4 on the
    demo), which the old threshold (1e-3) accepted as a faithful reload."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from quantkit.errors import VerificationError
    from quantkit.models.logits import fixed_tokens, logits
    from quantkit.quantize.verify import KL_THRESHOLD, verify_reload

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float16).eval()
    ids = fixed_tokens(model.config.vocab_size)
    ref = logits(model, ids)
    same = verify_reload(ref, lambda: copy.deepcopy(model), ids, "a faithful reload")
    assert same["status"] == "passed" and same["mean_kl"] == 0.0 and same["threshold_mean_kl"] == KL_THRESHOLD == 1e-5
    slipped = copy.deepcopy(model).to(torch.bfloat16).to(torch.float16)
    with pytest.raises(VerificationError, match=r"mean KL (\S+) > 1e-05") as exc:
        verify_reload(ref, lambda: slipped, ids, "a bf16 round trip")
    measured = float(str(exc.value).split("mean KL ")[1].split(" ")[0])
    assert KL_THRESHOLD < measured < 1e-3


@pytest.mark.parametrize("recipe", ["bnb-nf4", "int4-w4a16-gptq-g64"])
def test_trust_remote_code_with_other_methods(cli, tiny_dir, tiny_text, tmp_path, recipe):
    model = build_custom(tmp_path / f"custom_{recipe.replace('-', '_')}", tiny_dir / "tokenizer")
    code, _, err, data = cli(
        "convert",
        str(RECIPES / f"{recipe}.yaml"),
        "--model",
        str(model),
        "--out",
        str(tmp_path / "a"),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        "calibration.samples=8",
        "--set",
        "calibration.seq_len=64",
        "--trust-remote-code",
        "--json",
    )
    assert code == 0, err
    assert data["verification"]["status"] == "passed" and (tmp_path / "a" / "modeling_tinycustom.py").is_file()


@pytest.mark.parametrize(
    "recipe,ignore",
    [("int4-w4a16-rtn", "['re:.*']"), ("bnb-nf4", "['re:.*']"), ("int4-w4a16-rtn", "['re:model\\..*', lm_head]")],
)
def test_a_quantize_step_that_ignores_every_layer_is_not_a_variant(
    cli, tiny_llama, tmp_path, monkeypatch, recipe, ignore
):
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / f"{recipe}.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "a"),
        "--set",
        f"steps[0].quantize.ignore={ignore}",
    )
    one_line_error(code, err, "steps[0].quantize.ignore", "nothing would be quantized")


# ---------------------------------------------------------------- non-finite values never pass a check


@pytest.mark.parametrize(
    "recipe,extra",
    [
        ("int4-w4a16-rtn", RTN),
        ("int8-w8a16-gptq", ["--set", "calibration.samples=4", "--set", "calibration.seq_len=64"]),
    ],
    ids=["rtn", "gptq"],
)
def test_non_finite_reference_logits_fail_the_reload_check(
    cli, tiny_llama, tiny_text, tmp_path, monkeypatch, recipe, extra
):
    """The converted model's own logits (the reference) NaN: the check printed `verified ... mean KL
    nan (<= 1e-05)`, wrote `"mean_kl": NaN` with `"status": "passed"`, and publish took it."""
    import torch

    from quantkit.quantize import convert as conversion

    real = conversion.logits
    monkeypatch.setattr(conversion, "logits", lambda model, ids: torch.full_like(real(model, ids), float("nan")))
    out = tmp_path / "out"
    code, _, err, _ = cli(
        "convert", recipe, "--model", str(tiny_llama), "--out", str(out), "--calib", f"file:{tiny_text}", *extra
    )
    one_line_error(code, err, "verification failed", "non-finite logits")
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def _logits(kind: str):
    import torch

    g = torch.Generator().manual_seed(0)
    good = torch.randn(2, 8, 50, generator=g)
    bad = good.clone()
    if kind == "nan":
        bad[0, 3, 7] = float("nan")
    elif kind == "inf":
        bad[1, 0, 0] = float("inf")
    else:  # finite logits whose KL overflows to NaN (log-softmax of +-3e38 is -inf)
        good[0, 0, :2], bad[0, 0, :2] = torch.tensor([3e38, -3e38]), torch.tensor([-3e38, 3e38])
    return good, bad


@pytest.mark.parametrize("kind", ["nan", "inf", "kl-overflow"])
@pytest.mark.parametrize("side", ["reference", "reloaded"])
def test_every_non_finite_comparison_fails_verification(monkeypatch, kind, side):
    """NaN compares false with any threshold (`nan > 1e-5` is False): each non-finite case is a
    failure by name, never a pass, whichever side holds it."""
    import torch

    from quantkit.errors import VerificationError
    from quantkit.models.logits import compare_logits
    from quantkit.quantize import verify

    good, bad = _logits(kind)
    ref, new = (bad, good) if side == "reference" else (good, bad)
    assert compare_logits(ref, new)["finite"] is False
    monkeypatch.setattr(verify, "logits", lambda model, ids: new)  # the reloaded model's forward
    with pytest.raises(VerificationError, match="non-finite logits"):
        verify.verify_reload(ref, object, torch.zeros(2, 8, dtype=torch.long), "a loader")


# ---------------------------------------------------------------- where run writes, what bench times


@pytest.mark.parametrize("plan", [False, True], ids=["run", "plan"])
def test_run_refuses_a_non_empty_directory_no_run_made(cli, tiny_llama, tmp_path, plan):
    """`convert` refuses a foreign non-empty --out; `run --out` wrote its artifacts and reports into one."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    args = ["run", str(rtn_recipe(tmp_path)), "--model", str(tiny_llama), "--out", str(out), "--skip-eval"]
    code, _, err, _ = cli(*args, "--skip-bench", *(["--plan"] if plan else []))
    one_line_error(code, err, f"--out {out} is not a quantkit run directory (no steps.json) and is not empty")
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]


def test_a_run_directory_is_known_as_one_from_its_start(cli, tiny_llama, tmp_path, monkeypatch):
    """steps.json is its first file: a run killed in its first step is still a run to go on with."""
    from quantkit.pipeline import run as pipeline

    def killed(self, v):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.Runner, "convert", killed)
    out = tmp_path / "r"
    args = ["run", str(rtn_recipe(tmp_path)), "--model", str(tiny_llama), "--out", str(out), "--skip-eval"]
    assert cli(*args, "--skip-bench")[0] == 130
    assert json.loads((out / "steps.json").read_text()) == {}
    (out / "artifacts").mkdir()
    (out / "artifacts" / "half-written").write_text("x")
    monkeypatch.undo()
    code, _, err, _ = cli(*args, "--skip-bench", "--plan")
    assert code == 0, err


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_bench_seconds_must_be_a_finite_number(cli, tiny_llama, value):
    code, _, err, _ = cli("bench", str(tiny_llama), "--min-seconds", value, "--engine", "eager", "--plan")
    one_line_error(code, err, "--min-seconds must be a finite number, at least 0")


# ---------------------------------------------------------------- held: special files, tags, self-inclusion


def _special(tmp_path: Path, kind: str) -> Path:
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo")  # opening it to read would block: it must never be opened
        return tmp_path / "fifo"
    if kind == "directory":
        (tmp_path / "d").mkdir()
        return tmp_path / "d"
    return Path({"dev-zero": "/dev/zero", "dev-urandom": "/dev/urandom", "proc-environ": "/proc/self/environ"}[kind])


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero", "dev-urandom", "proc-environ"])
def test_special_files_are_neither_recipes_nor_texts(cli, tiny_llama, tmp_path, kind):
    path = _special(tmp_path, kind)
    code, _, err, _ = cli("recipe", "validate", str(path))
    one_line_error(code, err, str(path))
    code, _, err, _ = cli("eval", str(tiny_llama), "--baseline", str(tiny_llama), "--text", f"file:{path}")
    one_line_error(code, err, str(path))
    code, _, err, _ = cli(
        "convert",
        "int4-w4a16-gptq-g64",
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "o"),
        "--calib",
        f"file:{path}",
    )
    one_line_error(code, err, str(path))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "text, needle",
    [
        ('steps:\n  - quantize: !!python/object/apply:os.system ["touch {marker}"]\n', "not valid YAML (line 2)"),
        ("steps: !!python/name:os.system\n", "not valid YAML (line 1)"),
        ("variants:\n  - name: a\n    recipe: r.yaml\n", "is a suite; include single-variant recipes only"),
    ],
    ids=["python-object", "python-name", "self-inclusion"],
)
def test_python_tags_and_a_recipe_including_itself_are_one_line(cli, tmp_path, text, needle):
    marker = tmp_path / "ran"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text.replace("{marker}", str(marker)))
    code, _, err, _ = cli("recipe", "validate", str(recipe))
    one_line_error(code, err, needle)
    assert not marker.exists()
