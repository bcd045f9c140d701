"""Short KL distillation from the original model after a merge, bounded by tokens and wall clock.

Only the merged layers' k_proj/v_proj train (`train: kvqo` adds q_proj/o_proj at a tenth of the
learning rate: at the full rate they made things worse, docs/GQA.md). Frozen weights of the
student and the teacher are held in bf16 and forwards run under bf16 autocast (AMX/AVX512-BF16
cores do them several times faster than float32); the trained weights, the loss and AdamW's
state stay float32, and the trained weights are copied back into the float32 model at the end.
The held-out KL is measured every `eval_every` steps and at the end; the best weights are kept.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field

import torch

from quantkit.gqa.windows import Windows
from quantkit.models.checkpoint import cast_model
from quantkit.progress import bar

QO_LR_SCALE = 0.1


@dataclass
class Log:
    steps: int = 0
    tokens: int = 0
    heldout_kl: list = field(default_factory=list)  # [step, KL] per evaluation
    stop: str = ""
    best_step: int = 0
    minutes: float = 0.0
    threads: dict = field(default_factory=dict)  # thread count -> recent seconds per step
    seconds_per_step: float = 0.0


def trained_names(model, attn_names: list[str], train: str) -> dict[str, float]:
    """Parameter name -> learning-rate scale."""
    out = {}
    for a in attn_names:
        for proj, scale in (("k_proj", 1.0), ("v_proj", 1.0), ("q_proj", QO_LR_SCALE), ("o_proj", QO_LR_SCALE)):
            if proj in ("q_proj", "o_proj") and train != "kvqo":
                continue
            for pname, _ in model.get_submodule(f"{a}.{proj}").named_parameters():
                out[f"{a}.{proj}.{pname}"] = scale
    return out


def kl_loss(teacher_logp: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(teacher || student), full vocabulary, float32."""
    logp = torch.log_softmax(student_logits.float(), dim=-1)
    return (teacher_logp.exp() * (teacher_logp - logp)).sum(-1).mean()


def _logp(model, ids) -> torch.Tensor:
    with torch.no_grad(), torch.autocast(model.device.type, dtype=torch.bfloat16):
        return torch.log_softmax(model(input_ids=ids.to(model.device), use_cache=False).logits.float(), dim=-1)


def heldout_kl(student, teacher_logp: list, windows: list) -> float:
    dev = student.device
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
        return sum(
            float(kl_loss(ref, student(input_ids=ids.to(dev), use_cache=False).logits))
            for ids, ref in zip(windows, teacher_logp)
        ) / len(windows)


