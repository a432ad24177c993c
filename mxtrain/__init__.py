"""mxtrain: train, evaluate and serve Apache MXNet models from YAML experiment files."""

from mxtrain.mxnet_import import lighten_mxnet_import

__version__ = "0.1.0"

lighten_mxnet_import()
