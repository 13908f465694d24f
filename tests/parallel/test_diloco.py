"""R.parallel.DiLoCo against an eager PyTorch implementation of the same algorithm written here (inner Adam per
replica on its shard, torch.optim.SGD as the outer optimizer over the averaged pseudo-gradient, fp16/int8
compression with error feedback, the one-round-delayed outer step of overlap=True), in-process
(ravop.runtime.evaluate) and on a real server with worker processes; and int8 compression's accuracy on a real task."""
import copy

import numpy as np
import pytest
import torch

import ravop as R
from ravop.parallel.compression import check_compression, send
from ravop.runtime.evaluate import evaluate_persisted
from test_parallel_engine import assert_same_as_in_process, run_on_both
from test_parallel_math import LR, X, Y, batches_of, ravdl_net, torch_net

PARAM_NAMES = ["Dense_1.weight", "Dense_1.bias", "Dense_2.weight", "Dense_2.bias"]


def eager_send(x, residual, kind):
    """compression.send in eager torch: (received, residual)."""
    true = x if residual is None else x + residual
    if kind == "fp16":
        received = true.clamp(-65504.0, 65504.0).half().float()
    else:
        scale = true.abs().max() * (1.0 / 127.0)
        scale = scale + (scale == 0).float()
        received = torch.clamp(torch.round(true / scale), -127, 127).to(torch.int8).float() * scale
    return received, true - received


def updates_of(n_rows, batch_size, n_epochs, shuffle, seed, update_frequency):
    """Per optimizer update, the row indices of its batches: `update_frequency` consecutive batches of an epoch
    (its last update takes those left)."""
    batches = list(batches_of(n_rows, batch_size, n_epochs, shuffle, seed))
    per_epoch = len(batches) // n_epochs
    return [batches[e * per_epoch:(e + 1) * per_epoch][first:first + update_frequency]
            for e in range(n_epochs) for first in range(0, per_epoch, update_frequency)]


def accumulated_step(net, opt, batches):
    """One optimizer step on the summed gradients of `batches` ((X, y) pairs), as torch sums .grad; the losses."""
    opt.zero_grad()
    losses = []
    for X_batch, y_batch in batches:
        loss = torch.nn.functional.mse_loss(net(X_batch), y_batch)
        loss.backward()
        losses.append(loss.detach())
    opt.step()
    return losses


