"""PyTorch deprecates TorchScript (torch.jit). The warnings a user sees come only from what they asked for:
none for an nn.Module trained with Pytorch_Model and fetched as a plain nn.Module (tied weights included),
one (at their own line) for a TorchScript file or ScriptModule they pass in, which still loads."""
import io
import json
import warnings

import pytest
import torch

from ravdl.v2 import Pytorch_Model
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.record.graph import current_graph
from ravop.record.torchscript_import import load_module
from ravop.runtime.evaluate import evaluate

from test_torchscript import DigitsNet, Tied, batches, record_training


def fetch_in_process(name):
    graph = current_graph()
    _, spec, names = graph.bundles[name]
    values = evaluate([graph.persisted[n] for n in names.values()])
    return load_module(json.loads(json.dumps(spec)), dict(zip(names, values)))


def test_training_an_nn_module_and_fetching_it_warns_nothing():
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning, deprecation or other, fails the test
        R.Graph(name="no-warnings")
        model = Pytorch_Model(R.model(DigitsNet()))
        model.initialize(Adam(lr=0.01))
        record_training(model, batches(2))
        x = torch.randn(3, 1, 8, 8)
        prediction = model._forward_pass(R.t(x), training=False)
        model.save_model("net")
        fetched = fetch_in_process("net")
        with torch.no_grad():
            torch.testing.assert_close(fetched(x), evaluate(prediction), rtol=1e-6, atol=1e-6)
    assert type(fetched).__module__ == "ravop.client.saved_model"


def test_fetched_model_keeps_tied_weights_and_follows_its_state_dict():
    torch.manual_seed(2)
    R.Graph(name="tied")
    net = Tied()
    model = Pytorch_Model(R.model(net))
    model.save_model("tied")
    fetched = fetch_in_process("tied")
    assert fetched.emb.weight is fetched.out.weight
    assert set(fetched.state_dict()) == set(net.state_dict())
    tokens = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(fetched(tokens), net(tokens))
    fetched.load_state_dict({k: torch.zeros_like(v) for k, v in net.state_dict().items()})
    assert torch.count_nonzero(fetched(tokens)) == 0  # the code runs on the module's current tensors


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")  # the test's own torch.jit calls
def test_a_torchscript_file_loads_with_one_warning_at_the_users_line():
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(DigitsNet()), buffer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        R.Graph(name="ts-file")
        model = R.model(buffer.getvalue())
    assert [(w.category, w.filename) for w in caught] == [(DeprecationWarning, __file__)]
    assert "R.model(module)" in str(caught[0].message)
    assert len(model.params) == len(list(DigitsNet().parameters()))
