"""`quantkit engines install|status`: engines that live in virtual environments of their own (quantkit.external)."""

from __future__ import annotations

import click

from quantkit.cli._common import echo_json, json_option
from quantkit.external import INSTALLABLE


@click.group("engines")
def engines_group() -> None:
    """Engines quantkit installs into environments of their own (vLLM), and their state."""


@engines_group.command("install")
@click.argument("name", type=click.Choice(list(INSTALLABLE)))
@click.option(
    "--flavor",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="auto: cuda where nvidia-smi answers, else cpu.",
)
@click.option("--force", is_flag=True, help="Rebuild even if an environment with the same pins is there.")
@json_option
def install(name: str, flavor: str, force: bool, as_json: bool) -> None:
    """Build NAME's environment once under QUANTKIT_HOME (idempotent)."""
    from quantkit.external import environment

    result = environment(name).install(None if flavor == "auto" else flavor, force=force)
    if as_json:
        echo_json(result)
        return
    added = result.get("added") or []  # packages added to an environment built before (no rebuild)
    how = (
        f"built in {result['build_s']:.0f} s"
        if result["built"]
        else f"added {', '.join(added)}"
        if added
        else "already installed"
    )
    stamp = result.get("stamp") or {}
    click.echo(f"{name} {stamp.get('vllm_version', '?')} ({stamp.get('flavor', '?')}): {result['path']} ({how})")


@engines_group.command("status")
@click.argument("name", type=click.Choice([*INSTALLABLE, "llamacpp"]), default="vllm")
@json_option
def status(name: str, as_json: bool) -> None:
    """Where NAME's environment is, and whether it imports; for llamacpp, which library and CPU
    variant runs here (each variant is tried once per machine before it is trusted) and its tools."""
    from quantkit.external import environment

    if name == "llamacpp":
        _llamacpp_status(as_json)
        return

    st = environment(name).status()
    if as_json:
        echo_json(st)
        return
    click.echo(f"{name}: {st['path']} (from {st['source']})")
    if not st["installed"]:
        from quantkit.external.vllm_env import INSTALL_HINT

        click.echo(f"  not installed; {INSTALL_HINT}")
    stamp = st.get("stamp")
    if stamp:
        click.echo(f"  built {stamp.get('built')}: {' '.join(stamp.get('packages', []))} ({stamp.get('flavor')})")
    if "imports" in st:
        click.echo(f"  import vllm: {'ok, ' + st['vllm_version'] if st['imports'] else 'fails: ' + st['error']}")


def _llamacpp_status(as_json: bool) -> None:
    from quantkit.bench.engines.llamacpp_engine import cpu_choice, import_llama_cpp, library
    from quantkit.gguf import tools

    llama_cpp = import_llama_cpp()  # tries the library's CPU variants first, where not yet done here
    choice = cpu_choice()
    st = {
        "llama_cpp_python": llama_cpp.__version__,
        "library": library(),
        "cpu": choice.to_json(),
        "tools": tools.status(),
    }
    if as_json:
        echo_json(st)
        return
    click.echo(f"llamacpp: llama-cpp-python {st['llama_cpp_python']}, {st['library']}")
    click.echo(f"  CPU variant: {choice.describe()}")
    for t in choice.trials:
        click.echo(f"    {t.variant:<16} score {t.score if t.score is not None else '-':>5}  {t.result}")
    tl = st["tools"]
    click.echo(f"  tools: {tl['dir'] or 'not built (' + tools.INSTALL + ')'}")
    for name, entry in tl["tools"].items():
        click.echo(f"    {name:<17} {entry.get('version') or entry.get('error') or 'missing'}")


COMMANDS = [engines_group]
