"""`python -m layoutsearch.cli`: the `layoutsearch` command."""

from layoutsearch.cli import main

main()
