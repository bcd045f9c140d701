"""quantkit under `torchrun`: one process per device, joined by torch.distributed.

quantkit adds no cluster code of its own. `torchrun` (torch.distributed.elastic) starts the
processes, on one machine or several (--nnodes, --rdzv-*), and kills the others when one dies;
llm-compressor 0.14 partitions the calibration samples and reduces the statistics
(compressed-tensors' `is_distributed` paths: GPTQ's Hessians are summed onto the rank that
solves each layer, the results shared back); `quantkit eval` splits its windows across ranks
(Runtime.share, Runtime.gather). What is here: joining the group (gloo on CPUs, NCCL on CUDA GPUs, a
timeout on every collective so a lost rank cannot hang the rest), the device of each rank, one
verdict for all ranks when a step fails on one, and two narrow workarounds for faults of
llm-compressor 0.14's distributed calibration (below).
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from quantkit.device import resolve_device
from quantkit.errors import QuantkitError

ENV_TIMEOUT = "QUANTKIT_DIST_TIMEOUT"  # seconds a rank waits in one collective for the others
DEFAULT_TIMEOUT_S = 1800.0  # longer than any one step between collectives (a layer's GPTQ, rank 0's reload check)


class DistributedError(QuantkitError):
    """Another rank failed; this rank stops with the exit code that rank had."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


class Runtime:
    """Where a command runs: one process (OneProcess), or one rank of a torchrun job (Group). A
    command asks its runtime (rank, world_size, writer, device_spec, together, claimed, load, alone,
    export, calibration, share, gather, everywhere, check_job) and never whether it runs under
    torchrun. The base methods are one process's."""

    @property
    def writer(self) -> bool:
        """The process that writes, verifies and renames artifacts and prints results."""
        return self.rank == 0

    machines = 1  # the machines the processes run on

    def describe(self) -> dict:
        return {"world_size": 1}

    def device_spec(self, spec):
        """The --device this process runs with: the command's own in one process, this rank's
        device under torchrun."""
        return spec

    def check_job(self, check) -> None:
        """Run `check()`, the refusals of what does not run across processes (convert's
        check_torchrun), where it applies: under torchrun; one process runs everything."""

    def calibration(self, samples):
        """This process's calibration windows, llm-compressor made ready for them: in one process
        all of them, and llm-compressor as it is."""
        return samples

    def share(self, n: int) -> range:
        """The indices of this process's windows, out of `n` (eval splits them across ranks)."""
        return range(n)

    def gather(self, items: list) -> list:
        """Every process's per-window list, concatenated in window order, in every process."""
        return items

    def everywhere(self, value):
        """`value` if no process has None (a cache every process could read), else None in every
        process: then all of them make it together, and none waits for one that skipped it."""
        return value

    @contextmanager
    def together(self, what: str):
        """A block every process runs; one error stops all of them (here: it is raised)."""
        yield

    @contextmanager
    def claimed(self, claim):
        """Hold `claim()` (a context manager: the lock on --out) where the writer runs."""
        with claim():
            yield

    def load(self, shared_load, load):
        """The source model: `load()` in one process; under torchrun `shared_load(device)` on
        every rank, rank 0's weights shared with the others."""
        return load()

    @contextmanager
    def alone(self):
        """The writer works on its own (the reload check) while the others wait."""
        yield

    def export(self, save, export):
        """Write the artifact: `export()` (save, reload, verify, rename) in one process; under
        torchrun the writer exports and the others take part in its save (`save()`), then all
        learn its verdict. Returns export()'s value on the writer, None elsewhere."""
        return export()


class OneProcess(Runtime):
    rank, world_size, local_rank = 0, 1, 0
    device = None  # the command's own --device


ONE_PROCESS = OneProcess()


