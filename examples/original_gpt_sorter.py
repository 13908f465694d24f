"""The GPT token sorter as the original's requester scripts built it: a Functional model of CustomLayers made
of RavDL layers and the math layers (Add, Multiply, Power, Dot, Division, Transpose, Reshape), layers taking
several inputs and keywords (`q, k, v`, `mask=`, `batch_size=`), `Dense(input_shape=(n,))` on (batch, seq, n)
input, and generation with `R.index(..., indices=str({"indices": "[:,-1,:]"}))`, `R.argmax(...,
keepdims="True")` and `R.concat`. Run unchanged on this engine; compare examples/gpt_sort.py (same data and
held-out sequences, same metric: the share of held-out sequences generated in sorted order).

    python examples/original_gpt_sorter.py [epochs]      (or RAVDL_EPOCHS; default 25)
"""
import math
import os

import numpy as np
import ravop as R
from ravdl.v2 import Functional
from ravdl.v2.layers import (Activation, Add, CustomLayer, Dense, Division, Dot, Dropout, Embedding,
                             LayerNormalization, Multiply, Power, Reshape, Transpose)
from ravdl.v2.optimizers import Adam
from ravdl.v2.utils.data_manipulation import batch_iterator

from example_data import epochs_from_command_line
from gpt_sort import LENGTH, sort_data


class NewGeLU(CustomLayer):
    def __init__(self):
        super().__init__()
        self.half = R.t(0.5)
        self.tanh = Activation('tanh')
        self.one = R.t(1)
        self.c = R.t(math.sqrt(2.0 / math.pi))
        self.norm_const = R.t(0.044715)
        self.pow = Power()
        self.mul1, self.mul2, self.mul3, self.mul4 = Multiply(), Multiply(), Multiply(), Multiply()
        self.add1, self.add2 = Add(), Add()

    def _forward_pass_call(self, x, training=True):
        # 0.5 * x * (1.0 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))
        pow_op = self.pow._forward_pass(x, power=3)
        mul1_op = self.mul1._forward_pass(self.norm_const, pow_op)
        add1_op = self.add1._forward_pass(x, mul1_op)
        mul2_op = self.mul2._forward_pass(self.c, add1_op)
        tanh_op = self.tanh._forward_pass(mul2_op)
        add2_op = self.add2._forward_pass(self.one, tanh_op)
        mul3_op = self.mul3._forward_pass(x, add2_op)
        return self.mul4._forward_pass(self.half, mul3_op)


class ScaledDotProductAttention(CustomLayer):
    def __init__(self, depth):
        super().__init__()
        self.transpose = Transpose()
        self.dot1, self.dot2 = Dot(), Dot()
        self.depth_sqrt = R.t(np.sqrt(np.float32(depth)))
        self.add1 = Add()
        self.div1 = Division()
        self.softmax = Activation('softmax')

    def _forward_pass_call(self, q, k, v, training=True, mask=None):
        k_transpose = self.transpose._forward_pass(k, axes=(-2, -1))
        matmul_qk = self.dot1._forward_pass(q, k_transpose)
        scaled_attention_logits = self.div1._forward_pass(matmul_qk, self.depth_sqrt)
        if mask is not None:
            scaled_attention_logits = self.add1._forward_pass(scaled_attention_logits, R.t(mask * -1e9))
        attention_weights = self.softmax._forward_pass(scaled_attention_logits)
        return self.dot2._forward_pass(attention_weights, v)


class MultiHeadAttention(CustomLayer):
    def __init__(self, n_embed, n_heads):
        super().__init__()
        self.n_heads, self.n_embed = n_heads, n_embed
        self.depth = n_embed // n_heads
        self.wq = Dense(n_embed, input_shape=(n_embed,))
        self.wk = Dense(n_embed, input_shape=(n_embed,))
        self.wv = Dense(n_embed, input_shape=(n_embed,))
        self.c_proj = Dense(n_embed)
        self.reshape_q, self.reshape_k, self.reshape_v = Reshape(), Reshape(), Reshape()
        self.transpose_q, self.transpose_k, self.transpose_v = Transpose(), Transpose(), Transpose()
        self.transpose_scaled_attn = Transpose()
        self.scaled_dot_attn = ScaledDotProductAttention(self.depth)
        self.concat_attention_reshape = Reshape(contiguous="True")

    def _forward_pass_call(self, input, training=True, batch_size=None, mask=None):
        heads = (batch_size, -1, self.n_heads, self.depth)
        q = self.transpose_q._forward_pass(self.reshape_q._forward_pass(self.wq._forward_pass(input), shape=heads),
                                           axes=(1, 2))
        k = self.transpose_k._forward_pass(self.reshape_k._forward_pass(self.wk._forward_pass(input), shape=heads),
                                           axes=(1, 2))
        v = self.transpose_v._forward_pass(self.reshape_v._forward_pass(self.wv._forward_pass(input), shape=heads),
                                           axes=(1, 2))
        scaled_attention = self.scaled_dot_attn._forward_pass(q, k, v, training=training, mask=mask)
        scaled_attention = self.transpose_scaled_attn._forward_pass(scaled_attention, axes=(1, 2))
        concat_attention = self.concat_attention_reshape._forward_pass(scaled_attention,
                                                                       shape=(batch_size, -1, self.n_embed))
        return self.c_proj._forward_pass(concat_attention)


