"""The wire format both sides share: the protobuf plan and the tensor/params codec."""
from . import plan_pb2
from .codec import decode_params, decode_tensor, encode_params, encode_tensor, encode_tensors
from .loop_message import pack_loop, unpack_loop
from .nodes import pack_nodes, unpack_nodes

__all__ = ["plan_pb2", "encode_tensor", "encode_tensors", "decode_tensor", "encode_params", "decode_params",
           "pack_nodes", "unpack_nodes", "pack_loop", "unpack_loop"]
