"""The install scripts: one-time builds kept by their inputs and found again without building, the
expected wait said before each long step, the quickstart's compile beside the torch steps at the
lowest priority, vLLM's environment built beside llama.cpp's compile."""

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"


def _built(*args: str, env: dict | None = None) -> int:
    return subprocess.run(["bash", *args], capture_output=True, text=True, env={**os.environ, **(env or {})}).returncode


def test_a_wheel_is_kept_by_its_cmake_arguments_and_found_without_building(tmp_path):
    script = str(SCRIPTS / "build_llama_wheel.sh")
    tmp_path = tmp_path / "wheels"
    assert _built(script, "--built", "0.3.36", str(tmp_path), "full") == 1  # nothing there: no build is started
    assert not tmp_path.exists()
    text = (SCRIPTS / "build_llama_wheel.sh").read_text()
    key = subprocess.run(
        ["bash", "-c", 'printf "%s" "$1" | sha256sum | cut -c1-12', "_", re.search(r'full\) args="([^"]+)"', text)[1]],
        capture_output=True,
        text=True,
    ).stdout.strip()
    (tmp_path / f"full-{key}").mkdir(parents=True)
    (tmp_path / f"full-{key}" / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    assert _built(script, "--built", "0.3.36", str(tmp_path), "full") == 0
    assert _built(script, "--built", "0.3.36", str(tmp_path), "nolib") == 1  # other arguments, another wheel


def test_the_tools_build_is_found_by_its_inputs_without_building(tmp_path):
    script = str(SCRIPTS / "build_llama_tools.sh")
    assert _built(script, "--built", "0.3.36", str(tmp_path / "wheels")) == 1 and not (tmp_path / "wheels").exists()
    text = (SCRIPTS / "build_llama_tools.sh").read_text()
    assert text.index("about $minutes min on $(nproc) idle cores") < text.index('"$CMAKE" --build')


def test_each_long_step_says_its_wait_and_the_compile_leaves_the_torch_steps_alone():
    install = (SCRIPTS / "_install.sh").read_text()
    assert "nohup nice -n 19 bash scripts/build_llama_wheel.sh" in install  # the quickstart's background compile
    # it starts as soon as .venv runs pip, before torch and quantkit's libraries install
    assert install.index("\nbackground_build\n") < install.index('pip install -q "$wheels"/torch-*.whl')
    quickstart = (SCRIPTS / "quickstart.sh").read_text()
    assert 'OMP_WAIT_POLICY=PASSIVE "${run[@]}" --skip-bench' in quickstart  # torch's idle threads sleep
    assert install.count("about $minutes min") == 2  # the wheel's compile, in the background or not
    # vLLM's environment goes in the background before the tools' compile, and is waited for after it
    assert install.index(".venv/bin/quantkit engines install vllm >") < install.index('build_llama_tools.sh "$LLAMA')
    assert 'wait "$vllm_job"' in install
    tools = (SCRIPTS / "build_llama_tools.sh").read_text()
    assert 'times >"$work/times"' in tools  # the compile's CPU seconds, not a subshell's (0)