@dataclass(frozen=True)
class Group(Runtime):
    """This process's place in the torchrun job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: object  # torch.device of this rank
    timeout_s: float
    local_world_size: int = 0  # processes on this machine (torchrun's LOCAL_WORLD_SIZE; 0: not given)

    @property
    def machines(self) -> int:
        return self.world_size // self.local_world_size if self.local_world_size else 1

    def describe(self) -> dict:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "launcher": "torchrun",
            "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
            "timeout_s": self.timeout_s,
        }

    def device_spec(self, spec):
        return str(self.device)

    def check_job(self, check) -> None:
        check()

    def calibration(self, samples):
        # two faults of llm-compressor's distributed calibration (below)
        llmcompressor_qparams_barrier()
        return calibration_share(samples)

    def share(self, n: int) -> range:
        return range(*share_bounds(n, self.rank, self.world_size))

    def gather(self, items: list) -> list:
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, items)
        return [x for part in parts for x in part]

    def everywhere(self, value):
        flags: list = [None] * self.world_size
        dist.all_gather_object(flags, value is not None)
        return value if all(flags) else None

    def together(self, what: str):
        return together(what)

    @contextmanager
    def claimed(self, claim):
        with ExitStack() as stack:
            with together("to claim --out"):
                if self.writer:
                    stack.enter_context(claim())
            yield

    def load(self, shared_load, load):
        return load_shared(shared_load)

    def alone(self):
        return rank0_alone()

    def export(self, save, export):
        if self.writer:
            with together("to verify and write the artifact"):
                return export()
        save()
        agree(None, "to verify and write the artifact")
        return None


def share_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """Windows [start, end) of `rank`: contiguous and as even as they can be (the first n % world
    ranks one more), so concatenating the ranks' shares in rank order restores window order. Each
    window is scored alone by the same code, so eval's figures (PPL, KL, top-1, the bootstrap CIs,
    which resample whole windows with a fixed seed) equal one process's up to the kernels' own
    reduction order."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def launched() -> bool:
    """Started by torchrun (it sets TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "WORLD_SIZE" in os.environ


def timeout_s() -> float:
    text = os.environ.get(ENV_TIMEOUT, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise QuantkitError(f"{ENV_TIMEOUT}={text!r}: expected seconds, e.g. 600") from None
    if value <= 0:
        raise QuantkitError(f"{ENV_TIMEOUT}={text!r}: expected a positive number of seconds")
    return value


COMMANDS = ("convert", "eval")  # what runs under torchrun; anything else would run N times over


def check_command(name: str | None) -> None:
    if launched() and name is not None and name not in COMMANDS:
        raise QuantkitError(
            f"`quantkit {name}` does not run under torchrun (one copy per process would compete for the same "
            f"files); under torchrun: {', '.join(COMMANDS)}"
        )


def rank_device(spec=None):
    """This rank's torch.device: a CUDA request means the GPU whose index is LOCAL_RANK (one
    process per GPU, as torchrun --nproc-per-node N expects); the CPU stays the CPU."""

    dev = resolve_device(spec)
    if dev.type != "cuda":
        return dev
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if spec not in (None, "auto", "cuda") and dev.index not in (None, local):
        raise QuantkitError(
            f"--device {spec}: under torchrun each process takes the GPU of its LOCAL_RANK; "
            "pass --device cuda (or auto) and choose GPUs with CUDA_VISIBLE_DEVICES"
        )
    return resolve_device(torch.device("cuda", local))


# ---------------------------------------------------------------- who reports an error
#
# Every process of a torchrun job runs the same command, so a bad input fails in all of them. One
# line is printed per machine, by its first process (LOCAL_RANK 0; on one machine: rank 0); the
# others exit with the same code and print nothing - when it is certain that the first process
# reports the same failure: an error raised before the process group is joined (the same
# arguments, checked the same way on the same machine), or one every rank heard of through
# `agree`. A failure of one rank alone inside the job (its device, say) is printed by that rank,
# prefixed with its rank, since no other process may live to report it. Exit codes are the
# processes'; torchrun itself then exits 1 and prints its own failure report (README).

_AGREED, _IN_SESSION = "_quantkit_agreed", "_quantkit_in_session"


def _tag(exc: BaseException, name: str) -> None:
    try:
        setattr(exc, name, True)
    except AttributeError:  # an exception type that takes no attributes: it stays untagged (printed)
        pass


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0") or 0) if launched() else 0


def error_line(exc: BaseException, line: str) -> str | None:
    """The line this process prints for `exc` (None: another process prints it)."""
    if not launched():
        return line
    agreed, in_session = getattr(exc, _AGREED, False), getattr(exc, _IN_SESSION, False)
    if agreed or not in_session:
        return line if local_rank() == 0 else None
    head, sep, rest = line.partition("error: ")
    rank = f"rank {os.environ.get('RANK', '?')}: "
    return f"{head}{sep}{rank}{rest}" if sep and not head else rank + line


def quiet() -> bool:
    """A process that leaves argument errors (the same argv in every process) to its machine's first."""
    return local_rank() != 0


