"""models/headers.py and the checks check_checkpoint makes with it: a safetensors header read within
safetensors' own limit, every tensor's bytes where its entry says, a sample of each 16-bit tensor
plausible in its labelled dtype, and the config's sizes against the tensors the headers hold, all
before anything loads or a skeleton is built."""

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit.errors import ModelError
from quantkit.models.checkpoint import check_checkpoint

MATRIX = "model.layers.0.mlp.down_proj.weight"


def write_raw(path: Path, header: dict, data: bytes, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def relabelled(src: Path, dst: Path, name: str, dtype: str) -> Path:
    """A copy of a checkpoint whose header gives tensor `name` another dtype of the same size: the
    file is well-formed, every size matches, and the values are finite."""
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    blob = f.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    header[name]["dtype"] = dtype
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n :])
    return dst


@pytest.mark.parametrize(
    "name", [MATRIX, "model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight"], ids=["mlp", "emb", "q"]
)
def test_f16_bytes_labelled_bf16_are_refused_naming_the_tensor_and_dtype(tiny_llama, tmp_path, name):
    """An F16 payload read as BF16 is ~1e-13 garbage: the model would compute NaN, and a conversion
    "verified" it with mean KL nan. It is refused where the checkpoint is read."""
    model = relabelled(tiny_llama, tmp_path / "m", name, "BF16")
    with pytest.raises(ModelError, match=rf"tensor {name} is labelled BF16 but its bytes are not BF16 weights") as e:
        check_checkpoint(model)
    assert "F16 data labelled BF16?" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("scale", [1e-4, 0.02, 1.0, 300.0], ids=["tiny", "typical", "norm-like", "large"])
def test_real_16_bit_weights_of_any_usual_magnitude_pass(tmp_path, dtype, scale):
    from quantkit.models import headers

    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": (torch.randn(64, 64, generator=g) * scale).to(getattr(torch, dtype)),
        "ones": torch.ones(64, dtype=getattr(torch, dtype)),  # a norm's weights
        "zeros": torch.zeros(128, dtype=getattr(torch, dtype)),  # a zero bias: too few values to judge
        "ternary": (torch.randint(-1, 2, (64, 64), generator=g) * scale).to(getattr(torch, dtype)),
    }
    f = tmp_path / "w.safetensors"
    save_file(tensors, str(f))
    headers.check_values(f, headers.entries(f))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_from_the_header_sample(tmp_path, bad):
    from quantkit.models import headers

    w = torch.full((32, 32), 0.01, dtype=torch.float16)
    w[16, 0] = bad  # the middle of the tensor, where the sample is read
    f = tmp_path / "w.safetensors"
    save_file({"w": w}, str(f))
    with pytest.raises(ModelError, match=r"tensor w \(F16\) holds non-finite values"):
        headers.check_values(f, headers.entries(f))


def test_at_most_a_kibibyte_is_read_per_tensor(tmp_path, monkeypatch):
    from quantkit.models import headers

    f = tmp_path / "w.safetensors"
    save_file({f"t{i}": torch.randn(256, 256, dtype=torch.float16) * 0.02 for i in range(4)}, str(f))
    read = []
    real_open = open

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def seek(self, *a):
            return self.fh.seek(*a)

        def read(self, n=-1):
            data = self.fh.read(n)
            read.append(len(data))
            return data

    table = headers.entries(f)
    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: Counting(real_open(p, mode, *a, **k)))
    headers.check_values(f, table)
    assert len(read) == 4 and max(read) <= 1024  # one 1 KiB run from the middle of each 128 KiB tensor


