"""A trained model as an ONNX file (the original's `get_onnx_model`), written by torch.onnx from the
torch.nn.Module that `R.fetch_persisting_op` returns for a saved model. Needs the [onnx] extra."""
from typing import Any

import torch

EXPORT_BATCH = 2   # the example input's batch size: above 1, so the batch dimension can stay dynamic


def write(module: Any, input_spec: tuple[Any, Any], path: str) -> str:
    """Export `module` (taking one input of `input_spec` = (shape without the batch dimension, dtype)) to
    `path`, its input "X" and output "Y" with a dynamic batch dimension; returns `path`."""
    try:
        import onnxscript  # noqa: F401  (torch.onnx's exporter is built on it)
    except ImportError:
        raise ImportError("exporting to ONNX needs onnx and onnxscript: pip install 'ravop-engine[onnx]'") from None
    shape, dtype = input_spec
    example = torch.zeros((EXPORT_BATCH,) + tuple(shape), dtype=dtype)
    batch = torch.export.Dim("batch")
    program = torch.onnx.export(module.eval(), (example,), input_names=["X"], output_names=["Y"],
                                dynamic_shapes=({0: batch},), dynamo=True, verbose=False)
    program.save(path)
    return path
