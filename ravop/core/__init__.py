"""The vocabulary every side shares: the op registry, `Node`, dtypes, sizes, errors, the names of graph
states and persisted losses, a loop as plain data (`loop_template`), spot-check knobs, plan limits."""
