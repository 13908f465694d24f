"""Two real-model shapes for benchmarks (issue 46), without torchvision: a resnet-like CNN (a stem and residual
blocks with BatchNorm, 3x32x32 images, batch 16) and a small GPT (decoder blocks with causal
F.scaled_dot_product_attention, LayerNorm, GELU, dropout, a tied LM head), each trained through
`Pytorch_Model(R.model(module))` and, the same model and batches, in eager PyTorch.

    record_resnet(fused)/eager_resnet(fused), record_gpt(fused)/eager_gpt(fused): one fit each (record_* records
    it in the current graph; eager_* returns its seconds), for benchmarks/bench_step.py --cases resnet,gpt.

And the full-size models of benchmarks/bench_real_models.py: `resnet18(classes)` (torchvision's when it is
installed, else a faithful copy of it) and the GPT at `GPT(vocab=6144, seq=128, d_model=384, heads=6, layers=6,
tied=False)`.
"""
import math
import time

import numpy as np
import torch
import torch.nn.functional as TF
from torch import nn

import bench_ravdl
import ravop as R
from ravdl.v2 import Pytorch_Model
from ravdl.v2.optimizers import Adam

SEED = 0
RESNET_ROWS, RESNET_BATCH = 16 * 8, 16   # 8 steps of 16 images
GPT_ROWS, GPT_BATCH = 8 * 8, 8           # 8 steps of 8 sequences
VOCAB, SEQ = 512, 64


class Block(nn.Module):
    """A basic residual block (resnet18's): two 3x3 convolutions with BatchNorm, a 1x1 projection when it
    downsamples."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.skip(x))


class ResNetLike(nn.Module):
    """resnet18's layout at a quarter of its width and one block per stage: 16-32-64-128 channels, 10 classes."""

    def __init__(self, widths=(16, 32, 64, 128), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        self.stages = nn.Sequential(*[Block(widths[max(k - 1, 0)], w, 1 if k == 0 else 2)
                                      for k, w in enumerate(widths)])
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x):
        return self.head(TF.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1))


class BasicBlock(nn.Module):
    """torchvision's resnet BasicBlock, line for line: ReLU(inplace=True), a downsample Sequential,
    `out += identity`."""
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    """torchvision's ResNet (its models' resnet module) for BasicBlock, with its initialisation; torchvision is
    not a dependency, so this is a faithful copy."""

    def __init__(self, layers=(2, 2, 2, 2), num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * BasicBlock.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * BasicBlock.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * BasicBlock.expansion, kernel_size=1,
                                                 stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * BasicBlock.expansion))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * BasicBlock.expansion
        layers += [BasicBlock(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


class Attention(nn.Module):
    """Causal self-attention: torch's fused scaled_dot_product_attention, or (fused=False) minGPT's written out."""

    def __init__(self, d_model, heads, dropout, fused=True):
        super().__init__()
        self.heads, self.fused, self.p = heads, fused, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = [z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)]
        if self.fused:
            y = TF.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                dropout_p=self.p if self.training else 0.0)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = self.drop(torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)) @ v
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class DecoderBlock(nn.Module):
    def __init__(self, d_model, heads, dropout, fused=True):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, dropout, fused)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT (nanoGPT's layout): 2 pre-norm decoder blocks, d_model 128, 4 heads, sequences of 64, vocabulary 512;
    an LM head tied to the token embedding unless `tied` is False (tests/runtime/test_torchscript_step.py trains a
    tiny one)."""

    def __init__(self, vocab=VOCAB, seq=SEQ, d_model=128, heads=4, layers=2, dropout=0.1, fused=True, tied=True):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[DecoderBlock(d_model, heads, dropout, fused) for _ in range(layers)])
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        if tied:
            self.head.weight = self.tok.weight

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.tok(tokens) + self.pos(positions))
        return self.head(self.ln(self.blocks(x)))


def resnet18(num_classes=1000):
    """torchvision's resnet18 when torchvision is installed, else `ResNet` with its layers (the same model)."""
    try:
        import torchvision
    except ImportError:
        return ResNet((2, 2, 2, 2), num_classes)
    return torchvision.models.resnet18(num_classes=num_classes)


def image_data():
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(RESNET_ROWS, 3, 32, 32, generator=g), torch.randint(0, 10, (RESNET_ROWS,), generator=g)


def token_data():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randint(0, VOCAB, (GPT_ROWS, SEQ + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def _model(make):
    torch.manual_seed(SEED)
    return make()


def _token_loss(y_true, y_pred):
    return R.cross_entropy_loss(y_true, y_pred, reshape_target=(-1, VOCAB), reshape_label=(-1,))


def _record(make, data, batch, loss, fused):
    X, y = data()
    model = Pytorch_Model(R.model(_model(make)))
    model.initialize(Adam(lr=0.001, fused=fused))
    model.fit(X, y, n_epochs=1, batch_size=batch, loss=loss, shuffle=True)


def _eager(make, data, batch, loss, fused):
    """Seconds of the same fit in eager PyTorch, the model and optimizer made included: torch.optim.Adam (the
    per-parameter loop by default on a CPU; `fused`: its fused kernel), batches in a shuffled order."""
    start = time.perf_counter()
    model = _model(make).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, fused=fused or None)
    X, y = data()
    order = torch.from_numpy(np.random.default_rng(SEED).permutation(len(X)))
    bench_ravdl.eager_fit(model, optimizer, loss, X, y, [order], batch)
    return time.perf_counter() - start


def record_resnet(fused=False):
    _record(ResNetLike, image_data, RESNET_BATCH, "CrossEntropy", fused)


def eager_resnet(fused=False):
    return _eager(ResNetLike, image_data, RESNET_BATCH, TF.cross_entropy, fused)


def record_gpt(fused=False):
    _record(GPT, token_data, GPT_BATCH, _token_loss, fused)


def eager_gpt(fused=False):
    return _eager(GPT, token_data, GPT_BATCH, lambda out, y: TF.cross_entropy(out.view(-1, VOCAB), y.view(-1)),
                  fused)