# How long a silent process waits for the one that reports (see exit_silently).
REPORT_WAIT_S = 60.0


def exit_silently(code: int) -> None:
    """Exit with `code` once the reporting process has printed. torchrun stops every process when
    one exits with an error, so a silent process that exited first could have the reporter stopped
    before it prints; instead this one waits for the reporter to exit and torchrun to stop it
    (SIGTERM, on which it exits with `code`), or at most REPORT_WAIT_S."""

    def leave(signum, frame):
        sys.exit(code)

    signal.signal(signal.SIGTERM, leave)
    time.sleep(REPORT_WAIT_S)
    sys.exit(code)


@contextmanager
def session(device_spec=None):
    """Yield this process's runtime: its Group under torchrun, the process group joined for the
    command and left afterwards (NCCL for CUDA devices, gloo for the CPU), else ONE_PROCESS. An
    error that leaves the session is marked as raised inside the job (see error_line)."""
    if not launched():
        yield ONE_PROCESS
        return
    limit = timeout_s()  # the same environment in every process: an error here is every rank's
    try:
        with _joined(device_spec, limit) as group:
            yield group
    except BaseException as exc:
        _tag(exc, _IN_SESSION)
        raise


@contextmanager
def _joined(device_spec, limit: float):
    dev = rank_device(device_spec)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(
        backend, timeout=datetime.timedelta(seconds=limit), device_id=dev if dev.type == "cuda" else None
    )
    local = (int(os.environ.get(k, "0")) for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    group = Group(dist.get_rank(), dist.get_world_size(), next(local), backend, dev, limit, next(local))
    try:
        yield group
        # Every rank done before any leaves: a rank that tears its process group down while another
        # still talks to the rendezvous store (hosted by the first node's torchrun agent) has made
        # that other rank die of SIGABRT in c10d ("SocketImpl ... returned 0, likely a timeout"),
        # two nodes on one loaded host once in a few runs. On an error the ranks have agreed already.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def agree(error: BaseException | None, what: str) -> None:
    """Every rank learns whether any rank failed at `what`; then all raise, or none do.
    Without a process group: raise `error` if there is one."""
    if not active():
        if error is not None:
            raise error
        return

    mine = None if error is None else (_one_line(error), getattr(error, "exit_code", 1))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if error is not None:
        _tag(error, _AGREED)
        raise error
    failed = [(r, f) for r, f in enumerate(everyone) if f is not None]
    if failed:
        rank, (line, code) = failed[0]
        agreed = DistributedError(f"rank {rank} failed {what}: {line}", code)
        _tag(agreed, _AGREED)
        raise agreed


@contextmanager
def together(what: str):
    """Run a block on every rank and agree on its outcome (see agree). Ctrl-C and signals pass
    straight through: torchrun stops the other ranks itself."""
    error = None
    try:
        yield
    except Exception as exc:  # re-raised by agree on this rank, after the others heard of it
        error = exc
    agree(error, what)


def _one_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0][:300]
    return text if isinstance(exc, QuantkitError) else f"{type(exc).__name__}: {text}"


