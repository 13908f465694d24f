"""The iris ANN as the original's sequential requester script: `fit(..., save_model=True,
persist_weights=True)`, `predict`, the model pickled (`pickle.dump(model, ...)`), the prediction fetched as
`['result']`, then `get_onnx_model` on the unpickled model, as the original's ANN_get_onnx script did in a
later process. Run unchanged on this engine; compare examples/iris_sequential.py.

    python examples/original_ann_sequential.py [epochs] [dir]   (or RAVDL_EPOCHS; default 100; files in dir, else
    $RAVOP_EXAMPLES_OUTPUT, else examples/output/)
"""
import os
import pickle

import numpy as np
import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, BatchNormalization1D, Dense, Dropout
from ravdl.v2.optimizers import Adam

from example_data import epochs_from_command_line, iris_data, output_dir

out_dir = output_dir()

R.initialize(ravenverse_token=os.environ.get("TOKEN"))
R.flush()
R.Graph(name='ann', algorithm='neural_network', approach='distributed')

X, X_test, y, y_test = iris_data()
n_hidden, n_features = 15, X.shape[1]

model = NeuralNetwork(optimizer=Adam(lr=0.01), loss='SquareLoss')
model.add(Dense(n_hidden, input_shape=(n_features,)))
model.add(BatchNormalization1D())
model.add(Dense(30))
model.add(Dropout(0.1))
model.add(Dense(3))
model.add(Activation('softmax'))
model.summary()

model.fit(X, y, n_epochs=epochs_from_command_line(100), batch_size=25, save_model=True, persist_weights=True)
pickle.dump(model, open(os.path.join(out_dir, "model.pkl"), "wb"))

y_test_pred = model.predict(X_test)
y_test_pred.persist_op(name='test_prediction')

R.activate()
R.execute(participants=1)
R.track_progress()

y_pred = R.fetch_persisting_op(op_name="test_prediction")
y_pred = np.argmax(y_pred['result'].detach().numpy(), axis=-1)
print(f"test accuracy: {np.mean(y_pred == y_test):.3f}")
print("Dense_1.weight:", tuple(R.fetch_persisting_op("Dense_1.weight").shape))

test_model = pickle.load(open(os.path.join(out_dir, "model.pkl"), "rb"))
test_model.summary()
print("onnx:", test_model.get_onnx_model(os.path.join(out_dir, "test_ann")))
