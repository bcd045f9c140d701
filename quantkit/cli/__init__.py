"""The `quantkit` command: nouns as groups, verbs as subcommands.

User errors (QuantkitError) become one line on stderr and exit code 2 here and only
here; any other exception (a fault in a library) one line and exit code 1; `--debug`
shows the traceback instead.
"""

from __future__ import annotations

import sys

import click

from quantkit.cli import (
    bench_cmd,
    compare_cmd,
    convert_cmd,
    engines_cmd,
    eval_cmd,
    export_cmd,
    levers_cmd,
    load_cmd,
    models_cmd,
    pareto_cmd,
    publish_cmd,
    recipe_cmd,
    roofline_cmd,
    run_cmd,
    sensitivity_cmd,
)
from quantkit.errors import QuantkitError


def _permission_denied(exc: BaseException) -> bool:
    """A file or directory the user named (or QUANTKIT_HOME) that cannot be read or written."""
    import errno

    return isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and bool(exc.filename)


def _fail(exc: BaseException, line: str, code: int):
    """Print `line` and exit with `code`; under torchrun, only the process that reports `exc`
    prints (distributed.error_line), and every process exits with `code`."""
    from quantkit.core.distributed import error_line, exit_silently

    shown = error_line(exc, line)
    if shown is None:
        exit_silently(code)
    click.echo(shown, err=True)
    sys.exit(code)


def _usage_error(exc: click.ClickException):
    """Under torchrun a usage error (the same arguments in every process) is printed by each
    machine's first process alone (click prints it); the others exit with its code, silent."""
    from quantkit.core.distributed import exit_silently, quiet

    if quiet():
        exit_silently(exc.exit_code)
    raise exc


class _Group(click.Group):
    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as exc:
            _usage_error(exc)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except QuantkitError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            _fail(exc, f"error: {exc}", exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:  # the reader went away (`quantkit recipe list | head -1`): stop quietly, as cat does
            import os

            os.dup2(
                os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno()
            )  # no second error when Python flushes stdout at exit
            sys.exit(141)  # 128 + SIGPIPE, what a shell reports for a writer killed by the pipe
        except click.ClickException as exc:
            _usage_error(exc)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a fault inside a library (or quantkit): one line, exit 1
            if ctx.obj and ctx.obj.get("debug"):
                raise
            if _permission_denied(exc):  # the user's files or directories, not a fault: exit 2
                _fail(exc, f"error: {exc.filename}: {exc.strerror}", 2)
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            _fail(
                exc,
                f"error: {type(exc).__name__}: {first} (an unexpected failure; "
                "`quantkit --debug ...` shows the traceback)",
                1,
            )


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="quantkit")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Quantize, GQA-convert, evaluate and benchmark LLM checkpoints."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    from quantkit.core.distributed import check_command
    from quantkit.quiet import quiet_libraries

    quiet_libraries(debug)
    check_command(ctx.invoked_subcommand)  # under torchrun: convert and eval only


for _module in (
    models_cmd,
    recipe_cmd,
    convert_cmd,
    export_cmd,
    eval_cmd,
    bench_cmd,
    roofline_cmd,
    run_cmd,
    pareto_cmd,
    compare_cmd,
    publish_cmd,
    load_cmd,
    levers_cmd,
    sensitivity_cmd,
    engines_cmd,
):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main() -> None:
    cli(prog_name="quantkit")
