"""What the RavDL examples share: their datasets (bundled with scikit-learn, no download), the epoch count
from the command line, the folder they write files into, and accuracy."""
import os
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits, load_iris
from sklearn.model_selection import train_test_split


def epochs_from_command_line(default):
    """The first argument, else $RAVDL_EPOCHS (the tests run the examples on fewer epochs), else `default`."""
    return int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("RAVDL_EPOCHS", default))


# Where the examples write their files (a model file, a pickle, an ONNX export) unless told otherwise: beside
# the scripts, ignored by git, so that running an example leaves the checkout and the working directory clean.
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "output"


def output_dir():
    """The second argument, else $RAVOP_EXAMPLES_OUTPUT, else examples/output/; created, and printed so that
    the user finds the files."""
    folder = Path(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("RAVOP_EXAMPLES_OUTPUT", DEFAULT_OUTPUT))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"writing files to {folder}")
    return str(folder)


def iris_data(dtype=np.float64):
    """Standardised features, one-hot labels (both `dtype`); a third of the samples held out for testing."""
    X, y = load_iris(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=1 / 3, random_state=0, stratify=y)
    mean, std = X_train.mean(0), X_train.std(0)
    return (((X_train - mean) / std).astype(dtype), ((X_test - mean) / std).astype(dtype),
            np.eye(3)[y_train].astype(dtype), y_test)


def digits_data():
    """Images scaled to [0, 1] as (N, 1, 8, 8) float32, integer labels; 40% held out for testing."""
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return train_test_split(X, y, test_size=0.4, random_state=0, stratify=y)


def accuracy(scores, labels):
    """Share of rows whose highest score is at the label's index."""
    return float((np.asarray(scores).argmax(1) == labels).mean())
