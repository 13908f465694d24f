"""RavDL v2: Keras-like models on ravop's dataflow graph.

    from ravdl.v2 import NeuralNetwork, Functional
    from ravdl.v2.layers import Dense, Activation
    from ravdl.v2.optimizers import Adam

Layer parameters, optimizer state and batch-norm statistics are tensors in the graph; a training step
records the forward ops, `R.grad` and the optimizer's step ops. `save_model(name)` persists the trained
model, which `R.fetch_persisting_op(name)` returns as a torch.nn.Module. Once a graph has run, its model
predicts, evaluates and trains on in the next graph from its trained values (ravdl.v2.trained_values), and
`model.save(path)` / `load_model(path)` keep it in a file.
"""
from .functional import Functional
from .history import History
from .model_file import load_model
from .pytorch_model import Pytorch_Model
from .sequential import NeuralNetwork

__all__ = ["Functional", "History", "NeuralNetwork", "Pytorch_Model", "load_model"]
