"""The models of the OMGS-SGD paper's evaluation (Shi et al., INFOCOM 2020), for profiling.

Each entry of MODELS builds a model and a batch of inputs and a loss for it:
- resnet20:     ResNet-20 for CIFAR-10 (He et al. 2016, section 4.2: 3 stages of 3 basic blocks,
                16/32/64 channels, parameter-free "option A" shortcuts), 32x32 inputs, 10 classes.
- vgg16:        VGG-16 for CIFAR-10: torchvision's vgg16_bn convolutional part (13 conv + BN
                layers, 5 max-pools, so 32x32 becomes 1x1x512) followed by one Linear(512, 10),
                the CIFAR variant of kuangliu/pytorch-cifar used by the paper's authors' code
                (14.7 M parameters, against 138 M of the ImageNet VGG-16).
- alexnet:      torchvision.models.alexnet (the single-tower "one weird trick" variant), 224x224.
- resnet50:     torchvision.models.resnet50, 224x224.
- inception_v4: Inception-v4 (Szegedy et al. 2017, figures 3-9), 299x299, written here.
- lstm_ptb:     2-layer LSTM language model on Penn Treebank: vocabulary 10,000, embedding and
                hidden size 1,500, untied decoder (66.0 M parameters, the paper's LSTM-PTB),
                35 time steps per sample.
- fmnist_cnn:   the demo's CNN (examples/torch_fashion_mnist.py: two 3x3 convolutions, two linear
                layers, 105 k parameters), 1x28x28 inputs, batch 64 per worker as in the demo:
                not one of the paper's models; profiled so that the time-to-accuracy study
                (bench/fidelity/time_to_accuracy.py) prices the model it trains.
"""

import importlib.util
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


# ---------------------------------------------------------------------------------------------
# ResNet-20 (CIFAR-10)


class _BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin  # option A: subsample and zero-pad the channels

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.pad:
            shortcut = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad // 2, self.pad // 2))
        return F.relu(out + shortcut)


class ResNet20(nn.Module):
    def __init__(self, num_classes=10, blocks_per_stage=3):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for stage, cout in enumerate((16, 32, 64)):
            for b in range(blocks_per_stage):
                layers.append(_BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---------------------------------------------------------------------------------------------
# VGG-16 (CIFAR-10)


def vgg16_cifar(num_classes=10):
    features = torchvision.models.vgg16_bn().features
    return nn.Sequential(features, nn.Flatten(), nn.Linear(512, num_classes))


# ---------------------------------------------------------------------------------------------
# Inception-v4


def _conv(cin, cout, kernel, stride=1, padding=0):
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(cout, eps=0.001), nn.ReLU(inplace=True))


def _chain(*specs):
    """A sequence of convolutions given as (cin, cout, kernel[, stride[, padding]]) tuples."""
    return nn.Sequential(*[_conv(*s) for s in specs])


class _Parallel(nn.Module):
    """Runs branches on the same input and concatenates their outputs along channels."""

    def __init__(self, *branches):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], 1)


class _Split(nn.Module):
    """A trunk followed by two parallel heads whose outputs are concatenated (Inception-C)."""

    def __init__(self, trunk, head_a, head_b):
        super().__init__()
        self.trunk, self.head_a, self.head_b = trunk, head_a, head_b

    def forward(self, x):
        x = self.trunk(x)
        return torch.cat([self.head_a(x), self.head_b(x)], 1)


def _avgpool_branch(cin, cout):
    return nn.Sequential(nn.AvgPool2d(3, 1, 1, count_include_pad=False), _conv(cin, cout, 1))


def _inception_a():
    return _Parallel(_chain((384, 96, 1)),
                     _chain((384, 64, 1), (64, 96, 3, 1, 1)),
                     _chain((384, 64, 1), (64, 96, 3, 1, 1), (96, 96, 3, 1, 1)),
                     _avgpool_branch(384, 96))


def _reduction_a():
    return _Parallel(_chain((384, 384, 3, 2)),
                     _chain((384, 192, 1), (192, 224, 3, 1, 1), (224, 256, 3, 2)),
                     nn.MaxPool2d(3, 2))


def _inception_b():
    return _Parallel(_chain((1024, 384, 1)),
                     _chain((1024, 192, 1), (192, 224, (1, 7), 1, (0, 3)),
                            (224, 256, (7, 1), 1, (3, 0))),
                     _chain((1024, 192, 1), (192, 192, (7, 1), 1, (3, 0)),
                            (192, 224, (1, 7), 1, (0, 3)), (224, 224, (7, 1), 1, (3, 0)),
                            (224, 256, (1, 7), 1, (0, 3))),
                     _avgpool_branch(1024, 128))


def _reduction_b():
    return _Parallel(_chain((1024, 192, 1), (192, 192, 3, 2)),
                     _chain((1024, 256, 1), (256, 256, (1, 7), 1, (0, 3)),
                            (256, 320, (7, 1), 1, (3, 0)), (320, 320, 3, 2)),
                     nn.MaxPool2d(3, 2))


