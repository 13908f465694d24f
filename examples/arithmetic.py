"""The main example: record a few ops, run them, fetch the results.

With no Redis URL (argument or RAVOP_REDIS_URL), R.initialize() starts an embedded Valkey server and
local workers; with one, the same script runs against a cluster of `ravop-worker` processes.
"""
import ravop as R

R.initialize()
R.flush()
R.Graph(name="demo", algorithm="addition", approach="distributed", seed=0)

a = R.t([1, 2, 3])
b = R.t([4, 5, 6])
c = a + b                      # this small sum is folded into a constant at compile time
c.persist_op(name="c_output")

x = R.random_uniform(-1.0, 1.0, size=(500, 500))
gram = (x @ x.transpose()).mean()    # this one is too big to fold: a worker computes it
gram.persist_op(name="gram_mean")

print(R.activate())
R.execute()
R.track_progress()
print("c_output:", R.fetch_persisting_op(op_name="c_output"))
print("gram_mean:", R.fetch_persisting_op(op_name="gram_mean"))
