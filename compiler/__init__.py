"""Compiler: recorded graph -> plan of subgraphs. Pure functions of the graph: no I/O.

    from compiler import compile_graph
    compiled = compile_graph(graph)   # .plan (protobuf), .constants (id -> tensor), .summary (dict)
"""
from .compile import CompiledGraph, compile_graph, folded_loops
from .pass_manager import InvariantError

__all__ = ["compile_graph", "folded_loops", "CompiledGraph", "InvariantError"]
