"""Command-line interface (the only package that imports click)."""

from mxtrain.cli.main import main

__all__ = ["main"]
