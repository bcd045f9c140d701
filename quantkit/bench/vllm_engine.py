"""The vLLM engine (GPU, when vLLM is installed): the figures a server would give at batch 1.

vLLM runs its own scheduler and CUDA graphs, so there is no per-step hook: TTFT is the time of a
1-token generation of the prompt, TPOT is (time of a gen_len-token generation - TTFT) / (gen_len - 1),
both with greedy sampling, EOS ignored and prefix caching off (so every repeat really prefills).
vLLM loads compressed-tensors artifacts on its own low-bit kernels (Marlin / machete) unchanged.
"""

from __future__ import annotations

import time

from ..errors import QuantkitError


class VllmEngine:
    name = "vllm"
    timing = "whole generate() calls"

    def __init__(self, path: str, device: str, max_len: int):
        if device != "cuda":
            raise QuantkitError("--engine vllm needs --device cuda")
        try:
            from vllm import LLM
        except ImportError:
            raise QuantkitError("--engine vllm: vLLM is not installed (pip install vllm, on a CUDA machine)") from None
        self.llm = LLM(model=str(path), dtype="bfloat16", max_model_len=max_len, enable_prefix_caching=False,
                       gpu_memory_utilization=0.85, seed=0)

    def _generate(self, prompt_ids: list[int], n: int) -> float:
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True)
        t = time.perf_counter()
        self.llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)], params, use_tqdm=False)
        return time.perf_counter() - t

    def time_once(self, prompt_ids: list[int], gen_len: int) -> tuple[float, list[float]]:
        ttft = self._generate(prompt_ids, 1)
        total = self._generate(prompt_ids, gen_len)
        tpot = max(0.0, total - ttft) / (gen_len - 1)
        return ttft, [tpot] * (gen_len - 1)
