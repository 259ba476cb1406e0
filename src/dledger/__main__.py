"""`python -m dledger` is the `dledger` command."""

from dledger.cli import main

main()
