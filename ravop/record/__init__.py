"""Recording a program: the graph of `Op`s, the generated `R.<op>` functions, autodiff, constants, training
loops as recorded, and PyTorch models imported as graph values."""
