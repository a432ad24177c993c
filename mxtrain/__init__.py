"""mxtrain: train, evaluate and serve Apache MXNet models from YAML experiment files."""

from mxtrain.mxnet_import import keep_scikit_learn_out_of_mxnet

__version__ = "0.1.0"

keep_scikit_learn_out_of_mxnet()
