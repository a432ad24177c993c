"""Entry point for ``python -m mxtrain``."""

from mxtrain.cli import main

if __name__ == "__main__":
    main()
