"""Short KL distillation from the original model after a merge, bounded by tokens and wall clock.

Only the merged layers' k_proj/v_proj train (`train: kvqo` adds q_proj/o_proj at a tenth of the
learning rate: at the full rate they made things worse in our measurements, docs/GQA.md).
Forward passes run under bf16 autocast (AMX/AVX512-BF16 cores do them several times faster
than float32); master weights, the loss and AdamW's state stay float32. The held-out KL is
measured every `eval_every` steps and at the end; the best weights seen are kept.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ..progress import bar

QO_LR_SCALE = 0.1


@dataclass
class Windows:
    train: list  # list of [1, seq_len] LongTensors
    heldout: list


@dataclass
class Log:
    steps: int = 0
    tokens: int = 0
    heldout_kl: list = field(default_factory=list)  # [step, KL] per evaluation
    stop: str = ""
    best_step: int = 0
    minutes: float = 0.0


def trainable_params(attns, train: str, lr: float) -> list[dict]:
    kv = [p for a in attns for m in (a.k_proj, a.v_proj) for p in m.parameters()]
    groups = [{"params": kv, "lr": lr}]
    if train == "kvqo":
        groups.append({"params": [p for a in attns for m in (a.q_proj, a.o_proj) for p in m.parameters()], "lr": lr * QO_LR_SCALE})
    return groups


def kl_loss(teacher_logp: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(teacher || student), full vocabulary, float32."""
    logp = torch.log_softmax(student_logits.float(), dim=-1)
    return (teacher_logp.exp() * (teacher_logp - logp)).sum(-1).mean()


def _logp(model, ids) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return torch.log_softmax(model(input_ids=ids, use_cache=False).logits.float(), dim=-1)


def heldout_kl(student, teacher_logp: list, windows: list) -> float:
    total = 0.0
    for ids, ref in zip(windows, teacher_logp):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            total += float(kl_loss(ref, student(input_ids=ids, use_cache=False).logits))
    return total / len(windows)


def lr_factor(progress: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to `floor`; progress is the larger of the token and time fractions."""
    if progress < warmup:
        return (progress + 1e-3) / warmup
    t = min(1.0, (progress - warmup) / (1 - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))


def distill(student, teacher, attns, windows: Windows, cfg, note=print) -> Log:
    """Train the merged layers' projections to match `teacher`; returns what happened."""
    start = time.perf_counter()
    budget_s, per_step = cfg.max_minutes * 60.0, cfg.batch_size * cfg.seq_len
    max_steps = max(1, cfg.tokens // per_step)
    for p in student.parameters():
        p.requires_grad_(False)
    groups = trainable_params(attns, cfg.train, cfg.lr)
    params = [p for g in groups for p in g["params"]]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=0.0)
    base_lrs = [g["lr"] for g in opt.param_groups]
    ref = [_logp(teacher, w) for w in windows.heldout]
    log = Log()
    best = heldout_kl(student, ref, windows.heldout)
    log.heldout_kl.append([0, best])
    best_state, stale = [p.detach().clone() for p in params], 0
    step_s = eval_s = time.perf_counter() - start
    student.train()
    with bar("recover", total=max_steps) as update:
        while True:
            elapsed = time.perf_counter() - start
            due = (log.steps + 1) % cfg.eval_every == 0
            if log.steps >= max_steps:
                log.stop = "tokens"
                break
            if elapsed + step_s + eval_s > budget_s:  # always leave room for the final held-out evaluation
                log.stop = "time"
                break
            t0 = time.perf_counter()
            progress = max(log.steps / max_steps, elapsed / budget_s)
            for g, lr in zip(opt.param_groups, base_lrs):
                g["lr"] = lr * lr_factor(progress)
            ids = torch.cat([windows.train[(log.steps * cfg.batch_size + i) % len(windows.train)] for i in range(cfg.batch_size)])
            target = _logp(teacher, ids)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = student(input_ids=ids, use_cache=False).logits
            loss = kl_loss(target, logits)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            log.steps += 1
            log.tokens += per_step
            step_s = time.perf_counter() - t0 if log.steps > 1 else max(step_s, time.perf_counter() - t0)
            update(log.steps, description=f"recover: train KL {float(loss):.3f}, held-out {best:.3f}")
            if due:
                t1 = time.perf_counter()
                kl = heldout_kl(student, ref, windows.heldout)
                eval_s = time.perf_counter() - t1
                log.heldout_kl.append([log.steps, kl])
                note(f"recover: step {log.steps}, {log.tokens} tokens, {(time.perf_counter() - start) / 60:.1f} min, held-out KL {kl:.4f}")
                if kl < best:
                    best, best_state, stale, log.best_step = kl, [p.detach().clone() for p in params], 0, log.steps
                else:
                    stale += 1
                    if stale >= cfg.patience:
                        log.stop = f"early stop: held-out KL did not improve for {cfg.patience} evaluations"
                        break
    if log.steps and (not log.heldout_kl or log.heldout_kl[-1][0] != log.steps):
        kl = heldout_kl(student, ref, windows.heldout)
        log.heldout_kl.append([log.steps, kl])
        if kl < best:
            best, best_state, log.best_step = kl, [p.detach().clone() for p in params], log.steps
    with torch.no_grad():
        for p, b in zip(params, best_state):
            p.copy_(b)
            p.requires_grad_(False)
    student.eval()
    log.minutes = (time.perf_counter() - start) / 60
    return log
