"""RavDL layers (`from ravdl.v2.layers import Dense, ...`): configuration on the requester, values in the graph."""
from .base import CustomLayer, Layer
from .convolution import Conv2D, MaxPooling2D
from .core import Activation, Dense, Dropout, Embedding, Flatten
from .math_ops import Add, Concat, Division, Dot, Multiply, Power, Reshape, Subtract, Transpose
from .normalization import BatchNormalization1D, BatchNormalization2D, LayerNormalization

__all__ = ["Activation", "Add", "BatchNormalization1D", "BatchNormalization2D", "Concat", "Conv2D", "CustomLayer",
           "Dense", "Division", "Dot", "Dropout", "Embedding", "Flatten", "Layer", "LayerNormalization", "MaxPooling2D",
           "Multiply", "Power", "Reshape", "Subtract", "Transpose"]
