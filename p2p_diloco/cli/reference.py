"""`p2p-diloco bench reference` and `bench keep`: BENCHMARKS.md's first table from the stored results
(`bench.reference`)."""

from __future__ import annotations

from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]
RESULTS, BENCHMARKS = ROOT / "docs" / "results", ROOT / "BENCHMARKS.md"


@click.command("reference")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when BENCHMARKS.md's table differs from the results.")
def bench_reference(check) -> None:
    """Rewrite BENCHMARKS.md's table of today's figures from the results in docs/results."""
    from p2p_diloco.bench.reference import ReferenceError, render

    try:
        now, want = render(BENCHMARKS, RESULTS)
    except ReferenceError as e:
        raise click.ClickException(str(e)) from e
    if check:
        if now != want:
            raise click.ClickException("BENCHMARKS.md's table differs from docs/results: run p2p-diloco bench reference")
        click.echo("BENCHMARKS.md's table matches docs/results")
        return
    BENCHMARKS.write_text(want)
    click.echo("BENCHMARKS.md's table " + ("is unchanged" if now == want else "rewritten from docs/results"))


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
