"""quantkit under torchrun: convert and eval on 2 gloo processes equal one process;
a failure or a dead rank stops every rank and leaves nothing at --out.

The 2-process runs start `torchrun --nproc-per-node 2 -m quantkit ...` as a user would (each
run loads torch and llm-compressor twice, ~20-40 s on 2 cores): marked slow."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import RECIPES

from quantkit.core.distributed import ONE_PROCESS, share_bounds

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node",
    "2",
]  # a free port each run
CALIB = ("--set", "calibration.samples=8", "--set", "calibration.seq_len=64")
BOUND_S = 90  # a dead rank: the others are gone within this (torchrun's stop + the collective timeout below)


# --- pure parts (no process group) ---------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 16, 33])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_shares_cover_windows_in_order(n, world):
    """Concatenating the ranks' shares in rank order gives 0..n-1 once each, shares differ by <= 1."""
    parts = [range(*share_bounds(n, r, world)) for r in range(world)]
    assert [i for p in parts for i in p] == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_one_process_is_the_identity():
    assert list(ONE_PROCESS.share(5)) == [0, 1, 2, 3, 4]
    items = [object(), object()]
    assert ONE_PROCESS.gather(items) is items
    assert ONE_PROCESS.everywhere(None) is None and ONE_PROCESS.everywhere(items) is items
    assert ONE_PROCESS.device_spec("auto") == "auto" and ONE_PROCESS.writer and ONE_PROCESS.world_size == 1
    ONE_PROCESS.check_job(lambda: pytest.fail("a check for torchrun ran in one process"))


def test_one_process_leaves_llm_compressor_as_it_is(monkeypatch):
    """The barrier patch and the sample partition are torchrun's: one process's calibration gets
    every sample, and llm-compressor is not touched."""
    import quantkit.core.distributed as distributed

    monkeypatch.setattr(distributed, "llmcompressor_qparams_barrier", lambda: pytest.fail("patched in one process"))
    samples = [1, 2, 3]
    assert ONE_PROCESS.calibration(samples) is samples


def test_calibration_share_and_agree_outside_torchrun():
    from quantkit.core.distributed import agree, calibration_share

    samples = [1, 2, 3]
    assert calibration_share(samples) is samples
    agree(None, "x")  # nothing to agree on
    with pytest.raises(ValueError):
        agree(ValueError("boom"), "x")


def test_timeout_setting(monkeypatch):
    from quantkit.core.distributed import ENV_TIMEOUT, timeout_s
    from quantkit.errors import QuantkitError

    monkeypatch.setenv(ENV_TIMEOUT, "12.5")
    assert timeout_s() == 12.5
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv(ENV_TIMEOUT, bad)
        with pytest.raises(QuantkitError, match=ENV_TIMEOUT):
            timeout_s()


def test_torchrun_check_refuses_what_runs_in_one_process(monkeypatch):
    """Every registered method runs under torchrun exactly when its registry entry says so."""
    from types import SimpleNamespace

    from quantkit.errors import QuantkitError
    from quantkit.methods.method_registry import METHODS
    from quantkit.quantize.job import check_torchrun

    def job(method="gptq", gqa=False, offload=None, auto=None, machines=1):
        return SimpleNamespace(
            key="steps",
            opts=SimpleNamespace(runtime=SimpleNamespace(machines=machines)),
            has_gqa=gqa,
            quant=SimpleNamespace(method=method) if method else None,
            method=METHODS[method] if method else None,
            offload=offload,
            auto=auto,
        )

    assert {"rtn", "gptq"} <= {n for n, m in METHODS.items() if m.torchrun} and not METHODS["bnb-nf4"].torchrun
    for name, method in METHODS.items():
        if method.torchrun:
            check_torchrun(job(name))
        else:
            with pytest.raises(
                QuantkitError, match=f"method '{name}' does not run under torchrun; those that do: rtn, gptq"
            ):
                check_torchrun(job(name))
    for bad, match in (
        (job(None, gqa=True), "gqa step"),
        (job(offload=object()), "disk offloading"),
        (job(auto=object()), "auto mixed precision"),
    ):
        with pytest.raises(QuantkitError, match=match):
            check_torchrun(bad)
    with pytest.raises(QuantkitError, match="one machine"):
        check_torchrun(job(machines=2))  # 2 machines x 2 processes


