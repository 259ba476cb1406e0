"""The `dledger` command (SPEC §5)."""

from __future__ import annotations

import logging
import sys

import click

from dledger.codes import DLedgerError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """dledger: a Raft-replicated commit log."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command()
def demo() -> None:
    """Run the end-to-end demo (what `make demo` runs)."""
    from dledger.demo import run_demo

    sys.exit(run_demo())


def main() -> None:
    """Entry point: user mistakes end with one line on stderr, never a traceback."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except DLedgerError as e:
        click.echo(f"dledger: error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
