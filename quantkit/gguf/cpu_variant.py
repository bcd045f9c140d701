"""Which of a llama.cpp build's CPU variants this machine runs, tried before one is trusted.

A build with ggml's run-time dispatch (GGML_BACKEND_DL, one libggml-cpu-VARIANT.so per x86 level)
loads the variant whose `ggml_backend_score()` is highest, and that score reads CPUID alone. A VM
can advertise what it does not execute: Intel VMs that list AMX (amx_tile, amx_int8) but trap on
`tilezero` load `sapphirerapids` and die of SIGILL on the first matmul (a known upstream
class of fault: "CPU feature scoring trusts CPUID"). So the variant ggml would pick is first run in a child
process (cpu_probe.py: a tiny model through the same library, prefill and decode); if it dies, the
next-best variant is tried, and so on. The verdict is kept under QUANTKIT_HOME keyed by the CPU
(model name and flags) and the build, so each machine pays for it once (about a second per
variant tried).

When ggml's own choice runs, the build's directory is used as it is. Otherwise quantkit makes a
directory of hard links (copies across filesystems) to the build's files with only the chosen
variant among the CPU libraries: ggml's loader then finds that one, in quantkit's own engine
(LLAMA_CPP_LIB_PATH) and in every tool quantkit starts (the tools search their own directory).

A library without run-time dispatch (llama-cpp-python's own wheel) is one variant: it is tried the
same way, and refused in one line if it dies.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantkit.core.atomic import remove, write_json
from quantkit.core.record_checks import FLAG, LIST, TEXT, TEXT_OR_NONE, Num, RecordError, check_values, checked
from quantkit.core.signals import EngineCrash, crash_line, signal_name
from quantkit.errors import QuantkitError
from quantkit.gguf.cpu_probe import write_model
from quantkit.home import subdir

PROBE_TIMEOUT_S = 120.0
SCHEMA = 1
ENV_FORCE = "QUANTKIT_LLAMA_CPU_VARIANT"  # a variant name: use it (its probe still has to pass)


@dataclass(frozen=True)
class Trial:
    variant: str
    score: int | None
    ok: bool
    result: str  # "ran", "died of SIGILL", "failed: ..."


@dataclass(frozen=True)
class Choice:
    """The verdict for one build on one machine: the variant used and the directory to load it from."""

    library: str  # the build's directory, or "llama-cpp-python's wheel"
    dispatch: bool  # the build picks a CPU variant at run time
    variant: str | None  # the CPU variant used (None: a library without variants)
    dir: str | None  # the directory to load (the build's own, or quantkit's filtered copy); None: the wheel's
    fallback: bool  # ggml's own choice died and another variant is used
    trials: tuple[Trial, ...] = field(default_factory=tuple)
    machine: str = ""
    schema: int = SCHEMA

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data) -> Choice:
        """A verdict as its record holds it, checked by key and value (RecordError otherwise)."""
        d = checked(cls, data, "cpu-variant record")
        if d["schema"] != SCHEMA:
            raise RecordError(f"cpu-variant record of schema {d['schema']!r}, not {SCHEMA}")
        rules = {"library": TEXT, "dispatch": FLAG, "variant": TEXT_OR_NONE, "dir": TEXT_OR_NONE, "fallback": FLAG}
        check_values(d, rules | {"trials": LIST, "machine": TEXT}, "cpu-variant record")
        trial_rules = {"variant": TEXT, "score": Num(none=True), "ok": FLAG, "result": TEXT}
        trials = tuple(
            Trial(**check_values(checked(Trial, t, "cpu-variant trial"), trial_rules, "cpu-variant trial"))
            for t in d["trials"]
        )
        return cls(**{**d, "trials": trials})

    def mismatch(self, lib_dir: Path | None) -> str | None:
        """Why this verdict does not describe `lib_dir`'s build as it is on disk now, or None: another
        library, variants the build does not have, trials that say one ran while none is chosen (or the
        reverse), a directory that is gone or lacks the chosen variant, another machine."""
        variants = variants_of(lib_dir) if lib_dir is not None else []
        name = str(lib_dir) if lib_dir is not None else "llama-cpp-python's wheel"
        ran = [t.variant for t in self.trials if t.ok]
        if self.library != name or self.dispatch != bool(variants) or self.machine != machine_key():
            return "another build or machine"
        if not self.trials or any(t.variant not in (variants or ["build"]) for t in self.trials):
            return "a variant the build does not have"
        if not self.dispatch:  # one build: tried once, loaded from where it is
            same = self.variant is None and self.dir == (str(lib_dir) if lib_dir is not None else None)
            return None if same and len(self.trials) == 1 else "its trials and its choice disagree"
        if (self.variant is None) != (self.dir is None) or (self.variant is not None and self.variant not in ran):
            return "its trials and its choice disagree"
        if self.variant is None and ran:
            return "its trials and its choice disagree"
        if self.dir is not None and not (Path(self.dir) / f"libggml-cpu-{self.variant}.so").exists():
            return "its directory is gone or lacks its variant"
        return None

    def describe(self) -> str:
        if not self.dispatch:
            return "one CPU build (no run-time dispatch)"
        died = [t for t in self.trials if not t.ok]
        tail = f"; {', '.join(f'{t.variant} {t.result}' for t in died)}" if died else ""
        return f"{self.variant}{' (fallback)' if self.fallback else ''}{tail}"


def machine_key() -> str:
    """The CPU as a verdict depends on it: its model name and feature flags (Linux), else the platform."""
    text = platform.machine() + platform.processor()
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        info = ""
    for line in info.splitlines():
        if line.startswith(("model name", "flags", "Features", "CPU implementer", "CPU part")):
            text += "\n" + " ".join(line.split())
        if not line.strip() and text.count("\n") >= 2:
            break  # the first processor's block is enough
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _build_key(lib_dir: Path | None) -> str:
    """The build, by what identifies its files: BUILD.json where the tools build wrote one, else the
    libraries' names, sizes and modification times."""
    if lib_dir is None:
        lib_dir = wheel_dir()
    h = hashlib.sha256(str(lib_dir.resolve()).encode() if lib_dir else b"none")
    if lib_dir is not None:
        record = lib_dir / "BUILD.json"
        if record.is_file():
            h.update(record.read_bytes())
        for f in sorted(lib_dir.glob("lib*.so*")):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def wheel_dir() -> Path | None:
    """llama-cpp-python's own library directory (site-packages/llama_cpp/lib), without importing it."""
    for entry in sys.path:
        lib = Path(entry) / "llama_cpp" / "lib"
        if (lib / "libllama.so").is_file():
            return lib
    return None


