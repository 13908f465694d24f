"""Executing one checked subgraph: validation of a plan from the network, the device and memory budget,
the tensor cache, and the run itself."""
