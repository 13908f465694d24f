"""RavDL: a Keras-like layer library on top of ravop ops (`from ravdl.v2 import NeuralNetwork, Functional`)."""
