"""A small GPT learns to sort: given 6 digits from {0, 1, 2}, it writes them out in order (minGPT's sort task).

The model is a Functional RavDL model: token and position Embeddings, transformer blocks (CustomLayers) of
causal self-attention written with ravop ops (matmul, reshape, transpose, softmax) between Dense
projections, LayerNormalization, and a Dense head. Each training sequence is the input followed by its
sorted version; the loss is cross entropy on the sorted half only (the other targets are -1, ignored):
`R.cross_entropy_loss(y, logits, ignore_index=-1, reshape_target=(-1, vocab), reshape_label=(-1,))`.

Held out: every sequence whose index (reading its digits in base 3) is divisible by 4, never trained on.
A held-out sequence counts as sorted when the model's prediction at every position of the sorted half is
right given the right prefix. Because the attention is causal, that is exactly when greedy generation
(feeding back its own tokens) writes the whole sorted sequence.

    python examples/gpt_sort.py [steps]      (or RAVDL_EPOCHS; default 200 training steps)
"""
import itertools
import math
import os
import sys

import numpy as np

import ravop as R
from ravdl.v2 import Functional
from ravdl.v2.layers import CustomLayer, Dense, Embedding, LayerNormalization
from ravdl.v2.optimizers import Adam

LENGTH, VOCAB = 6, 3
BLOCK = 2 * LENGTH - 1            # the model reads the input and all but the last sorted token
EMBED, HEADS, LAYERS = 48, 3, 2
BATCH = 64


class CausalSelfAttention(CustomLayer):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = Dense(EMBED), Dense(EMBED), Dense(EMBED)
        self.projection = Dense(EMBED)

    def _heads(self, x, T):
        """(B, T, EMBED) -> (B, HEADS, T, EMBED // HEADS)."""
        return R.transpose(R.reshape(x, (-1, T, HEADS, EMBED // HEADS)), axes=(0, 2, 1, 3))

    def _forward_pass_call(self, input, training=True):
        T = input.shape[1]
        q = self._heads(self.query._forward_pass(input), T)
        k = self._heads(self.key._forward_pass(input), T)
        v = self._heads(self.value._forward_pass(input), T)
        scores = R.matmul(q, R.transpose(k, axes=(0, 1, 3, 2))) * (1.0 / math.sqrt(EMBED // HEADS))
        future = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)   # position t sees positions <= t
        attention = R.softmax(scores + R.t(future), axis=-1)
        y = R.reshape(R.transpose(R.matmul(attention, v), axes=(0, 2, 1, 3)), (-1, T, EMBED))
        return self.projection._forward_pass(y)


class Block(CustomLayer):
    def __init__(self):
        super().__init__()
        self.norm1, self.attention = LayerNormalization(), CausalSelfAttention()
        self.norm2, self.expand, self.contract = LayerNormalization(), Dense(4 * EMBED), Dense(EMBED)

    def _forward_pass_call(self, input, training=True):
        x = input + self.attention._forward_pass(self.norm1._forward_pass(input))
        hidden = R.gelu(self.expand._forward_pass(self.norm2._forward_pass(x)))
        return x + self.contract._forward_pass(hidden)


class GPT(Functional):
    def __init__(self, optimizer):
        super().__init__()
        self.tokens, self.positions = Embedding(VOCAB, EMBED), Embedding(BLOCK, EMBED)
        self.blocks = [Block() for _ in range(LAYERS)]
        self.norm, self.head = LayerNormalization(), Dense(VOCAB, use_bias=False)
        self.initialize_params(optimizer)

    def _forward_pass_call(self, input, training=True):
        T = input.shape[1]
        x = self.tokens._forward_pass(input) + self.positions._forward_pass(R.t(np.arange(T)))
        for block in self.blocks:
            x = block._forward_pass(x, training=training)
        return self.head._forward_pass(self.norm._forward_pass(x))


def sort_data():
    """(inputs, targets) of every sequence, and a held-out mask: inputs are the sequence then its sorted
    version (without the last token), targets the next tokens, -1 where nothing is to be predicted."""
    sequences = np.array(list(itertools.product(range(VOCAB), repeat=LENGTH)))
    full = np.concatenate([sequences, np.sort(sequences, axis=1)], axis=1)
    inputs, targets = full[:, :-1].copy(), full[:, 1:].copy()
    targets[:, :LENGTH - 1] = -1
    held_out = np.arange(len(sequences)) % 4 == 0
    return inputs, targets, held_out


def record(steps, inputs, targets, held_out):
    model = GPT(Adam(lr=0.003))
    train = np.flatnonzero(~held_out)
    rng = np.random.default_rng(0)
    for step in range(1, steps + 1):
        rows = rng.choice(train, size=BATCH)
        logits = model._forward_pass(R.t(inputs[rows]))
        loss = R.cross_entropy_loss(R.t(targets[rows]), logits, ignore_index=-1, reshape_target=(-1, VOCAB),
                                    reshape_label=(-1,))
        model._backward_pass(loss)
        loss.persist_op(f"training_loss_step_{step}")
    logits = model._forward_pass(R.t(inputs[held_out]), training=False)
    R.argmax(logits, axis=-1).persist_op("test_prediction")
    return model


def sorted_fraction(predictions, targets):
    """Fraction of sequences whose every sorted-half token is predicted right."""
    predictions = np.asarray(predictions)[:, LENGTH - 1:]
    return float((predictions == targets[:, LENGTH - 1:]).all(axis=1).mean())


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("RAVDL_EPOCHS", 200))
    inputs, targets, held_out = sort_data()
    R.initialize()
    R.flush()
    R.Graph(name="gpt_sort", algorithm="transformer", approach="distributed")
    record(steps, inputs, targets, held_out)
    print(R.activate())
    R.execute()
    R.track_progress()
    print("last training loss:", float(R.fetch_persisting_op(f"training_loss_step_{steps}")))
    predictions = R.fetch_persisting_op("test_prediction")
    print(f"held-out sequences sorted: {sorted_fraction(predictions, targets[held_out]):.3f}")