def barrier() -> None:
    if active():
        dist.barrier()


@contextmanager
def rank0_alone():
    """Rank 0 works on its own (reload check, eval of a saved artifact) while the group stays
    joined: compressed-tensors' own switch makes its offloading and `is_distributed` act as in
    one process, so loading an artifact does not wait for ranks that are not loading it."""
    if not active():
        yield
        return
    from compressed_tensors.offload.utils import as_single_threaded

    with as_single_threaded():
        yield


def load_shared(load):
    """The source model in every rank, loaded once: rank 0 loads it (`load(torch.device("cpu"))`,
    quantkit's loader with all its checks) into RAM, the others build it on the meta device, and
    compressed-tensors' `from_accelerate` puts rank 0's tensors in shared memory for all (what
    its `load_offloaded_model` does; called directly because quantkit's loader also reads
    transformers' loading info, which that wrapper cannot pass through)."""
    from compressed_tensors.offload import from_accelerate

    model = load(torch.device("cpu" if dist.get_rank() == 0 else "meta"))
    from_accelerate(model)
    return model


def calibration_share(samples):
    """This rank's part of the calibration samples (all of them outside torchrun), split by
    llm-compressor's own rule (`get_rank_partition`: contiguous, the first ranks one more when
    the count does not divide).

    Upstream fault (llm-compressor 0.14, llmcompressor/datasets/utils.py, _make_sampler): when
    every rank passes the same dataset it partitions a *copy* (`dataset.select(range(start,
    end))`) and builds the sampler on that copy, but the DataLoader indexes the original: every
    rank calibrates on samples 0..N/R-1 and the rest are never seen (measured on the tiny
    fixture: Hessians 11% off, 30% of the INT4 codes different from one process). Passing each
    rank its own part, as llm-compressor's examples do with `get_rank_partition`, avoids that
    path (the ranks' datasets differ, so it does not partition again)."""
    if not active() or not samples:
        return samples

    from llmcompressor.datasets.utils import get_rank_partition

    start, end = map(int, re.fullmatch(r"s\[(\d+):(\d+)\]", get_rank_partition("s", len(samples))).groups())
    if end <= start:
        raise QuantkitError(
            f"{len(samples)} calibration samples cannot be split across {dist.get_world_size()} processes "
            "(each needs at least one): raise calibration.samples or use fewer processes"
        )
    return samples[start:end]


def llmcompressor_qparams_barrier() -> None:
    """Wait for every rank after each distributed weight-quantization step. Idempotent.

    Upstream fault (llm-compressor 0.14, llmcompressor/utils/dist.py,
    broadcast_qparams_and_cleanup, called by GPTQModifier.compress_modules and
    QuantizationModifier.on_sequential_epoch_end): each rank quantizes its share of the layers
    and broadcasts the results, but with `skip_cpu=True` a CPU-executed module is not broadcast
    (its weights are in shared memory) and nothing else waits for the rank writing them, so the
    next layers' calibration read some weights before or after GPTQ had updated them (on the
    tiny fixture: a different artifact from run to run). A barrier after the step restores one
    order; its cost is one collective per layer group."""
    from llmcompressor.modifiers.gptq import base as gptq_base
    from llmcompressor.modifiers.quantization.quantization import base as quant_base

    for module in (gptq_base, quant_base):
        original = module.broadcast_qparams_and_cleanup
        if getattr(original, "_quantkit_barrier", False):
            continue

        def with_barrier(*args, _original=original, **kwargs):
            _original(*args, **kwargs)
            barrier()

        with_barrier._quantkit_barrier = True
        module.broadcast_qparams_and_cleanup = with_barrier
