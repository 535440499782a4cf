"""Hydra configs of the `layoutsearch` command: the primary config and the `driver` group."""
