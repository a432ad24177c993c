"""mxtrain: train, evaluate and serve Apache MXNet models from YAML experiment files."""

__version__ = "0.1.0"
