"""Attention transfer (gqa/transfer.py): each layer fitted to its original's output, never left worse."""

import copy
import json
from types import SimpleNamespace

import torch
from fixtures import RECIPES


def _models(tiny_llama):
    from quantkit.models.checkpoint import load_model

    teacher = load_model(tiny_llama, dtype="float32").eval()
    student = copy.deepcopy(teacher)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a damaged copy: k/v of every layer off by noise as large as the weights
        for layer in student.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.weight.add_(torch.randn(proj.weight.shape, generator=gen) * proj.weight.std())
    windows = [torch.randint(0, teacher.config.vocab_size, (1, 32), generator=gen) for _ in range(8)]
    return teacher, student, windows


def _names(model):
    return [f"model.layers.{i}.self_attn" for i in range(len(model.model.layers))]


def test_transfer_fits_each_layer_back_to_its_original(tiny_llama):
    from quantkit.gqa.recover import trained_names
    from quantkit.gqa.transfer import transfer

    teacher, student, windows = _models(tiny_llama)
    names = _names(student)
    cfg = SimpleNamespace(transfer_steps=150, lr=3e-3, batch_size=2)
    rec = transfer(
        student,
        teacher,
        [(n, student.get_submodule(n)) for n in names],
        [teacher.get_submodule(n) for n in names],
        trained_names(student, names, "kv"),
        windows,
        cfg,
    )
    assert rec["steps_per_layer"] == 150 and rec["windows"] == 8 and len(rec["relative_error"]) == len(names)
    for before, after in rec["relative_error"]:
        assert before > 0.05 and after < 0.25 * before
    # only k/v moved: q/o and everything else are the teacher's
    for name, p in student.named_parameters():
        if "k_proj" not in name and "v_proj" not in name:
            assert torch.equal(p, teacher.get_parameter(name)), name


def test_a_step_that_makes_a_layer_worse_is_undone(tiny_llama):
    from quantkit.gqa.transfer import capture, fit_layer

    teacher, student, windows = _models(tiny_llama)
    attn, t_attn = student.model.layers[0].self_attn, teacher.model.layers[0].self_attn
    records = capture(teacher, [t_attn], windows, 4)[0]
    before = {n: p.detach().clone() for n, p in attn.named_parameters()}
    params = {attn.k_proj.weight: 1.0, attn.v_proj.weight: 1.0}
    for p in params:
        p.requires_grad_(True)
    first, last = fit_layer(attn, records, params, steps=3, lr=50.0)  # a rate that can only diverge
    assert last == first
    for n, p in attn.named_parameters():
        assert torch.equal(p, before[n]), n


def test_convert_records_the_transfer(cli, tiny_dir, tiny_text, tmp_path):
    rec = "{tokens: 1024, seq_len: 32, batch_size: 4, eval_every: 4, transfer_steps: 20}"
    out = tmp_path / "t"
    code, _, err, data = cli(
        "convert",
        str(RECIPES / "gqa.yaml"),
        "--model",
        str(tiny_dir / "llama-mha"),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        "calibration.samples=8",
        "--set",
        "calibration.seq_len=64",
        "--set",
        f"steps[0].gqa.recover={rec}",
        "--json",
    )
    assert code == 0, err
    t = data["gqa"]["recover"]["transfer"]
    assert t["steps_per_layer"] == 20 and t["windows"] == 32 and len(t["relative_error"]) == 2
    assert all(after <= before for before, after in t["relative_error"])
    assert data["verification"]["status"] == "passed"
    assert json.loads((out / "quantkit.json").read_text())["gqa"]["recover"]["transfer"] == t


def test_transfer_steps_must_not_be_negative(cli, tiny_llama, tiny_text, tmp_path):
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "gqa.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "x"),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        "steps[0].gqa.recover.transfer_steps=-1",
    )
    assert code == 2 and "steps[0].gqa.recover.transfer_steps" in err and not (tmp_path / "x").exists()
