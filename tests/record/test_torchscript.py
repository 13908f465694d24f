"""TorchScript models: R.model's sources (file, nn.Module, .pt2, URL with a size limit and sha256), the
torchscript_forward/torchscript_vjp ops against eager PyTorch, Pytorch_Model training against the same loop
in eager PyTorch, save_model's round trip, and (through the real engine) GPU routing."""
import copy
import gc
import hashlib
import http.server
import json
import os
import threading

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

from ravdl.v2 import Pytorch_Model
from ravdl.v2.optimizers import Adam, AdamW, RMSprop
import ravop as R
from ravop.core.errors import ShapeError
from ravop.store import background_upload
from ravop.record.graph import current_graph
from ravop.record.torchscript_import import BUNDLE_KIND, load_module
from ravop.runtime.evaluate import evaluate

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class DigitsNet(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        # No bias before BatchNorm: its gradient would be rounding noise, which Adam scales up to lr-sized
        # steps, so two correct runs with a different summation order would drift apart.
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x):
        x = TF.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        x = TF.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(self.drop(x.flatten(1)))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.out = nn.Linear(4, 7, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.emb(tokens)))


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 5)

    def forward(self, x, mask: torch.Tensor):
        y = self.proj(x) * mask
        return y, y.sum(1)


def batches(n_steps, seed=0, batch=16):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 8, 8, generator=generator), torch.randn(batch, 10, generator=generator))
            for _ in range(n_steps)]


