"""One tiny training run through the whole pipeline, in this process: record -> compile -> run -> losses.

    PYTHONPATH=. python docs/walkthrough.py

A script never talks to a worker while it records: every `R.<op>`, every layer and `fit` only add nodes to a
graph (ravop/record/). `R.activate()` hands that graph to the compiler (compiler/), which returns a plan of
subgraphs (ravop/wire/plan.proto); workers run the plan's subgraphs with the one runner (ravop/runtime/). Here
the compiled plan is printed, and the same graph is run in process by `ravop.runtime.evaluate`, the reference the
tests compare workers with: no Redis, no worker, the same kernels and the same bits.
"""
import numpy as np

import ravop as R
from compiler import compile_graph
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.runtime.evaluate import evaluate_persisted
from ravop.wire.persisted import persisted_ids

# 1. Record. No session is needed to record: a Graph collects the ops; its seed fixes every random draw
#    (initial weights, shuffling, dropout), so any worker, or this process, computes the same bits.
graph = R.Graph(name="walkthrough", seed=0)
rng = np.random.default_rng(0)
X = rng.normal(size=(64, 4)).astype(np.float32)
y = np.eye(2, dtype=np.float32)[(X[:, 0] + X[:, 1] > 0).astype(int)]      # one-hot: is x0 + x1 positive?

model = NeuralNetwork(optimizer=Adam(lr=0.05), loss="CrossEntropy")
model.add(Dense(8, input_shape=(4,)))
model.add(Activation("relu"))
model.add(Dense(2))
model.add(Activation("softmax"))
# `fit` records ONE training step (forward, the loss, `R.grad`'s backward ops, Adam's update) with holes for the
# carried values (weights, Adam's moments) and the batch, plus a schedule: 4 epochs of 4 batches. It returns the
# names under which the step persists each batch's loss (`training_loss_epoch_{e}_batch_{b}`).
loss_names = list(model.fit(X, y, n_epochs=4, batch_size=16, shuffle=True))
print(f"recorded {len(graph.nodes)} ops; {len(loss_names)} losses will be persisted")

# 2. Compile: passes (dead code, common subexpressions, constant folding), a cost model (FLOPs, bytes) and the
#    partition into subgraphs. The training step is one `loop` op: its template ships once, whatever the epochs.
compiled = compile_graph(graph)
print("summary:", {k: compiled.summary[k] for k in ("recorded_ops", "compiled_ops", "subgraphs", "loop_steps")})
for sub in compiled.plan.subgraphs:
    # A loop's losses are not outputs: the loop writes them itself as it goes, so they can be read while it trains.
    # Its outputs (`tuple_get`s of the `loop` op) are the carried values at the end, which fit persists so that a
    # later graph starts from them (ravdl/v2/trained_values.py).
    print(f"subgraph {sub.id}: {len(sub.nodes.id)} ops {list(sub.nodes.op)[:6]}, reads {len(sub.inputs)} values,"
          f" writes {len(sub.outputs)}, waits for {sub.n_predecessors}")
    for template in sub.loop.templates:    # a loop's step: the ops a worker builds once and runs n_steps times
        ops = list(template.nodes.op)
        print(f"  loop template: {len(ops)} ops, e.g. {ops[:4]} ... {ops[-3:]}; {sub.loop.n_steps} steps")
# The losses' names are rules in the plan (`persist_rules`: a template, its epochs and batches, the id of its first
# value), not one entry each: a fit of 10**6 epochs ships the same plan. persisted_ids names them all.
print("persist rules:", [(rule.template, rule.epochs, rule.batches) for rule in compiled.plan.persist_rules])
losses_first = sorted(persisted_ids(compiled.plan), key=lambda name: (name.startswith("trained"), name))
print("persisted names (first 3):", losses_first[:3])

# 3. Run in process. A worker would claim each subgraph from Redis, fetch its inputs, run it with
#    `ravop.runtime.runner.Runner` (a loop through `ravop.runtime.loop_run`) and store the outputs;
#    evaluate_persisted runs the same runner over the recorded graph here and returns what a worker would store
#    under each persisted name.
values = evaluate_persisted(graph, loss_names)

# 4. The losses, as `History` would read them back after `R.track_progress()` on a real cluster.
losses = [float(values[name]) for name in loss_names]
print("losses:", " ".join(f"{loss:.4f}" for loss in losses))
print(f"first epoch mean {np.mean(losses[:4]):.4f} -> last epoch mean {np.mean(losses[-4:]):.4f}")