@pytest.fixture
def worker(monkeypatch):
    """This process as a torchrun worker of a 2-process job: `worker(rank)` sets its rank. A silent
    worker does not wait for the reporting one (there is none here); its SIGTERM handler is put back."""
    import signal

    import quantkit.core.distributed as distributed

    monkeypatch.setattr(distributed, "REPORT_WAIT_S", 0)
    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def as_rank(rank: int):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))

    yield as_rank
    signal.signal(signal.SIGTERM, handler)


@pytest.mark.parametrize("kind", ["a bad argument", "a missing model", "a missing recipe", "another command"])
def test_a_refusal_before_the_job_is_printed_by_rank_0_alone(cli, worker, tiny_llama, tmp_path, kind):
    """Every process checks the same arguments on the same machine: rank 0 prints the one line,
    the others exit with the same code and print nothing."""
    args = {
        "a bad argument": ["eval", str(tiny_llama), "--baseline", str(tiny_llama), "--bogus"],
        "a missing model": ["eval", str(tmp_path / "nothing"), "--baseline", str(tiny_llama), "--text", "self"],
        "a missing recipe": ["convert", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o")],
        "another command": ["models", "list"],
    }[kind]
    outcomes = []
    for rank in (0, 1):
        worker(rank)
        code, out, err, _ = cli(*args)
        outcomes.append((code, len(err.strip().splitlines()) if err.strip() else 0))
    assert outcomes[0][0] == 2 and outcomes[0][1] >= 1 and outcomes[1] == (2, 0), outcomes


def test_who_prints_an_error_inside_the_job(monkeypatch):
    """Joined (a real gloo group of one process): an error every rank heard of (distributed.agree)
    is rank 0's to print; an error of one rank alone is printed by that rank, naming it."""
    import socket

    from quantkit.core.distributed import error_line, session, together
    from quantkit.errors import QuantkitError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {
        "TORCHELASTIC_RUN_ID": "t",
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(key, value)
    caught = {}
    for kind in ("agreed", "alone"):
        try:
            with session("cpu"):
                if kind == "agreed":
                    with together("its checks"):
                        raise QuantkitError("bad input")
                raise QuantkitError("this rank's device")
        except QuantkitError as exc:
            caught[kind] = exc
    before = QuantkitError("bad argument")  # raised before the session: every rank's
    assert error_line(caught["agreed"], "error: bad input") == "error: bad input"
    assert error_line(caught["alone"], "error: this rank's device") == "error: rank 0: this rank's device"
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    assert error_line(caught["agreed"], "error: bad input") is None
    assert error_line(before, "error: bad argument") is None
    assert error_line(caught["alone"], "error: this rank's device") == "error: rank 1: this rank's device"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert error_line(before, "error: bad argument") == "error: bad argument"  # outside torchrun: always printed


def test_a_group_shares_windows_and_runs_torchruns_checks(monkeypatch):
    """A joined group (gloo, one process): each runtime method as the eval and convert use it."""
    import socket

    from quantkit.core.distributed import session

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"TORCHELASTIC_RUN_ID": "t", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    for key, value in {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    checked = []
    with session("cpu") as runtime:
        assert runtime.device_spec("auto") == "cpu" and runtime.writer
        assert list(runtime.share(3)) == [0, 1, 2] and runtime.gather([1, 2]) == [1, 2]
        assert runtime.everywhere(None) is None and runtime.everywhere("hit") == "hit"
        runtime.check_job(lambda: checked.append(True))
    assert checked == [True]


def test_other_commands_refused_under_torchrun(cli, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, err, _ = cli("models", "list")
    assert code == 2 and "does not run under torchrun" in err and "convert, eval" in err


# --- two processes ---------------------------------------------------------------------------------


def _env(home: Path, **extra) -> dict:
    env = {**os.environ, "QUANTKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "QUANTKIT_DIST_TIMEOUT": "60", **extra}
    env.pop("TORCHELASTIC_RUN_ID", None)
    return env


def _quantkit(args, home: Path, launcher=(), timeout=600):
    cmd = [*launcher, *(["-m", "quantkit"] if launcher else [sys.executable, "-m", "quantkit"]), *args]
    return subprocess.run(cmd, cwd=REPO, env=_env(home), capture_output=True, text=True, timeout=timeout)


def _convert_args(recipe: str, model: Path, out: Path, text: Path, *extra) -> list[str]:
    return [
        "convert",
        str(RECIPES / f"{recipe}.yaml"),
        "--model",
        str(model),
        "--out",
        str(out),
        "--calib",
        f"file:{text}",
        *CALIB,
        "--device",
        "cpu",
        "--json",
        *extra,
    ]


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(glob.glob(str(path / "*.safetensors"))):
        out.update(load_file(f))
    return out


def _nothing_at(out: Path) -> None:
    assert not out.exists()
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert left == [], left


# GPTQ calibrated in bfloat16: each rank's Hessian sums products of bf16 activations, which float32
# holds exactly (8-bit mantissas), so the sums do not depend on how the samples are split across
# ranks and the two artifacts are bit-identical. Calibrated in float32 (the CPU's default), the
# products round and the ranks' sums differ from one process's in the last bits (~1e-7): GPTQ's
# rounding then flips a few codes in the first layer, and the next layers' inputs move with them.
@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, extra",
    [("int4-w4a16-gptq-g64", ("--set", "calibration.compute_dtype=bfloat16")), ("int4-w4a16-rtn", ())],
)
def test_torchrun_convert_equals_one_process(recipe, extra, tiny_llama, tiny_text, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = _quantkit(_convert_args(recipe, tiny_llama, one, tiny_text, *extra), tmp_path / "h1")
    assert r1.returncode == 0, r1.stderr[-2000:]
    r2 = _quantkit(_convert_args(recipe, tiny_llama, two, tiny_text, *extra), tmp_path / "h2", launcher=TORCHRUN)
    assert r2.returncode == 0, r2.stderr[-3000:]
    data = json.loads(r2.stdout)  # rank 0 alone prints: one JSON document
    assert data["distributed"]["world_size"] == 2 and data["distributed"]["backend"] == "gloo"
    assert data["verification"]["status"] == "passed"
    meta = json.loads((two / "quantkit.json").read_text())
    assert (
        meta["distributed"]["world_size"] == 2
        and json.loads((one / "quantkit.json").read_text())["distributed"]["world_size"] == 1
    )
    if "gptq" in recipe:
        assert meta["calibration"]["samples"] == 8  # every sample calibrated, split across the ranks
    a, b = _tensors(one), _tensors(two)
    assert a.keys() == b.keys() and a
    different = [k for k in a if a[k].dtype != b[k].dtype or not bool((a[k] == b[k]).all())]
    assert different == []  # identical tensors (measured: GPTQ's float32 Hessian sums agree to ~1e-7, no code flips)


def _flat(value) -> list[float]:
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _flat(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    return [float(value)]


@pytest.mark.slow
def test_torchrun_eval_equals_one_process(tiny_llama, tiny_text, tmp_path):
    art = tmp_path / "art"
    assert _quantkit(_convert_args("int4-w4a16-rtn", tiny_llama, art, tiny_text), tmp_path / "h0").returncode == 0
    args = [
        "eval",
        str(art),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--region",
        "second-half",
        "--seq-len",
        "64",
        "--max-tokens",
        "704",
        "--device",
        "cpu",
        "--json",
    ]  # 11 windows: the ranks get 6 and 5
    r1 = _quantkit(args, tmp_path / "h1")
    r2 = _quantkit(args, tmp_path / "h2", launcher=TORCHRUN)  # its own home: the baseline pass runs split too
    assert r1.returncode == 0, r1.stderr[-2000:]
    assert r2.returncode == 0, r2.stderr[-3000:]
    a, b = json.loads(r1.stdout), json.loads(r2.stdout)
    assert (a["world_size"], b["world_size"]) == (1, 2)
    assert b["windows"]["count"] == 11 and b["tokens"] == a["tokens"] == 11 * 63
    for key in ("ppl", "baseline_ppl", "delta_ppl_pct", "kld", "top1_agreement", "ci95"):
        assert _flat(b[key]) == pytest.approx(_flat(a[key]), rel=1e-6, abs=1e-9), (
            key
        )  # to reduction order (here: exactly)
    r3 = _quantkit(args, tmp_path / "h2", launcher=TORCHRUN)  # now every rank reads the cached baseline
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert json.loads(r3.stdout)["baseline_cached"] is True and json.loads(r3.stdout)["ppl"] == b["ppl"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _two_nodes(args, home: Path, timeout=600) -> list[subprocess.CompletedProcess]:
    """`torchrun --nnodes 2 --nproc-per-node 1` twice on this host, joined by c10d rendezvous on
    loopback: two "machines" of one process each, as on a cluster (GROUP_WORLD_SIZE 2,
    LOCAL_WORLD_SIZE 1), with the same command on each."""
    port = _free_port()
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"qk-{os.getpid()}-{port}",
    ]

    def node():
        return subprocess.Popen(
            [*launcher, "-m", "quantkit", *args],
            cwd=REPO,
            env=_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    # The second node starts once the first hosts the rendezvous store: agents on the endpoint's own
    # host each try to host it first, then connect as clients (torch's c10d rendezvous backend), and
    # two started together on a loaded machine have ended in RendezvousConnectionError; on a cluster
    # only one node is the endpoint's host.
    procs = [node()]
    deadline = time.monotonic() + 120
    while procs[0].poll() is None and time.monotonic() < deadline and not _listening(port):
        time.sleep(0.2)
    procs.append(node())
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return done


@pytest.mark.slow
def test_two_nodes_eval_equals_one_process_and_convert_is_refused(tiny_llama, tiny_text, tmp_path):
    """Several machines: eval splits its windows over the nodes' ranks (each loads its own copy)
    and equals one process; a convert is refused in one line on every node (llm-compressor's
    distributed calibration shares the model through one machine's shared memory)."""
    art = tmp_path / "art"
    assert _quantkit(_convert_args("int4-w4a16-rtn", tiny_llama, art, tiny_text), tmp_path / "h0").returncode == 0
    args = [
        "eval",
        str(art),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--region",
        "second-half",
        "--seq-len",
        "64",
        "--max-tokens",
        "448",
        "--device",
        "cpu",
        "--json",
    ]
    one = _quantkit(args, tmp_path / "h1")
    assert one.returncode == 0, one.stderr[-2000:]
    nodes = _two_nodes(args, tmp_path / "h2")
    assert [n.returncode for n in nodes] == [0, 0], [n.stderr[-2000:] for n in nodes]
    printed = [json.loads(n.stdout) for n in nodes if n.stdout.strip()]
    assert len(printed) == 1  # rank 0's node alone prints
    a, b = json.loads(one.stdout), printed[0]
    assert b["world_size"] == 2 and b["tokens"] == a["tokens"]
    for key in ("ppl", "baseline_ppl", "kld", "top1_agreement", "ci95"):
        assert _flat(b[key]) == pytest.approx(_flat(a[key]), rel=1e-6, abs=1e-9), key
    out = tmp_path / "conv"
    nodes = _two_nodes(_convert_args("int4-w4a16-gptq-g64", tiny_llama, out, tiny_text), tmp_path / "h3")
    assert all(n.returncode != 0 for n in nodes)
    assert all("run the conversion on one machine" in n.stderr for n in nodes), [n.stderr[-1500:] for n in nodes]
    assert all(f'File "{REPO / "quantkit"}' not in n.stderr for n in nodes)  # one line, no traceback of ours
    _nothing_at(out)


@pytest.mark.slow
def test_torchrun_failure_on_one_rank_stops_all(tiny_llama, tiny_text, tmp_path):
    """rank 0 cannot claim --out (another command holds it): both ranks exit 2, nothing written."""
    from quantkit.core.atomic import exclusive

    out = tmp_path / "held"
    with exclusive(out):
        r = _quantkit(
            _convert_args("int4-w4a16-gptq-g64", tiny_llama, out, tiny_text), tmp_path / "h", launcher=TORCHRUN
        )
    assert r.returncode != 0
    assert _quantkit_lines(r.stderr) == [
        f"error: {out} is in use by another quantkit process (pid {os.getpid()}); wait for it to finish"
    ]
    assert r.stderr.count("exitcode  : 2") == 2  # rank 1 heard of it (distributed.agree) and exits alike, silent
    assert not out.exists()
    r = _quantkit(_convert_args("bnb-nf4", tiny_llama, tmp_path / "bnb", tiny_text), tmp_path / "h", launcher=TORCHRUN)
    assert r.returncode != 0 and "does not run under torchrun" in r.stderr
    assert f'File "{REPO / "quantkit"}' not in r.stderr  # one line (torchrun adds its own failure report)
    assert r.stderr.count("does not run under torchrun") == 1
    _nothing_at(tmp_path / "bnb")


def _quantkit_lines(stderr: str) -> list[str]:
    """quantkit's error lines in a torchrun's stderr (torchrun's own lines are
    its log, its traceback and its report)."""
    return [line for line in stderr.splitlines() if line.startswith(("error: ", "Error: "))]


@pytest.mark.slow
def test_torchrun_refusals_are_one_line_and_exit_2_in_every_rank(tiny_llama, tiny_dir, tiny_text, tmp_path):
    """Each kind of refusal under `torchrun --nproc-per-node 2`: one line from rank 0, rank 1
    silent, both processes exit 2 (torchrun's report lists each process's exit code; torchrun
    itself exits 1 and adds its log lines, its own traceback and that report)."""
    import shutil

    art = Path(shutil.copytree(tiny_llama, tmp_path / "art"))  # says it was converted from another checkpoint
    (art / "quantkit.json").write_text(
        json.dumps({"kind": "quantkit-artifact", "source": {"path": "/elsewhere", "sha256": "0" * 64}})
    )
    binary = tmp_path / "random.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    ev = ["eval", "--device", "cpu", "--seq-len", "64", "--max-tokens", "128"]
    cases = {
        "a bad argument": ([*ev, str(tiny_llama), "--baseline", str(tiny_llama), "--bogus"], "No such option"),
        "a missing model": (
            [*ev, str(tmp_path / "nothing"), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}"],
            "no such file or directory",
        ),
        "a binary --text": (
            [*ev, str(tiny_llama), "--baseline", str(tiny_llama), "--text", f"file:{binary}"],
            "not UTF-8 text",
        ),
        "a baseline mismatch": (
            [*ev, str(art), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}"],
            "is not the checkpoint",
        ),
        "--out is the source": (
            _convert_args("int4-w4a16-rtn", tiny_llama, tiny_llama, tiny_text),
            "is the source checkpoint",
        ),
    }
    for case, (args, needle) in cases.items():
        r = _quantkit(args, tmp_path / "h", launcher=TORCHRUN)
        lines = _quantkit_lines(r.stderr)
        assert len(lines) == 1 and needle in lines[0], (case, r.stderr[-3000:])
        assert r.returncode == 1 and "ChildFailedError" in r.stderr, case  # torchrun's, whatever the workers' codes
        assert r.stderr.count("exitcode  : 2") == 2 and "SIGTERM" not in r.stderr.split("ChildFailedError")[-1], (
            case,
            r.stderr[-2000:],
        )
        assert f'File "{REPO / "quantkit"}' not in r.stderr and r.stdout == "", case


def _worker_pids(launcher_pid: int) -> dict[int, int]:
    """LOCAL_RANK -> pid of torchrun's workers."""
    import psutil

    found = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            rank = child.environ().get("LOCAL_RANK")
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if rank is not None and "quantkit" in " ".join(child.cmdline()):
            found[int(rank)] = child.pid
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_dead_rank_stops_the_others_and_leaves_nothing(sig, tiny_llama, tiny_text, tmp_path):
    """Rank 1 killed (torchrun notices and stops rank 0: ~1.3 s here) or frozen (torchrun cannot
    tell; rank 0's next collective times out after QUANTKIT_DIST_TIMEOUT=10 s, then torchrun stops
    the rest: ~46 s here) while it calibrates: every process gone within BOUND_S, nothing at --out."""
    out = tmp_path / "out"
    args = _convert_args(
        "int4-w4a16-gptq-g64",
        tiny_llama,
        out,
        tiny_text,
        "--set",
        "calibration.samples=64",
        "--set",
        "calibration.seq_len=256",
    )
    err = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen(
        [*TORCHRUN, "-m", "quantkit", *args],
        cwd=REPO,
        env={**_env(tmp_path / "h"), "QUANTKIT_DIST_TIMEOUT": "10"},
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while (
            "quantize: gptq" not in Path(err.name).read_text() and proc.poll() is None and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        workers = _worker_pids(proc.pid)
        assert proc.poll() is None and 1 in workers, Path(err.name).read_text()[-2000:]
        os.kill(workers[1], sig)
        t0 = time.monotonic()
        rc = proc.wait(timeout=BOUND_S)
        assert rc != 0 and time.monotonic() - t0 < BOUND_S
        for pid in workers.values():
            assert not _alive(pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _nothing_at(out)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_only_the_runtime_reads_the_launch():
    """Convert and eval learn where they run from the Runtime they are given: no module but
    core/distributed.py imports torch.distributed or reads the launcher's environment."""
    root = REPO / "quantkit"
    launch = re.compile(r"torch\.distributed|\b(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|TORCHELASTIC_RUN_ID)\b")
    readers = [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*.py"))
        if p != root / "core" / "distributed.py" and launch.search(p.read_text())
    ]
    assert readers == []