def variants_of(lib_dir: Path) -> list[str]:
    return sorted(f.name.removeprefix("libggml-cpu-").removesuffix(".so") for f in lib_dir.glob("libggml-cpu-*.so"))


def _child(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "quantkit.gguf.cpu_probe", *args]
    clean = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "GGML_BACKEND_PATH")}
    return subprocess.run(
        cmd, capture_output=True, text=True, errors="replace", timeout=PROBE_TIMEOUT_S, env={**clean, **(env or {})}
    )


def scores(lib_dir: Path) -> dict[str, int | None]:
    """Each variant's score as ggml's loader reads it (in a child process: loading is safe, running is not)."""
    try:
        proc = _child(["score", str(lib_dir)])
    except subprocess.TimeoutExpired:
        raise EngineCrash(
            f"{lib_dir}: scoring its CPU variants did not finish within {PROBE_TIMEOUT_S:.0f} s"
        ) from None
    if proc.returncode != 0:
        raise EngineCrash(
            crash_line(f"scoring the CPU variants of {lib_dir}", proc.returncode, "rebuild llama.cpp's tools")
            if signal_name(proc.returncode)
            else f"scoring the CPU variants of {lib_dir} failed: {_last_line(proc.stderr)}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def try_dir(lib_dir: Path | None, model: Path) -> tuple[bool, str]:
    """Run the tiny model through the library in `lib_dir` (None: llama-cpp-python's wheel) in a child."""
    try:
        proc = _child(["run", str(lib_dir) if lib_dir is not None else "-", str(model)])
    except subprocess.TimeoutExpired:
        return False, f"did not finish within {PROBE_TIMEOUT_S:.0f} s"
    if proc.returncode == 0:
        return True, "ran"
    sig = signal_name(proc.returncode) if proc.returncode < 0 else None
    return False, f"died of {sig}" if sig else f"failed: {_last_line(proc.stderr)}"


def _link_dir(lib_dir: Path, keep: str | None, dest: Path) -> Path:
    """`dest`: every file of `lib_dir` (hard links, copies across filesystems) but the CPU variants
    other than `keep`; made beside `dest` and renamed into place, so a reader never sees half of it."""
    if (dest / ".complete").is_file():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for f in lib_dir.iterdir():
            if not f.is_file() or (f.name.startswith("libggml-cpu-") and f.name != f"libggml-cpu-{keep}.so"):
                continue
            target = tmp / f.name
            if f.is_symlink():
                os.symlink(os.readlink(f), target)
                continue
            try:
                os.link(f, target)
            except OSError:
                shutil.copy2(f, target)
        (tmp / ".complete").write_text(json.dumps({"from": str(lib_dir), "variant": keep}) + "\n")
        try:
            os.replace(tmp, dest)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _decide(lib_dir: Path | None, model: Path, key: str) -> Choice:
    machine = machine_key()
    if lib_dir is None or not variants_of(lib_dir):
        ok, result = try_dir(lib_dir, model)
        name = str(lib_dir) if lib_dir is not None else "llama-cpp-python's wheel"
        trial = Trial("build", None, ok, result)
        return Choice(name, False, None, str(lib_dir) if lib_dir else None, False, (trial,), machine)
    ranked = sorted(((s, v) for v, s in scores(lib_dir).items() if s), reverse=True)
    forced = os.environ.get(ENV_FORCE)
    if forced:
        if forced not in variants_of(lib_dir):
            raise QuantkitError(
                f"{ENV_FORCE}={forced}: not a CPU variant of {lib_dir} ({', '.join(variants_of(lib_dir))})"
            )
        ranked = [(s, v) for s, v in ranked if v == forced] or [(0, forced)]
    trials: list[Trial] = []
    for i, (score, variant) in enumerate(ranked):
        probe_dir = _link_dir(lib_dir, variant, subdir("llama-cpu") / f"{key}-{variant}")
        ok, result = try_dir(probe_dir, model)
        trials.append(Trial(variant, score, ok, result))
        if ok:
            chosen = lib_dir if i == 0 and not forced else probe_dir
            return Choice(str(lib_dir), True, variant, str(chosen), i > 0, tuple(trials), machine)
    return Choice(str(lib_dir), True, None, None, False, tuple(trials), machine)


def choose(lib_dir: Path | None) -> Choice:
    """The verdict for `lib_dir` (None: llama-cpp-python's wheel) on this machine: cached, else tried now."""
    key = hashlib.sha256(f"{machine_key()}:{_build_key(lib_dir)}:{os.environ.get(ENV_FORCE, '')}".encode()).hexdigest()[
        :16
    ]
    record = subdir("llama-cpu") / f"{key}.json"
    try:
        choice = Choice.from_json(json.loads(record.read_text()))
        if choice.mismatch(lib_dir) is None:
            return choice
    except (OSError, ValueError, RecursionError, QuantkitError):
        pass  # missing, unreadable or not this build's verdict: try the variants again, and record them
    if os.path.lexists(record) and not record.is_file():
        remove(record)  # quantkit's own cache: a directory or a link in the record's place goes
    model = subdir("llama-cpu") / "probe.gguf"
    if not model.is_file():
        tmp = model.with_name(f".probe.{os.getpid()}.gguf")
        write_model(tmp)
        os.replace(tmp, model)
    choice = _decide(lib_dir, model, key)
    write_json(record, choice.to_json())
    return choice


def runnable_dir(lib_dir: Path | None) -> tuple[Path | None, Choice]:
    """The directory to load `lib_dir`'s library and tools from on this machine; one line (exit 1)
    when no variant of the build runs here."""
    choice = choose(lib_dir)
    if choice.dir is None and (choice.dispatch or not choice.trials[0].ok):
        tried = ", ".join(f"{t.variant} {t.result}" for t in choice.trials) or "no variant scores above 0"
        raise EngineCrash(
            f"llama.cpp ({choice.library}) does not run on this CPU ({tried}); rebuild it for this machine: "
            "QUANTKIT_WITH_LLAMA_TOOLS=1 ./scripts/_install.sh (or set QUANTKIT_SKIP_LLAMACPP=1 to work without it)"
        )
    return (Path(choice.dir) if choice.dir else None), choice