def train_eager(net, optimizer, data, accumulate=1):
    """The loop Pytorch_Model records, in eager PyTorch: losses, then the final parameters and buffers."""
    losses = []
    for i, (x, y) in enumerate(data):
        loss = TF.mse_loss(net(x), y)
        loss.backward()
        losses.append(loss.detach())
        if (i + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
    return torch.stack(losses), [p.detach() for p in net.parameters()], [b for b in net.buffers()]


def record_training(model, data, accumulate=1):
    losses = []
    for i, (x, y) in enumerate(data):
        loss = R.square_loss(R.t(y), model._forward_pass(R.t(x)))
        model._backward_pass(loss, step=(i + 1) % accumulate == 0)
        losses.append(loss)
    return losses


OPTIMIZERS = [
    (lambda: Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    (lambda: AdamW(lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
    (lambda: RMSprop(lr=0.005, momentum=0.9, centered=True),
     lambda p: torch.optim.RMSprop(p, lr=0.005, momentum=0.9, centered=True, foreach=False)),
]


# ---------------------------------------------------------------------------------------------- training

@pytest.mark.parametrize("ours, theirs", OPTIMIZERS, ids=["adam", "adamw", "rmsprop"])
def test_training_equals_eager_pytorch(ours, theirs):
    torch.manual_seed(0)
    net = DigitsNet()
    R.Graph(name="ts-train")
    model = Pytorch_Model(model_op=R.model(net))
    model.initialize(ours())
    data = batches(10)
    losses = record_training(model, data)
    values = evaluate(losses + model.params + model.buffers + [model._forward_pass(R.t(data[0][0]), training=False)])
    *values, output = values
    losses, params, buffers = train_eager(net, theirs(net.parameters()), data)
    torch.testing.assert_close(torch.stack(values[:10]), losses, rtol=1e-5, atol=1e-5)
    for got, want in zip(values[10:], params + buffers):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert int(values[-1]) == 10   # BatchNorm's num_batches_tracked, carried as a graph value
    with torch.no_grad():
        torch.testing.assert_close(output, net.eval()(data[0][0]), rtol=1e-5, atol=1e-5)   # the eval output


def test_step_false_accumulates_like_torch():
    torch.manual_seed(1)
    net = DigitsNet()
    R.Graph(name="ts-accumulate")
    model = Pytorch_Model(R.model(net))
    model.initialize(Adam(lr=0.01))
    data = batches(6, seed=1)
    values = evaluate(record_training(model, data, accumulate=3) + model.params)
    losses, params, _ = train_eager(net, torch.optim.Adam(net.parameters(), lr=0.01), data,
                                    accumulate=3)
    torch.testing.assert_close(torch.stack(values[:6]), losses, rtol=1e-5, atol=1e-5)
    for got, want in zip(values[6:], params):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def assert_token_training_equals_eager(net, graph_name, tokens, targets, **ignore):
    """Three Adam steps on the cross entropy of `net(tokens)` against `targets`, recorded and eager: the
    same losses and the same trained embedding (`net` is a `Tied`)."""
    R.Graph(name=graph_name)
    model = Pytorch_Model(R.model(net))
    model.initialize(Adam(lr=0.05))
    losses = []
    for _ in range(3):
        loss = R.cross_entropy_loss(R.t(targets), model._forward_pass(R.t(tokens)), reshape_target=(-1, 7),
                                    reshape_label=(-1,), **ignore)
        model._backward_pass(loss)
        losses.append(loss)
    values = evaluate(losses + model.params)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
    for i in range(3):
        loss = TF.cross_entropy(net(tokens).view(-1, 7), targets.view(-1), **ignore)
        torch.testing.assert_close(values[i], loss.detach(), rtol=1e-5, atol=1e-6)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.testing.assert_close(values[3], net.emb.weight.detach(), rtol=1e-5, atol=1e-6)


def test_tied_parameters_train_as_one_value():
    torch.manual_seed(2)
    net = Tied()
    assert R.model(net).param_slots == (("emb.weight", "out.weight"),)
    tokens = torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(0))
    assert_token_training_equals_eager(net, "ts-tied", tokens, tokens)


def test_masked_cross_entropy_training_equals_eager():
    """The sorter's loss: targets of -1 (the prompt positions) are left out of the mean, as torch does."""
    torch.manual_seed(4)
    tokens = torch.randint(0, 7, (4, 6), generator=torch.Generator().manual_seed(1))
    targets = tokens.roll(-1, dims=1)
    targets[:, :3] = -1
    assert_token_training_equals_eager(Tied(), "ts-masked", tokens, targets, ignore_index=-1)


def test_frozen_parameters_are_not_trained():
    net = DigitsNet()
    net.conv1.weight.requires_grad_(False)
    R.Graph(name="ts-frozen")
    model = Pytorch_Model(R.model(net))
    model.initialize(Adam(lr=0.1))
    record_training(model, batches(2))
    first, second = evaluate(model.params[:2])
    torch.testing.assert_close(first, net.conv1.weight.detach(), rtol=0, atol=0)
    assert not torch.allclose(second, net.bn.weight.detach())   # the next parameter did train


# ---------------------------------------------------------------------------------------------- the ops

def test_vjp_of_keyword_and_tuple_outputs_equals_eager_autograd():
    torch.manual_seed(3)
    net = Masked()
    model_op = R.model(net)
    R.Graph(name="ts-kwargs")
    model = Pytorch_Model(model_op)
    x, mask = torch.randn(4, 3), (torch.randn(4, 5) > 0).float()
    x_op, mask_op = R.t(x), R.t(mask)
    y, s = model._forward_pass(x_op, mask=mask_op)
    c = torch.randn(4, 5)
    loss = R.sum(y * R.t(c)) + R.sum(s * s)
    values = evaluate([y, s, *R.grad(loss, [*model.params, x_op, mask_op])])

    xs, ms = x.clone().requires_grad_(), mask.clone().requires_grad_()
    ey, es = net(xs, mask=ms)
    eloss = (ey * c).sum() + (es * es).sum()
    expected = torch.autograd.grad(eloss, [*net.parameters(), xs, ms])
    torch.testing.assert_close(values[0], ey.detach())
    torch.testing.assert_close(values[1], es.detach())
    for got, want in zip(values[2:], expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_dropout_mask_of_forward_and_vjp_agree():
    """The VJP recomputes the forward: with the same seed it draws the same dropout mask, so its gradient is
    eager autograd's for the output the forward gave."""
    net = DigitsNet(dropout=0.5)
    R.Graph(name="ts-dropout")
    model = Pytorch_Model(R.model(net))
    x = torch.randn(4, 1, 8, 8)
    out = model._forward_pass(R.t(x))
    seed = out.inputs[0].params["seed"]
    grads = R.grad(R.sum(out * out), model.params)
    values = evaluate([out, *grads])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        eager = net(x)
    expected = torch.autograd.grad((eager * eager).sum(), list(net.parameters()))
    torch.testing.assert_close(values[0], eager.detach())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        assert not torch.allclose(net(x), eager), "another seed draws another mask: the agreement is not trivial"
    for got, want in zip(values[1:], expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_eval_mode_uses_running_stats_and_keeps_buffers():
    net = DigitsNet()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.5, 0.5)
    R.Graph(name="ts-eval")
    model = Pytorch_Model(R.model(net))
    out = model._forward_pass(R.t(torch.ones(2, 1, 8, 8)), training=False)
    assert [b.op for b in model.buffers] == ["const"] * 3   # still the initial values: eval mode updates nothing
    torch.testing.assert_close(evaluate(out), net.eval()(torch.ones(2, 1, 8, 8)).detach())


def test_wrong_input_shape_is_a_shape_error_at_record_time():
    R.Graph(name="ts-shape")
    model = Pytorch_Model(R.model(DigitsNet()))
    with pytest.raises(ShapeError, match=r"torchscript_forward: RuntimeError: Expected 3D .*"
                                         r"\(input shapes: \(2, 3\)\)"):
        model._forward_pass(R.t(torch.zeros(2, 3)))


class DataDependent(nn.Module):
    def forward(self, x):
        if bool(x.sum() > 0):   # meta tensors have no values: a large model's shape probe falls back to zeros
            return x * 2
        return x - 1


def test_data_dependent_control_flow_records_and_runs():
    R.Graph(name="ts-data-dependent")
    model = Pytorch_Model(R.model(DataDependent()))
    x = torch.tensor([1.0, 2.0])
    out = model._forward_pass(R.t(x))
    assert out.shape == (2,)
    torch.testing.assert_close(evaluate(out), x * 2)


class InPlace(nn.Module):
    def forward(self, x):
        x.add_(1.0)
        return x


def test_a_model_writing_into_its_input_is_refused_when_recorded():
    R.Graph(name="ts-inplace")
    model = Pytorch_Model(R.model(InPlace()))
    with pytest.raises(ShapeError, match="modified a parameter or an input in place"):
        model._forward_pass(R.t(torch.zeros(3)))


# ---------------------------------------------------------------------------------------------- save_model

def fetch_in_process(name):
    """What R.fetch_persisting_op(name) returns for a saved model, computed in this process."""
    graph = current_graph()
    kind, spec, names = graph.bundles[name]
    assert kind == BUNDLE_KIND
    values = evaluate([graph.persisted[n] for n in names.values()])
    return load_module(json.loads(json.dumps(spec)), dict(zip(names, values)))


def test_saved_module_reproduces_the_graph_prediction():
    torch.manual_seed(4)
    R.Graph(name="ts-save")
    model = Pytorch_Model(R.model(DigitsNet()))
    model.initialize(Adam(lr=0.01))
    record_training(model, batches(3, seed=4))
    x = torch.randn(5, 1, 8, 8)
    prediction = model._forward_pass(R.t(x), training=False)
    model.save_model("my_net")
    module = fetch_in_process("my_net")
    assert not isinstance(module, torch.jit.ScriptModule) and not module.training
    torch.testing.assert_close(module(x), evaluate(prediction), rtol=1e-6, atol=1e-6)
    assert [n for n, _ in module.named_parameters()] == list(model.model.param_names)
    own = DigitsNet().eval()
    own.load_state_dict(module.state_dict())  # the trained weights go back into the user's own class
    torch.testing.assert_close(own(x), module(x))


# ---------------------------------------------------------------------------------------------- R.model sources

def test_model_from_a_torchscript_file(tmp_path):
    net = DigitsNet()
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(net), str(path))
    model_op = R.model(str(path))
    assert model_op.param_names == tuple(n for n, _ in net.named_parameters())
    for got, want in zip(model_op.params + model_op.buffers, list(net.parameters()) + list(net.buffers())):
        torch.testing.assert_close(got, want.detach(), rtol=0, atol=0)
    assert model_op.blob.dtype == torch.uint8
    assert hashlib.sha256(model_op.blob.numpy().tobytes()).hexdigest() == model_op.model_hash
    # the blob is code only: the weights travel as graph tensors, not twice
    assert model_op.blob.numel() < path.stat().st_size
    # two models of one architecture share the blob, so a worker loads it once
    assert R.model(DigitsNet()).model_hash == model_op.model_hash


def test_model_from_a_module_leaves_it_untouched():
    net = DigitsNet()
    before = copy.deepcopy(net.state_dict())
    R.Graph(name="ts-untouched")
    model = Pytorch_Model(R.model(net))
    model.initialize(Adam(lr=0.1))
    evaluate(record_training(model, batches(1)) + model.params)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


def big_storages(at_least):
    """The data pointers of the tensor storages of at least `at_least` bytes that this process's objects reach."""
    gc.collect()
    return {t.untyped_storage().data_ptr() for t in gc.get_objects()
            if isinstance(t, torch.Tensor) and not t.is_meta and t.untyped_storage().nbytes() >= at_least}


def sealed_file_sizes():
    """The sizes of the sealed memory files (ravop.store.same_host) this process holds open."""
    sizes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:ravop-"):
                sizes.append(os.stat(f"/proc/self/fd/{fd}").st_size)
        except OSError:   # the listing's own descriptor, closed since
            continue
    return sizes


def test_the_requester_holds_a_big_parameter_once_r_model_and_the_upload_copy_nothing(engine, module_workers):
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(4096, 4096, bias=False), nn.Tanh())   # a 64 MiB weight
    weight, mib = net[0].weight, 2**20
    model = Pytorch_Model(R.model(net))
    assert model.model.params[0].untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    assert big_storages(32 * mib) == {weight.untyped_storage().data_ptr()}   # R.model copied nothing
    R.Graph(name="ts-one-copy")
    x = torch.randn(3, 4096)
    model._forward_pass(R.t(x), training=False).persist_op("y")
    R.activate()
    background_upload.finish(engine.token)   # its chunks are all in the server
    # Neither the graph's constants nor a sealed file of the upload (ravop.store.same_host) holds a second copy.
    assert big_storages(32 * mib) == {weight.untyped_storage().data_ptr()}
    assert max(sealed_file_sizes(), default=0) < 32 * mib
    R.execute()
    R.track_progress(timeout=120, progress_bar=False)
    torch.testing.assert_close(R.fetch_persisting_op("y"), net(x).detach(), rtol=1e-5, atol=1e-5)


def test_r_model_of_a_script_module_leaves_its_values_in_place():
    net = torch.jit.script(DigitsNet())
    before = net.state_dict(keep_vars=True)
    R.model(net)
    assert all(value is before[name] for name, value in net.state_dict(keep_vars=True).items())   # emptied only while saved


class Unscriptable(nn.Module):
    def forward(self, x):
        return x * len({"a": 1}.items().__class__.__name__)


def test_unscriptable_module_says_to_trace_it():
    with pytest.raises(TypeError, match="torch.jit.trace"):
        R.model(Unscriptable())


def test_pickles_and_other_files_are_refused(tmp_path):
    pickled = tmp_path / "state.pt"
    torch.save(DigitsNet().state_dict(), str(pickled))
    with pytest.raises(ValueError, match="pickle is refused"):
        R.model(str(pickled))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a model archive"):
        R.model(str(junk))
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        R.model(str(tmp_path / "missing.pt"))
    with pytest.raises(TypeError, match="file path"):
        R.model(42)


def test_model_from_a_torch_export_program(tmp_path):
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    batch = torch.export.Dim("batch")
    program = torch.export.export(net, (torch.randn(3, 4),), dynamic_shapes=({0: batch},))
    path = tmp_path / "net.pt2"
    torch.export.save(program, str(path))
    model_op = R.model(path)
    R.Graph(name="ts-export")
    x = torch.randn(6, 4)
    out = Pytorch_Model(model_op)._forward_pass(R.t(x), training=False)
    torch.testing.assert_close(evaluate(out), net(x).detach(), rtol=1e-6, atol=1e-6)


class WritesFiles(nn.Module):
    def forward(self, x, path: str):
        torch.save(x, path)
        return x


def test_models_that_touch_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="forward calls aten::save"):
        R.model(WritesFiles())
    # a worker checks the blob it is sent as well: a graph op naming a blob R.model never made
    from ravop.ops import torchscript
    script = torch.jit.script(WritesFiles())
    path = tmp_path / "evil.pt"
    torch.jit.save(script, str(path))
    blob = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="forward calls aten::save"):
        torchscript.torchscript_forward(blob, torch.zeros(2), model_hash=digest, param_slots=(), buffer_slots=(),
                                        n_args=1, kwarg_names=(), training=False, seed=0)