def _inception_c():
    def heads(cin):
        return (_conv(cin, 256, (1, 3), 1, (0, 1)), _conv(cin, 256, (3, 1), 1, (1, 0)))

    return _Parallel(_chain((1536, 256, 1)),
                     _Split(_chain((1536, 384, 1)), *heads(384)),
                     _Split(_chain((1536, 384, 1), (384, 448, (3, 1), 1, (1, 0)),
                                   (448, 512, (1, 3), 1, (0, 1))), *heads(512)),
                     _avgpool_branch(1536, 256))


class InceptionV4(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(
            _chain((3, 32, 3, 2), (32, 32, 3), (32, 64, 3, 1, 1)),
            _Parallel(nn.MaxPool2d(3, 2), _chain((64, 96, 3, 2))),                  # 3a
            _Parallel(_chain((160, 64, 1), (64, 96, 3)),                            # 4a
                      _chain((160, 64, 1), (64, 64, (1, 7), 1, (0, 3)),
                             (64, 64, (7, 1), 1, (3, 0)), (64, 96, 3))),
            _Parallel(_chain((192, 192, 3, 2)), nn.MaxPool2d(3, 2)))                # 5a
        self.blocks = nn.Sequential(
            *[_inception_a() for _ in range(4)], _reduction_a(),
            *[_inception_b() for _ in range(7)], _reduction_b(),
            *[_inception_c() for _ in range(3)])
        self.fc = nn.Linear(1536, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---------------------------------------------------------------------------------------------
# 2-layer LSTM on PTB


class LstmPtb(nn.Module):
    def __init__(self, vocab=10000, size=1500, layers=2, dropout=0.65):
        super().__init__()
        self.embedding = nn.Embedding(vocab, size)
        self.lstm = nn.LSTM(size, size, layers, dropout=dropout)
        self.decoder = nn.Linear(size, vocab)
        self.drop = nn.Dropout(dropout)

    def forward(self, tokens):  # tokens: [time, batch]
        out, _ = self.lstm(self.drop(self.embedding(tokens)))
        return self.decoder(self.drop(out))


# ---------------------------------------------------------------------------------------------
# Registry


# ---------------------------------------------------------------------------------------------
# The demo's Fashion-MNIST CNN


def fmnist_cnn():
    """examples/torch_fashion_mnist.py's Net, imported by path (the example is a script)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(repo, "examples", "torch_fashion_mnist.py")
    spec = importlib.util.spec_from_file_location("torch_fashion_mnist", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Net()


class Spec:
    """How to build one model and one training batch for it."""

    def __init__(self, name, dataset, build, input_shape, batch_size, description, classes):
        self.name, self.dataset, self.build = name, dataset, build
        self.input_shape, self.batch_size = input_shape, batch_size
        self.description, self.classes = description, classes

    def batch(self, batch_size, generator):
        """(inputs, loss function of the model's output) for `batch_size` samples."""
        if self.name == "lstm_ptb":
            steps = self.input_shape[0]
            tokens = torch.randint(0, self.classes, (steps + 1, batch_size), generator=generator)
            x, y = tokens[:-1], tokens[1:]
            return x, lambda out: F.cross_entropy(out.reshape(-1, self.classes), y.reshape(-1))
        x = torch.randn((batch_size,) + tuple(self.input_shape), generator=generator)
        y = torch.randint(0, self.classes, (batch_size,), generator=generator)
        return x, lambda out: F.cross_entropy(out, y)


MODELS = {s.name: s for s in [
    Spec("resnet20", "CIFAR-10", ResNet20, (3, 32, 32), 8,
         "ResNet-20 (He et al. 2016, CIFAR variant, option-A shortcuts), sparsync's own "
         "definition", 10),
    Spec("vgg16", "CIFAR-10", vgg16_cifar, (3, 32, 32), 8,
         "VGG-16 for CIFAR-10: torchvision vgg16_bn().features + Linear(512, 10) "
         "(the pytorch-cifar variant)", 10),
    Spec("alexnet", "ImageNet", torchvision.models.alexnet, (3, 224, 224), 2,
         "torchvision.models.alexnet()", 1000),
    Spec("resnet50", "ImageNet", torchvision.models.resnet50, (3, 224, 224), 2,
         "torchvision.models.resnet50()", 1000),
    Spec("inception_v4", "ImageNet", InceptionV4, (3, 299, 299), 2,
         "Inception-v4 (Szegedy et al. 2017), sparsync's own definition", 1000),
    Spec("lstm_ptb", "PTB", LstmPtb, (35,), 4,
         "2-layer LSTM, vocabulary 10000, embedding/hidden 1500, untied decoder, 35 steps, "
         "sparsync's own definition", 10000),
    Spec("fmnist_cnn", "Fashion-MNIST", fmnist_cnn, (1, 28, 28), 64,
         "the demo's CNN (examples/torch_fashion_mnist.py's Net), batch 64 as in the demo", 10),
]}