def lr_factor(progress: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to `floor`; progress is the larger of the token and time fractions."""
    if progress < warmup:
        return (progress + 1e-3) / warmup
    t = min(1.0, (progress - warmup) / (1 - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))


def bf16_student(model, names: dict[str, float]):
    """A bf16 copy of `model` whose trained parameters stay float32 and require grad."""
    student = cast_model(copy.deepcopy(model), torch.bfloat16)
    for name, p in student.named_parameters():
        p.requires_grad_(name in names)
        if name in names:
            p.data = p.data.float()
    return student.train()


class _Threads:
    """Run each step at whichever of the configured thread count and one thread is faster now.

    On a shared 2-core machine a busy second core makes every parallel region wait for it: we
    measured 40 s per 1024-token step at 2 threads and 6.3 s at 1, and at quiet times the other
    way round (docs/GQA.md). Both are timed on real steps (an average of recent ones), the faster
    is used, and the slower is re-timed once the steps since it was last timed have taken ten
    times its cost, so exploring costs about a tenth of the run at most.
    """

    def __init__(self):
        self.n = torch.get_num_threads()
        self.seconds: dict[int, float] = {}
        self.since = 0.0  # seconds spent at the faster setting since the slower was timed

    def choose(self, step: int) -> None:
        if self.n == 1 or step == 0:
            return
        untimed = [o for o in (self.n, 1) if o not in self.seconds]
        fast, slow = (
            min(self.seconds, key=self.seconds.get, default=self.n),
            max(self.seconds, key=self.seconds.get, default=1),
        )
        pick = untimed[0] if untimed else (slow if self.since > 10 * self.seconds[slow] else fast)
        torch.set_num_threads(pick)

    def record(self, step: int, seconds: float) -> None:
        if step == 0:  # allocations and first-call costs
            return
        k = torch.get_num_threads()
        self.seconds[k] = seconds if k not in self.seconds else 0.5 * (self.seconds[k] + seconds)
        self.since = 0.0 if k != self.best() else self.since + seconds

    def expected(self, fallback: float) -> float:
        return min(self.seconds.values()) if self.seconds else fallback

    def best(self) -> int:
        return min(self.seconds, key=self.seconds.get) if self.seconds else self.n

    def restore(self) -> None:
        torch.set_num_threads(self.n)


def _train_step(student, teacher, opt, params, ids) -> float:
    target = _logp(teacher, ids)
    with torch.autocast(student.device.type, dtype=torch.bfloat16):
        logits = student(input_ids=ids.to(student.device), use_cache=False).logits
    loss = kl_loss(target, logits)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return float(loss.detach())


def distill(model, teacher, attn_names: list[str], windows: Windows, cfg, note=print) -> Log:
    """Train `model`'s merged projections (in place) to match `teacher` (a bf16 copy of the original)."""
    start = time.perf_counter()
    budget_s, per_step = cfg.max_minutes * 60.0, cfg.batch_size * cfg.seq_len
    max_steps = max(1, cfg.tokens // per_step)
    names = trained_names(model, attn_names, cfg.train)
    student = bf16_student(model, names)
    named = dict(student.named_parameters())
    params = [named[n] for n in names]
    opt = torch.optim.AdamW(
        [{"params": [named[n]], "lr": cfg.lr * s} for n, s in names.items()], lr=cfg.lr, weight_decay=0.0
    )
    base_lrs = [g["lr"] for g in opt.param_groups]
    ref = [_logp(teacher, w) for w in windows.heldout]
    log, threads = Log(), _Threads()
    best = heldout_kl(student, ref, windows.heldout)
    log.heldout_kl.append([0, best])
    best_state, stale = [p.detach().clone() for p in params], 0
    step_s = eval_s = time.perf_counter() - start
    with bar("recover", total=max_steps) as update:
        while True:
            elapsed = time.perf_counter() - start
            if log.steps >= max_steps:
                log.stop = "tokens"
                break
            if elapsed + threads.expected(step_s) + eval_s > budget_s:  # leave room for the final held-out evaluation
                log.stop = "time"
                break
            for g, lr in zip(opt.param_groups, base_lrs):
                g["lr"] = lr * lr_factor(max(log.steps / max_steps, elapsed / budget_s))
            ids = torch.cat(
                [windows.train[(log.steps * cfg.batch_size + i) % len(windows.train)] for i in range(cfg.batch_size)]
            )
            threads.choose(log.steps)
            t0 = time.perf_counter()
            loss = _train_step(student, teacher, opt, params, ids)
            step_s = time.perf_counter() - t0
            threads.record(log.steps, step_s)
            log.steps += 1
            log.tokens += per_step
            update(log.steps, description=f"recover: KL {loss:.3f} (held-out {best:.3f})")
            if log.steps % cfg.eval_every == 0:
                torch.set_num_threads(threads.best())
                t1 = time.perf_counter()
                kl = heldout_kl(student, ref, windows.heldout)
                eval_s = time.perf_counter() - t1
                log.heldout_kl.append([log.steps, kl])
                note(
                    f"recover: step {log.steps}, {log.tokens} tokens, "
                    f"{(time.perf_counter() - start) / 60:.1f} min, held-out KL {kl:.4f}"
                )
                if kl < best:
                    best, best_state, stale, log.best_step = kl, [p.detach().clone() for p in params], 0, log.steps
                else:
                    stale += 1
                    if stale >= cfg.patience:
                        log.stop = f"early stop: held-out KL did not improve for {cfg.patience} evaluations"
                        break
    torch.set_num_threads(threads.best())
    if log.heldout_kl[-1][0] != log.steps:
        kl = heldout_kl(student, ref, windows.heldout)
        log.heldout_kl.append([log.steps, kl])
        if kl < best:
            best_state, log.best_step = [p.detach().clone() for p in params], log.steps
    log.threads = {str(k): round(v, 2) for k, v in threads.seconds.items()}
    threads.restore()
    with torch.no_grad():
        for n, b in zip(names, best_state):
            model.get_parameter(n).copy_(b)
    log.minutes = (time.perf_counter() - start) / 60
    log.seconds_per_step = (log.minutes * 60) / max(1, log.steps)
    return log