def _tensor(dtype="F16", shape=(2,), offsets=(0, 4)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


CRAFTED = {
    "huge header length": ({"w": _tensor()}, b"\0" * 4, 1 << 62, "a header of"),
    "header longer than the file": ({"w": _tensor()}, b"\0" * 4, 10_000, "corrupt or truncated header"),
    "not JSON": (None, b"", None, "corrupt or truncated header"),
    "negative offset": ({"w": _tensor(offsets=(-4, 0))}, b"\0" * 4, None, "negative or run backwards"),
    "reversed offsets": ({"w": _tensor(offsets=(4, 0))}, b"\0" * 4, None, "negative or run backwards"),
    "size-mismatched dtype": ({"w": _tensor("F32", (2,), (0, 4))}, b"\0" * 4, None, "takes 8 bytes"),
    "overlapping tensors": (
        {"a": _tensor(offsets=(0, 4)), "b": _tensor(offsets=(2, 6))},
        b"\0" * 6,
        None,
        "the data of a and b overlap",
    ),
    "shape not a list of sizes": ({"w": {"dtype": "F16", "shape": [-2], "data_offsets": [0, 4]}}, b"", None, "shape"),
    "truncated data": ({"w": _tensor(shape=(8,), offsets=(0, 16))}, b"\0" * 4, None, "truncated safetensors file"),
}


@pytest.mark.parametrize("kind", list(CRAFTED))
def test_crafted_safetensors_are_one_line_before_anything_loads(cli, tiny_llama, tmp_path, kind):
    header, data, length, message = CRAFTED[kind]
    model = tmp_path / "m"
    shutil.copytree(tiny_llama, model)
    f = model / "model.safetensors"
    if header is None:
        f.write_bytes(struct.pack("<Q", 9) + b"{not json" + data)
    else:
        write_raw(f, header, data, length)
    with pytest.raises(ModelError, match="not a valid safetensors file|truncated safetensors file") as e:
        check_checkpoint(model)
    assert message in str(e.value), str(e.value)
    code, _, err, _ = cli("convert", "int4-w4a16-rtn", "--model", str(model), "--out", str(tmp_path / "o"), "--plan")
    assert code == 2 and message in err and "Traceback" not in err and not (tmp_path / "o").exists()


def test_sizes_read_headers_through_the_same_bounded_reader(tmp_path):
    from quantkit.models.sizes import tensor_bytes

    (tmp_path / "m").mkdir()
    write_raw(tmp_path / "m" / "model.safetensors", {"w": _tensor()}, b"\0" * 4, 1 << 40)
    with pytest.raises(ModelError, match="a header of"):
        tensor_bytes(tmp_path / "m")


# ---------------------------------------------------------------- the config against the headers


def _with_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **changes}))
    return dst


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"num_hidden_layers": 10_000_000}, "num_hidden_layers is 10,000,000 but the weights hold 2 layers"),
        ({"num_hidden_layers": 3}, "num_hidden_layers is 3 but the weights hold 2 layers (model.layers.0 to"),
        ({"hidden_size": 4096, "head_dim": 1024}, "hidden_size is 4,096 but no weight has a dimension of 4,096"),
        ({"vocab_size": 100_000}, "vocab_size is 100,000 but no weight has a dimension of 100,000"),
        ({"text_config": {"num_hidden_layers": 100_000}}, "num_hidden_layers is 100,000"),
    ],
    ids=["10M-layers", "one-layer-more", "hidden", "vocab", "text-config"],
)
def test_a_config_that_lies_about_its_sizes_is_refused_before_any_skeleton(
    cli, tiny_llama, tiny_text, tmp_path, monkeypatch, changes, message
):
    """Checked against the tensor names and shapes in the headers: a 10,000,000-layer config for 2
    layers of weights never finished a --plan (its skeleton was being built)."""
    from quantkit.quantize import preflight

    model = _with_config(tiny_llama, tmp_path / "m", **changes)
    built = []
    monkeypatch.setattr(preflight, "meta_model", lambda *a, **k: built.append(a) or pytest.fail("skeleton built"))
    with pytest.raises(ModelError, match=message.replace("(", r"\(")):
        check_checkpoint(model)
    for args in (
        ("convert", "int4-w4a16-rtn", "--model", str(model), "--out", str(tmp_path / "o"), "--plan"),
        ("convert", "int4-w4a16-rtn", "--model", str(model), "--out", str(tmp_path / "o")),
        ("eval", str(model), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--plan"),
    ):
        code, _, err, _ = cli(*args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not built and not (tmp_path / "o").exists()


def test_fewer_layers_in_the_config_than_in_the_weights_is_allowed(tiny_llama, tmp_path):
    """A checkpoint may hold layers beyond its decoder's (a multi-token-prediction head): the
    load ignores them, and so does this check."""
    src = tmp_path / "m"
    shutil.copytree(tiny_llama, src)
    state = load_file(src / "model.safetensors")
    extra = {k.replace("layers.1.", "layers.2."): v.clone() for k, v in state.items() if ".layers.1." in k}
    save_file({**state, **extra}, str(src / "model.safetensors"), metadata={"format": "pt"})
    check_checkpoint(src)


def _without(src: Path, dst: Path, key: str | None = None, shaped: str | None = None) -> Path:
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    if key:
        state.pop(key)
    if shaped:
        state[shaped] = state[shaped][:8]
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            {"key": "model.layers.1.mlp.up_proj.weight"},
            "the checkpoint has no weights for model.layers.1.mlp.up_proj.weight; transformers would fill them",
        ),
        (
            {"shaped": "model.layers.0.self_attn.q_proj.weight"},
            "model.layers.0.self_attn.q_proj.weight has shape [8, 128] in the weights but the config.json "
            "describes [128, 128]",
        ),
        ({"key": "model.norm.weight"}, "the checkpoint has no weights for model.norm.weight"),
    ],
    ids=["missing-linear", "shaped", "missing-norm"],
)
def test_plan_says_what_the_run_would_of_missing_or_misshapen_weights(
    cli, tiny_llama, tiny_text, tmp_path, edit, message
):
    """`--plan` exited 0 on a checkpoint missing a weight that the run then refused: both say the
    same line now, and eval's plan too."""
    model = _without(tiny_llama, tmp_path / "m", **edit)
    lines = []
    for extra in (["--plan"], []):
        code, _, err, _ = cli("convert", "int4-w4a16-rtn", "--model", str(model), "--out", str(tmp_path / "o"), *extra)
        assert code == 2 and message in err, err
        lines.append(err.strip().splitlines()[-1])
    assert lines[0] == lines[1] and not (tmp_path / "o").exists()
    code, _, err, _ = cli("eval", str(model), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--plan")
    assert code == 2 and message in err, err


def test_a_tied_head_absent_from_the_weights_is_not_missing(tiny_llama, tiny_text, cli, tmp_path):
    """lm_head shares the embedding (tie_word_embeddings): no lm_head.weight in the file is right."""
    from quantkit.models import headers

    assert "lm_head.weight" not in headers.checkpoint_entries(tiny_llama)
    code, _, err, _ = cli(
        "convert", "int4-w4a16-rtn", "--model", str(tiny_llama), "--out", str(tmp_path / "o"), "--plan"
    )
    assert code == 0, err
