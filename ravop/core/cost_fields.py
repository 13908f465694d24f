"""The cost model's figures a worker measures at start (worker/serve/calibrate.py), advertises with its heartbeat
(`ravop.store.worker_info`) and the compiler reads (`compiler.cost.calibrated`): seconds per op, matmul FLOP/s,
memory bytes/s, bytes/s of a tensor handed through Redis. Their one home, apart from the store, so that the
compiler reads them without importing Redis."""
COST_FIELDS = ("op_s", "flops_per_s", "bytes_per_s", "handoff_bytes_per_s")
