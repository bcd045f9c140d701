"""A bare vLLM timing loop, as a user would write it: runs in vLLM's own environment (started by
benchmarks/vllm_overhead.py with that environment's Python), never imports quantkit.

argv[1]: JSON {"engine_args", "threads", "prompt", "gen_len"}. Loads `vllm.LLM(**engine_args)`,
prints {"ready": true}, then for each line "run" on stdin times one repeat and prints one JSON line:
  ttft_s     LLM.generate of the prompt with max_tokens=1, wall clock around the call
  e2e_s      LLM.generate with max_tokens=gen_len (EOS ignored), wall clock around the call
  tpot_s     (e2e_s - ttft_s) / (gen_len - 1): the decode time per token the user sees
"""

import json
import os
import sys
import time


def main():
    # the script's own directory holds the benchmarks (common.py, render.py, ...): none may shadow vLLM's imports
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    cfg = json.loads(sys.argv[1])
    out = os.fdopen(os.dup(1), "w", buffering=1)  # answers only; vLLM's logs go to stderr
    os.dup2(2, 1)
    import torch
    from vllm import LLM, SamplingParams

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    llm = LLM(**cfg["engine_args"])
    prompt = [{"prompt_token_ids": [int(t) for t in cfg["prompt"]]}]
    n = int(cfg["gen_len"])
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    whole = SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
    out.write(json.dumps({"ready": True, "threads": torch.get_num_threads()}) + "\n")
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0 = time.perf_counter()
        llm.generate(prompt, first, use_tqdm=False)
        t1 = time.perf_counter()
        res = llm.generate(prompt, whole, use_tqdm=False)[0]
        t2 = time.perf_counter()
        got = len(res.outputs[0].token_ids)
        out.write(
            json.dumps({"ttft_s": t1 - t0, "e2e_s": t2 - t1, "tpot_s": (t2 - t1 - (t1 - t0)) / (n - 1), "tokens": got})
            + "\n"
        )


if __name__ == "__main__":  # vLLM may start processes that re-import the main module
    main()
