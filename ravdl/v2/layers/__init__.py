"""RavDL layers (`from ravdl.v2.layers import Dense, ...`): configuration on the requester, values in the graph."""
from .base import CustomLayer, Layer
from .convolution import Conv2D, MaxPooling2D
from .core import Activation, Dense, Dropout, Embedding, Flatten
from .normalization import BatchNormalization1D, BatchNormalization2D, LayerNormalization

__all__ = ["Activation", "BatchNormalization1D", "BatchNormalization2D", "Conv2D", "CustomLayer", "Dense", "Dropout",
           "Embedding", "Flatten", "Layer", "LayerNormalization", "MaxPooling2D"]