# ---------------------------------------------------------------------------------------------- URLs

@pytest.fixture
def model_server(tmp_path):
    """An http server on 127.0.0.1 serving /net.pt (with Content-Length), /stream.pt (without: the size limit
    must count what arrives) and /net.pt2, and 404 for anything else."""
    script = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(DigitsNet()), str(script))
    program = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(nn.Linear(2, 2), (torch.randn(1, 2),)), str(program))
    files = {"/net.pt": script.read_bytes(), "/stream.pt": script.read_bytes(), "/net.pt2": program.read_bytes()}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"   # without Content-Length, closing the connection ends the body

        def do_GET(self):
            data = files.get(self.path)
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            if self.path != "/stream.pt":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", files
    server.shutdown()
    server.server_close()


def test_model_from_a_url(model_server):
    url, files = model_server
    digest = hashlib.sha256(files["/net.pt"]).hexdigest()
    model_op = R.model(f"{url}/net.pt", sha256=digest)
    assert model_op.param_names[0] == "conv1.weight"
    assert R.model(f"{url}/stream.pt").model_hash == model_op.model_hash


def test_url_checks(model_server):
    url, files = model_server
    size = len(files["/net.pt"])
    with pytest.raises(ValueError, match="sha256 .* expected 00"):
        R.model(f"{url}/net.pt", sha256="00" * 32)
    with pytest.raises(ValueError, match=f"is {size} bytes, more than max_bytes=1000"):
        R.model(f"{url}/net.pt", max_bytes=1000)
    with pytest.raises(ValueError, match="more than max_bytes=1000 bytes"):
        R.model(f"{url}/stream.pt", max_bytes=1000)
    with pytest.raises(ConnectionError, match="404"):
        R.model(f"{url}/absent.pt")
    with pytest.raises(ValueError, match="not loaded from a URL"):
        R.model(f"{url}/net.pt2")


