"""Executing one checked subgraph: validation of a plan from the network, the device and memory budget, the
tensor cache, the machine's calibration figures kept between starts, and the run itself."""