def diloco_reference(replicas, inner_steps, n_epochs, batch_size, shuffle, seed, outer_lr, outer_momentum, nesterov,
                     compression=None, overlap=False, make_net=torch_net, update_frequency=1, overlap_start="global",
                     steps=None):
    """(per-replica losses, global parameters after fit, its eval-mode prediction on X) of DiLoCo in eager
    PyTorch; float buffers (BatchNorm statistics) are averaged at every outer step; with `update_frequency` an
    inner step sums the gradients of that many batches. `steps`: each replica's inner steps per round (a round
    of `Shares`): shards in proportion, and means weighted by them."""
    net = make_net()
    nets = [copy.deepcopy(net) for _ in range(replicas)]
    opts = [torch.optim.Adam(n.parameters(), lr=LR) for n in nets]
    glob = copy.deepcopy(net)
    outer = torch.optim.SGD(glob.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)
    start = [p.detach().clone() for p in glob.parameters()]
    starts = [start] * replicas   # each replica's round start (overlap_start='local': its own)
    up = [[None] * len(start) for _ in range(replicas)]
    down = [None] * len(start)
    steps = steps or [inner_steps] * replicas
    bounds = np.cumsum([0] + [len(X) * s // sum(steps) for s in steps])
    shards = [(torch.as_tensor(X[a:b]), torch.as_tensor(Y[a:b])) for a, b in zip(bounds, bounds[1:])]
    plans = [updates_of(b - a, batch_size, n_epochs, shuffle, seed + r, update_frequency)
             for r, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    weights = torch.tensor([s / sum(steps) for s in steps]).reshape(-1, 1)

    def mean(values):
        stacked = torch.stack(values)
        return (stacked * weights.reshape(-1, *[1] * values[0].dim())).sum(0) if len(set(steps)) > 1 \
            else stacked.mean(0)

    losses = [[] for _ in range(replicas)]
    for j in range(-(-len(plans[0]) // steps[0])):
        for r, (Xs, ys) in enumerate(shards):
            for k in range(j * steps[r], min((j + 1) * steps[r], len(plans[r]))):
                losses[r] += accumulated_step(nets[r], opts[r], [(Xs[rows], ys[rows]) for rows in plans[r][k]])
        before = [p.detach().clone() for p in glob.parameters()]
        own = [[] for _ in range(replicas)]   # each replica's pseudo-gradients as received
        for i, p in enumerate(glob.parameters()):
            pseudo = [starts[r][i] - list(m.parameters())[i].detach() for r, m in enumerate(nets)]
            if compression:
                for r in range(replicas):
                    pseudo[r], up[r][i] = eager_send(pseudo[r], up[r][i], compression)
            for r in range(replicas):
                own[r].append(pseudo[r])
            p.grad = mean(pseudo)
        outer.step()
        if compression:
            with torch.no_grad():
                for i, p in enumerate(glob.parameters()):
                    received, down[i] = eager_send(p - before[i], down[i], compression)
                    p.copy_(before[i] + received)
        buffers_before = [b.clone() for b in glob.buffers()]
        for b, *replica_buffers in zip(glob.buffers(), *(m.buffers() for m in nets)):
            # counters (num_batches_tracked) advance alike in every replica: the first one's
            b.copy_(mean(list(replica_buffers)) if b.is_floating_point() else replica_buffers[0])
        start = before if overlap else [p.detach().clone() for p in glob.parameters()]
        start_buffers = buffers_before if overlap else [b.clone() for b in glob.buffers()]
        starts = [[s - g for s, g in zip(start, own[r])] for r in range(replicas)] if overlap_start == "local" \
            else [start] * replicas
        with torch.no_grad():
            for m, replica_start in zip(nets, starts):
                for p, s in zip([*m.parameters(), *m.buffers()], replica_start + start_buffers):
                    if p.is_floating_point():
                        p.copy_(s)
    return losses, [p.detach() for p in glob.parameters()], glob.eval()(torch.as_tensor(X)).detach()


def fit_diloco(strategy, n_epochs, batch_size, shuffle=True, seed=3):
    """(losses by name, persisted weights by name, prediction) of a DiLoCo fit, in-process."""
    graph = R.Graph(name="diloco", seed=11)
    model = ravdl_net(torch_net())
    names = list(model.fit(X, Y, n_epochs=n_epochs, batch_size=batch_size, shuffle=shuffle, seed=seed,
                           strategy=strategy))
    model.persist_weights()
    model.predict(X).persist_op("prediction")
    values = evaluate_persisted(graph)
    return {name: values[name] for name in names}, values, values["prediction"]


def assert_matches_reference(strategy, n_epochs=2, batch_size=5, atol=1e-5):
    got, values, prediction = fit_diloco(strategy, n_epochs, batch_size)
    losses, params, want_prediction = diloco_reference(
        strategy.replicas, strategy.inner_steps, n_epochs, batch_size, True, 3, strategy.outer_lr,
        strategy.outer_momentum, strategy.nesterov, strategy.compression, strategy.overlap,
        update_frequency=strategy.update_frequency, overlap_start=strategy.overlap_start)
    per_epoch = len(losses[0]) // n_epochs
    replicas = strategy.replicas
    for r in range(replicas):
        for k, loss in enumerate(losses[r]):
            e, b = divmod(k, per_epoch)
            assert torch.allclose(got[f"training_loss_epoch_{e + 1}_batch_{b * replicas + r + 1}"], loss, atol=atol)
    for name, want in zip(PARAM_NAMES, params):
        assert values[name].shape == want.shape
        assert (values[name] - want).abs().max() <= atol, name
    assert torch.allclose(prediction, want_prediction, atol=atol)
    return params


@pytest.mark.parametrize("nesterov, momentum", [(True, 0.9), (False, 0.9), (False, 0.0)])
def test_diloco_equals_eager_pytorch_with_torch_sgd_as_outer_optimizer(nesterov, momentum):
    # shards of 24 rows in batches of 5 (4 of 5, one of 4): 10 steps, rounds of 3, 3, 3 and 1
    params = assert_matches_reference(R.parallel.DiLoCo(replicas=2, inner_steps=3, outer_lr=0.7,
                                                        outer_momentum=momentum, nesterov=nesterov))
    initial = [p.detach() for p in torch_net().parameters()]
    assert all((p - q).abs().max() > 1e-3 for p, q in zip(params, initial))   # it trained


def test_diloco_of_three_replicas_and_uneven_rounds():
    assert_matches_reference(R.parallel.DiLoCo(replicas=3, inner_steps=4, outer_lr=0.5), n_epochs=3, batch_size=4)


def test_outer_lr_one_without_momentum_is_local_sgd_averaging():
    diloco, _, diloco_prediction = fit_diloco(R.parallel.DiLoCo(2, 3, outer_lr=1.0, outer_momentum=0.0,
                                                                nesterov=False), 2, 5)
    local, _, local_prediction = fit_diloco(R.parallel.LocalSGD(2, 3), 2, 5)
    assert diloco.keys() == local.keys()
    for name in local:
        assert torch.allclose(diloco[name], local[name], atol=1e-6)
    assert torch.allclose(diloco_prediction, local_prediction, atol=1e-6)


@pytest.mark.parametrize("compression", ["fp16", "int8"])
def test_compressed_pseudo_gradients_with_error_feedback_equal_eager_pytorch(compression):
    assert_matches_reference(R.parallel.DiLoCo(2, 3, compression=compression))


def test_overlap_applies_each_outer_step_one_round_late_as_the_eager_reference():
    strategy = R.parallel.DiLoCo(2, 2, overlap=True)
    params = assert_matches_reference(strategy)
    _, plain, _ = diloco_reference(2, 2, 2, 5, True, 3, 0.7, 0.9, True)
    assert any((p - q).abs().max() > 1e-4 for p, q in zip(params, plain))   # the delay changes the result
    assert_matches_reference(R.parallel.DiLoCo(2, 3, compression="int8", overlap=True))


@pytest.mark.parametrize("compression", [None, "int8"])
def test_overlap_with_local_starts_restarts_each_replica_from_its_own_progress_as_the_eager_reference(compression):
    params = assert_matches_reference(R.parallel.DiLoCo(3, 2, compression=compression, overlap=True,
                                                        overlap_start="local"))
    _, stale, _ = diloco_reference(3, 2, 2, 5, True, 3, 0.7, 0.9, True, compression, True)
    assert any((p - q).abs().max() > 1e-4 for p, q in zip(params, stale))   # not the stale global start


def test_overlapped_rounds_do_not_wait_for_the_outer_step():
    """With overlap, round k+1's segments read the global model from before outer step k, so the graph lets a
    worker run them while another runs the outer step."""
    def segment_inputs(overlap):
        graph = R.Graph(name="overlap", seed=1)
        ravdl_net(torch_net()).fit(X, Y, 1, 4, strategy=R.parallel.DiLoCo(2, 2, overlap=overlap, resident=False))
        loops = [node for node in graph.nodes if node.op == "loop"]
        return graph, loops

    for overlap in (False, True):
        graph, loops = segment_inputs(overlap)
        ancestors = _ancestors(graph, loops[4])   # round 2's first replica
        assert (loops[0].id in ancestors) and (loops[2].id in ancestors)
        # round 1's segments feed outer step 1, whose result round 2 reads only without overlap
        assert all(loop.id in ancestors for loop in loops[2:4]) is not overlap


def _ancestors(graph, node):
    by_id = {n.id: n for n in graph.nodes}
    seen, todo = set(), [node]
    while todo:
        for op in todo.pop().inputs:
            if op.id not in seen:
                seen.add(op.id)
                todo.append(by_id[op.id])
    return seen


def test_update_frequency_sums_the_gradients_of_that_many_batches_per_inner_step():
    # shards of 24 rows in batches of 5: per epoch updates of batches (1, 2), (3, 4), (5); rounds of 2 updates
    assert_matches_reference(R.parallel.DiLoCo(2, 2, update_frequency=2))
    assert_matches_reference(R.parallel.DiLoCo(2, 1, update_frequency=3), n_epochs=1, batch_size=4)


def test_local_sgd_with_update_frequency_averages_every_sync_every_updates():
    got, values, prediction = fit_diloco(R.parallel.LocalSGD(2, 2, update_frequency=2), 2, 5)
    losses, params, want_prediction = diloco_reference(2, 2, 2, 5, True, 3, 1.0, 0.0, False, update_frequency=2)
    assert len(got) == 2 * len(losses[0])
    per_epoch = len(losses[0]) // 2
    for r in range(2):
        for k, loss in enumerate(losses[r]):
            e, b = divmod(k, per_epoch)
            assert torch.allclose(got[f"training_loss_epoch_{e + 1}_batch_{b * 2 + r + 1}"], loss, atol=1e-6)
    assert torch.allclose(prediction, want_prediction, atol=1e-6)
    assert "update_frequency=2" in repr(R.parallel.LocalSGD(2, 2, update_frequency=2))


def test_error_feedback_loses_nothing_over_rounds():
    """What the receiver got over rounds plus the last residual is exactly what was sent, in ravop and eager."""
    rng = torch.Generator().manual_seed(0)
    xs = [torch.randn(6, 5, generator=rng) * 10 ** k for k in (-3, 0, 2, -1)]
    for kind in ("fp16", "int8"):
        R.Graph(name=f"feedback {kind}")
        residual, want_residual, wants = None, None, []
        for k, x in enumerate(xs):
            received, residual = send(R.t(x), residual, kind)
            received.persist_op(f"received {k}")
            want, want_residual = eager_send(x, want_residual, kind)
            wants.append(want)
        residual.persist_op("residual")
        values = evaluate_persisted(R.current_graph())
        for k, want in enumerate(wants):
            assert torch.equal(values[f"received {k}"], want), (kind, k)
        assert torch.equal(values["residual"], want_residual)
        total = sum(wants)
        assert torch.allclose(total + want_residual, sum(xs), rtol=1e-5, atol=1e-6)
    R.Graph(name="int8 zeros")
    received, residual = send(R.t(torch.zeros(3)), None, "int8")
    received.persist_op("zeros")
    assert torch.equal(evaluate_persisted(R.current_graph())["zeros"], torch.zeros(3))


def test_int8_values_are_int8_with_one_scale():
    from ravop.parallel.compression import compress
    R.Graph(name="int8")
    values, scale = compress(R.t(torch.tensor([-2.0, 0.5, 1.0])), "int8")
    assert values.dtype == torch.int8 and tuple(scale.shape) == ()
    values.persist_op("q")
    assert evaluate_persisted(R.current_graph())["q"].tolist() == [-127, 32, 64]


def test_bad_knobs_are_refused_by_name():
    with pytest.raises(ValueError, match="inner_steps"):
        R.parallel.DiLoCo(2, 0)
    with pytest.raises(ValueError, match="outer_momentum"):
        R.parallel.DiLoCo(2, 4, outer_momentum=1.0)
    with pytest.raises(ValueError, match="nesterov=True needs outer_momentum"):
        R.parallel.DiLoCo(2, 4, outer_momentum=0.0)
    with pytest.raises(ValueError, match="compression must be"):
        R.parallel.DiLoCo(2, 4, compression="int4")
    with pytest.raises(TypeError, match="overlap"):
        R.parallel.DiLoCo(2, 4, overlap="yes")
    with pytest.raises(ValueError, match="update_frequency"):
        R.parallel.DiLoCo(2, 4, update_frequency=0)
    with pytest.raises(ValueError, match="overlap_start"):
        R.parallel.DiLoCo(2, 4, overlap=True, overlap_start="fresh")
    with pytest.raises(ValueError, match="needs overlap=True"):
        R.parallel.DiLoCo(2, 4, overlap_start="local")
    assert "overlap_start='local'" in repr(R.parallel.DiLoCo(2, 4, overlap=True, overlap_start="local"))
    with pytest.raises(TypeError):
        R.parallel.DiLoCo(2, 4, lr_scheduler="cosine")   # not a knob DiLoCo has
    assert check_compression(True) == "fp16" and check_compression(False) is None
    assert "compression='int8'" in repr(R.parallel.DiLoCo(2, 4, compression="int8"))


def test_diloco_on_two_workers_gives_the_in_process_bits_and_saves_the_global_model(engine, workers, client):
    names = workers.start(2)
    graph = R.Graph(name="diloco engine", seed=11)
    model = ravdl_net(torch_net())
    strategy = R.parallel.DiLoCo(replicas=2, inner_steps=3, compression="int8", overlap=True)
    persisted = list(model.fit(X, Y, n_epochs=2, batch_size=5, shuffle=True, seed=3, strategy=strategy))
    model.predict(X).persist_op("prediction")
    model.save_model("trained")
    summary = R.activate()
    assert set(summary["placement"][repr(strategy)].values()) == set(names)
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted + ["prediction"])
    _, params, want_prediction = diloco_reference(2, 3, 2, 5, True, 3, 0.7, 0.9, True, "int8", True)
    assert torch.allclose(R.fetch_persisting_op("prediction"), want_prediction, atol=1e-5)
    module = R.fetch_persisting_op("trained")
    state = module.state_dict()
    for name, want in zip(PARAM_NAMES, params):
        assert torch.allclose(state[name], want, atol=1e-5), name


def digits_accuracy(compression):
    """Test accuracy of an MLP 64-32-10 trained on sklearn's digits by DiLoCo(4 replicas), in-process."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from ravdl.v2 import NeuralNetwork
    from ravdl.v2.layers import Activation, Dense
    from ravdl.v2.optimizers import Adam

    data, labels = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split((data / 16.0).astype(np.float32), labels, test_size=0.4,
                                                        random_state=0, stratify=labels)
    X_train, y_train = X_train[:1076], y_train[:1076]   # 4 shards of 269 rows
    graph = R.Graph(name=f"digits {compression}", seed=5)
    model = NeuralNetwork(Adam(lr=0.01), loss="CrossEntropy")
    for layer in (Dense(32, input_shape=(64,)), Activation("relu"), Dense(10)):
        model.add(layer)
    model.fit(X_train, np.eye(10, dtype=np.float32)[y_train], n_epochs=10, batch_size=32, shuffle=True,
              strategy=R.parallel.DiLoCo(replicas=4, inner_steps=8, compression=compression))
    model.predict(X_test).persist_op("scores")
    scores = evaluate_persisted(graph)["scores"]
    return float((scores.argmax(1).numpy() == y_test).mean())


def test_int8_compression_trains_digits_within_one_point_of_fp32():
    fp32, int8 = digits_accuracy(None), digits_accuracy("int8")
    assert fp32 > 0.93, fp32
    assert abs(int8 - fp32) <= 0.01, (fp32, int8)
