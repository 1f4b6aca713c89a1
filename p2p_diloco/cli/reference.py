"""`p2p-diloco bench reference` and `bench keep`: BENCHMARKS.md's first table from the stored results
(`bench.reference`), DESIGN.md's tables from the code (`bench.design`)."""

from __future__ import annotations

from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]
RESULTS, BENCHMARKS, DESIGN = ROOT / "docs" / "results", ROOT / "BENCHMARKS.md", ROOT / "docs" / "DESIGN.md"


@click.command("reference")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 when a generated table differs from the results or the code.")
def bench_reference(check) -> None:
    """Rewrite BENCHMARKS.md's table of today's figures from the results in docs/results, and
    docs/DESIGN.md's tables of the admission's checks and the config sections from the code."""
    from p2p_diloco.bench import design, reference
    from p2p_diloco.cli.config_file import SECTIONS

    docs = [(BENCHMARKS, "docs/results", lambda: reference.render(BENCHMARKS, RESULTS)),
            (DESIGN, "the code", lambda: design.render(DESIGN, SECTIONS))]
    for path, source, render in docs:
        try:
            now, want = render()
        except reference.ReferenceError as e:
            raise click.ClickException(str(e)) from e
        if check:
            if now != want:
                raise click.ClickException(f"{path.name}'s generated tables differ from {source}: "
                                           f"run p2p-diloco bench reference")
            click.echo(f"{path.name}'s generated tables match {source}")
        else:
            path.write_text(want)
            click.echo(f"{path.name}'s generated tables " + ("are unchanged" if now == want else f"rewritten from {source}"))


@click.command("keep")
@click.argument("name")
@click.argument("output", type=click.Path(exists=True, dir_okay=False))
@click.option("--command", "command", required=True, help="The command that printed OUTPUT, as a user would type it.")
@click.option("--runtime-s", type=click.FloatRange(min=0), required=True, help="Its wall time, seconds.")
@click.option("--commit", default=None, help="The commit it ran at (default: this checkout's).")
def bench_keep(name, output, command, runtime_s, commit) -> None:
    """Store a bench's --json OUTPUT as docs/results/NAME.json, with this checkout's commit, today's
    date and this machine; then `bench reference` puts it in the table."""
    from p2p_diloco.bench.reference import ReferenceError, keep

    try:
        path = keep(name, Path(output), command, runtime_s, RESULTS, commit)
    except ReferenceError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"stored {path}")