class Block(CustomLayer):
    def __init__(self, n_embed, n_heads):
        super().__init__()
        self.ln_1 = LayerNormalization(normalized_shape=n_embed)
        self.attn = MultiHeadAttention(n_embed=n_embed, n_heads=n_heads)
        self.ln_2 = LayerNormalization(normalized_shape=n_embed)
        self.c_fc = Dense(4 * n_embed)
        self.c_proj = Dense(n_embed)
        self.gelu = NewGeLU()
        self.drpt = Dropout(0.1)
        self.add1, self.add2 = Add(), Add()

    def _forward_pass_call(self, x, training=True, batch_size=None, mask=None):
        input = x
        x = self.ln_1._forward_pass(x, training=training)
        x = self.attn._forward_pass(x, training=training, batch_size=batch_size, mask=mask)
        x = self.add1._forward_pass(input, x)
        x_ = x
        x = self.ln_2._forward_pass(x, training=training)
        x = self.c_fc._forward_pass(x)
        x = self.gelu._forward_pass(x)
        x = self.c_proj._forward_pass(x)
        x = self.drpt._forward_pass(x, training=training)
        return self.add2._forward_pass(x_, x)


class GPT(Functional):
    def __init__(self, vocab_size, embed_dim, block_size, n_heads, n_layer, seq_length, optimizer):
        super().__init__()
        self.wte = Embedding(vocab_size=vocab_size, embed_dim=embed_dim)
        self.wpe = Embedding(block_size, embed_dim)
        self.drop = Dropout(0.1)
        self.h = [Block(n_embed=embed_dim, n_heads=n_heads) for _ in range(n_layer)]
        self.ln_f = LayerNormalization(normalized_shape=embed_dim)
        self.lm_head = Dense(vocab_size, use_bias='False')
        self.add = Add()
        self.seq_length = seq_length
        self.pos = R.t(np.expand_dims(np.arange(0, self.seq_length), axis=0))   # shape (1, seq_length)
        self.initialize_params(optimizer)

    def _forward_pass_call(self, inputs, training=True, batch_size=None, mask=None):
        if not training:
            self.pos = R.t(np.expand_dims(np.arange(0, self.seq_length), axis=0))
        tok_emb = self.wte._forward_pass(inputs)
        pos_emb = self.wpe._forward_pass(self.pos)
        x = self.drop._forward_pass(self.add._forward_pass(tok_emb, pos_emb), training=training)
        for block in self.h:
            x = block._forward_pass(x, training=training, batch_size=batch_size, mask=mask)
        x = self.ln_f._forward_pass(x)
        return self.lm_head._forward_pass(x)


R.initialize(ravenverse_token=os.environ.get("TOKEN"))
R.flush()
R.Graph(name='gpt_train', algorithm='transformer', approach='distributed')

inputs, targets, held_out = sort_data()
order = np.random.default_rng(0).permutation(np.flatnonzero(~held_out))   # the original drew its data at random
X_train, y_train = inputs[order], targets[order]

n_epochs = epochs_from_command_line(25)
optimizer = Adam(lr=0.003)
sequence_length = 2 * LENGTH - 1
model = GPT(vocab_size=3, embed_dim=48, block_size=sequence_length, n_heads=3, n_layer=2,
            seq_length=sequence_length, optimizer=optimizer)
causal_mask = np.triu(np.ones((sequence_length, sequence_length)), k=1)

for i in range(n_epochs):
    for X_batch, y_batch in batch_iterator(X_train, y_train, batch_size=64):
        op = model._forward_pass(R.t(X_batch), training=True, batch_size=X_batch.shape[0], mask=causal_mask)
        loss = R.cross_entropy_loss(R.t(y_batch), op, ignore_index=-1, reshape_target=(-1, 3), reshape_label=(-1,))
        model._backward_pass(loss)

test_input = inputs[held_out][:, :LENGTH]


def generate(x, steps=LENGTH):
    batch = x.shape[0]
    x = R.t(x)
    model.seq_length = LENGTH
    causal_mask = np.triu(np.ones((LENGTH, LENGTH)), k=1)
    for i in range(steps):
        outputs = model._forward_pass(x, training=False, batch_size=batch, mask=causal_mask)
        output_tensor = R.index(outputs, indices=str({"indices": "[:,-1,:]"}))
        output_token = R.argmax(output_tensor, axis=-1, keepdims="True")
        x = R.concat(x, output_token, axis=-1)
        model.seq_length = model.seq_length + 1
        causal_mask = np.triu(np.ones((model.seq_length, model.seq_length)), k=1)
    x.persist_op('outputs')


generate(test_input, LENGTH)

R.activate()
R.execute(participants=1)
R.track_progress()

output = R.fetch_persisting_op('outputs')
output = np.array(output)[:, LENGTH:]
print('Test Input: ', test_input[0])
print('Predicted: ', output[0])
print(f"held-out sequences sorted: {np.mean((output == np.sort(test_input, axis=1)).all(axis=1)):.3f}")
