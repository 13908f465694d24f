"""The digits CNN as a TorchScript file trained through `Pytorch_Model`, written as the original's
requester script was (`R.model('test_model.pt')`, float32 batches, one-hot targets with square loss,
`_backward_pass(loss, step=True)`, `save_model(name='my_net')`, the fetched module evaluated), run unchanged
on this engine. Compare examples/digits_torchscript.py.

    python examples/original_cnn_torchscript.py [epochs] [dir]   (or RAVDL_EPOCHS; default 15; the .pt in dir,
    else $RAVOP_EXAMPLES_OUTPUT, else examples/output/)
"""
import os

import numpy as np
import ravop as R
import torch
from ravdl.v2 import Pytorch_Model
from ravdl.v2.optimizers import Adam
from ravdl.v2.utils.data_manipulation import batch_iterator

from digits_torchscript import DigitsCNN
from example_data import digits_data, epochs_from_command_line, output_dir

model_path = os.path.join(output_dir(), "test_model.pt")
torch.manual_seed(0)
torch.jit.save(torch.jit.script(DigitsCNN()), model_path)   # what the original's generate script made

R.initialize(ravenverse_token=os.environ.get("TOKEN"))
R.flush()
R.Graph(name='test_pytorch_model', algorithm='pytorch_model', approach='distributed')

X, X_test, y, y_test = digits_data()
y, y_test = np.eye(10)[y], np.eye(10)[y_test]

model_op = R.model(model_path)
optimizer = Adam()

model = Pytorch_Model(model_op=model_op)
model.initialize(optimizer)

epochs = epochs_from_command_line(15)

for i in range(epochs):
    for X_batch, y_batch in batch_iterator(X, y, batch_size=64):
        X_t = R.t(X_batch.astype(np.float32))
        y_t = R.t(y_batch.astype(np.float32))

        out = model._forward_pass(X_t)
        loss = R.square_loss(y_t, out)

        # Set step = True whenever optimizer step needs to be called after backprop (defaults to True).
        model._backward_pass(loss, step=True)

model.save_model(name='my_net')

test_input = R.t(X_test.astype(np.float32))

output = model._forward_pass(test_input, training=False)
output.persist_op("output")
R.activate()
R.execute()
R.track_progress()

prediction = R.fetch_persisting_op(op_name="output")
y_pred = np.argmax(prediction.detach().numpy(), axis=-1)
y_test = np.argmax(y_test, axis=-1)

accuracy = np.sum(y_pred == y_test, axis=0) / len(y_test)
print(f"test accuracy: {accuracy:.3f}")

my_net = R.fetch_persisting_op(op_name="my_net")
my_net.eval()
out = my_net(torch.tensor(X_test.astype(np.float32)))
y_pred = np.argmax(out.detach().numpy(), axis=-1)
accuracy = np.sum(y_pred == y_test, axis=0) / len(y_test)
print(f"accuracy of loaded model: {accuracy:.3f}")
