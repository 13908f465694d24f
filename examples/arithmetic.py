"""The main example: add two tensors on a worker and fetch the result.

With no Redis URL (argument or RAVOP_REDIS_URL), R.initialize() starts an embedded Valkey server and
local workers; with one, the same script runs against a cluster of `ravop-worker` processes.
"""
import ravop as R

R.initialize()
R.flush()
R.Graph(name="demo", algorithm="addition", approach="distributed")

a = R.t([1, 2, 3])
b = R.t([4, 5, 6])
c = a + b
c.persist_op(name="c_output")

print(R.activate())
R.execute()
R.track_progress()
print("c_output:", R.fetch_persisting_op(op_name="c_output"))
