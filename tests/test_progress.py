"""Progress where stderr is not a terminal (a log file, CI): plain lines at the start and end of
each step and at most one a minute between, never a bar's control characters."""

from __future__ import annotations

from quantkit import progress


def test_a_log_gets_a_line_per_step_and_one_a_minute(monkeypatch, capsys):
    monkeypatch.delenv("QUANTKIT_NO_PROGRESS")
    clock = iter([0.0, 10.0, 70.0, 80.0, 200.0, 200.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.bar("gptq", total=30) as update:
        update(1, "gptq layer 1/30")  # 10 s: too soon for a line
        update(12, "gptq layer 12/30")  # 70 s: a line
        update(13, "gptq layer 13/30")  # 80 s: too soon again
        update(30, "gptq layer 30/30")  # 200 s: a line
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "gptq: started (30 steps)",
        "gptq layer 12/30: 12/30 (70 s)",
        "gptq layer 30/30: 30/30 (200 s)",
        "gptq: done 30/30 in 200 s",
    ]
    assert "\x1b" not in err and "\r" not in err


def test_no_progress_silences_it(monkeypatch, capsys):
    monkeypatch.setenv("QUANTKIT_NO_PROGRESS", "1")
    with progress.bar("gptq", total=3) as update:
        update(3)
    assert capsys.readouterr().err == ""


def test_a_convert_into_a_log_prints_its_steps(cli, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.delenv("QUANTKIT_NO_PROGRESS")
    code, _, err, _ = cli("convert", "int4-w4a16-rtn", "--model", str(tiny_llama), "--out", str(tmp_path / "a"))
    assert code == 0, err
    assert "started" in err and "done" in err and "\x1b" not in err