# ---------------------------------------------------------------------------------------------- the engine

# `engine` (a session on the test server) and `module_workers` (CPU worker processes) come from conftest.py.

def test_engine_training_equals_eager_and_the_fetched_module_reproduces_the_prediction(engine, module_workers):
    torch.manual_seed(5)
    net = DigitsNet()
    R.Graph(name="ts-engine")
    model = Pytorch_Model(model_op=R.model(net))
    model.initialize(Adam(lr=0.01))
    data = batches(10, seed=5)
    for i, loss in enumerate(record_training(model, data)):
        loss.persist_op(f"loss_{i}")
    for i, value in enumerate(model.params + model.buffers):
        value.persist_op(f"state_{i}")
    x = torch.randn(7, 1, 8, 8)
    model._forward_pass(R.t(x), training=False).persist_op("prediction")
    model.save_model("my_net")
    R.activate()
    R.execute()
    R.track_progress(timeout=120, progress_bar=False)

    losses, params, buffers = train_eager(net, torch.optim.Adam(net.parameters(), lr=0.01), data)
    got = torch.stack([R.fetch_persisting_op(f"loss_{i}") for i in range(10)])
    torch.testing.assert_close(got, losses, rtol=1e-5, atol=1e-5)
    for i, want in enumerate(params + buffers):
        torch.testing.assert_close(R.fetch_persisting_op(f"state_{i}"), want, rtol=1e-5, atol=1e-5)
    my_net = R.fetch_persisting_op("my_net")
    assert isinstance(my_net, torch.nn.Module) and not isinstance(my_net, torch.jit.ScriptModule)
    with torch.no_grad():
        torch.testing.assert_close(my_net(x), R.fetch_persisting_op("prediction"), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(my_net(x), net.eval()(x), rtol=1e-5, atol=1e-5)


def test_cpu_workers_leave_gpu_work_alone(engine, module_workers, capsys):
    from ravop import store
    from ravop.core.errors import NotComputedError
    client, gpu_queue = engine.client, store.queue("cuda")
    R.Graph(name="ts-gpu", gpu_required="yes")
    # 600 x 10 outputs: too large for the compiler to fold the forward into a constant on the requester
    out = Pytorch_Model(R.model(DigitsNet()))._forward_pass(R.t(torch.ones(600, 1, 8, 8)), training=False)
    out.persist_op("gpu_out")
    R.activate()
    queued = client.xlen(gpu_queue)
    R.execute()
    with pytest.raises(TimeoutError, match="no GPU worker is running"):
        R.track_progress(timeout=1.5)
    assert "waiting for a GPU worker" in capsys.readouterr().err
    # the work is queued on the GPU stream and unclaimed: the CPU workers did not read it
    assert client.xlen(gpu_queue) > queued
    assert client.xpending(gpu_queue, store.GROUP)["pending"] == 0
    with pytest.raises(NotComputedError, match="0 of"):
        R.fetch_persisting_op("gpu_out")


def test_digits_example_fetched_module_matches_the_persisted_prediction():
    import re
    from example_runs import run_example
    stdout = run_example("digits_torchscript.py", 2)
    persisted = re.search(r"^test accuracy: ([0-9.]+)$", stdout, re.MULTILINE)
    fetched = re.search(r"^saved model's test accuracy: ([0-9.]+)$", stdout, re.MULTILINE)
    assert persisted and fetched, stdout[-2000:]
    assert fetched.group(1) == persisted.group(1)
    assert float(persisted.group(1)) > 0.5   # 2 epochs learn something; the full run: docs/users/examples.md
