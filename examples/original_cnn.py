"""The digits CNN as the original's sequential requester script (Conv2D(1, 16, 3, 'same'), relu,
MaxPooling2D, Dropout, BatchNormalization2D, ..., Flatten, Dense(256), Dense(10), softmax; cross entropy),
with `R.t` of float64 data and the prediction fetched as `['result']`, run unchanged on this engine.
Compare examples/digits_cnn_sequential.py.

    python examples/original_cnn.py [epochs]      (or RAVDL_EPOCHS; default 15)
"""
import os

import numpy as np
import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, BatchNormalization2D, Conv2D, Dense, Dropout, Flatten, MaxPooling2D
from ravdl.v2.optimizers import Adam

from example_data import digits_data, epochs_from_command_line

R.initialize(ravenverse_token=os.environ.get("TOKEN"))
R.flush()
R.Graph(name='cnn', algorithm='convolutional_neural_network', approach='distributed')

X, X_test, y, y_test = digits_data()
X, X_test = X.astype(np.float64), X_test.astype(np.float64)   # as the original's datasets came

model = NeuralNetwork(optimizer=Adam(), loss='CrossEntropy')
model.add(Conv2D(1, 16, kernel_size=3, padding='same', input_shape=(1, 8, 8)))
model.add(Activation('relu'))
model.add(MaxPooling2D(kernel_size=2))
model.add(Dropout(0.1))
model.add(BatchNormalization2D(16))
model.add(Conv2D(16, 32, kernel_size=3, padding='same'))
model.add(Activation('relu'))
model.add(MaxPooling2D(kernel_size=2))
model.add(Dropout(0.1))
model.add(BatchNormalization2D(32))
model.add(Flatten())
model.add(Dense(256))
model.add(Activation('relu'))
model.add(Dense(10))
model.add(Activation('softmax'))
model.summary()

model.fit(X, y, n_epochs=epochs_from_command_line(15), batch_size=64)

y_test_pred = model.predict(R.t(X_test))
y_test_pred.persist_op(name='test_prediction')

R.activate()
R.execute()
R.track_progress()

prediction = R.fetch_persisting_op(op_name="test_prediction")
y_pred = np.argmax(prediction['result'].detach().numpy(), axis=-1)
print(f"test accuracy: {np.mean(y_pred == y_test):.3f}")
