"""The two training tasks of the fidelity study, each a model, its data and its test metric.

fmnist:   the demo's CNN on Fashion-MNIST (examples/torch_fashion_mnist.py: the same model, data,
          normalisation, Adam at 1e-3 * sqrt(workers), batch 64 per worker); metric: test accuracy.
charlstm: a character-level LSTM language model on the English fortune-cookie corpus of Debian's
          `fortunes` package (/usr/share/games/fortunes, 2.5 M characters); an epoch is a pass
          over the first 200 k characters of the training fortunes; metric: next-character
          accuracy on the first 64 k characters of the held-out fortunes (and bits per
          character). Small (30 k parameters) because this machine's PyTorch multiplies
          matrices with the reference BLAS.

Everything here is deterministic given the seed: the model's initialisation, the data order and
the train/test split (the split is fixed, whatever the seed).
"""

import importlib.util
import math
import os
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORTUNES = "/usr/share/games/fortunes"


def _demo_module():
    """examples/torch_fashion_mnist.py, imported by path (it is a script, not a package)."""
    path = os.path.join(REPO, "examples", "torch_fashion_mnist.py")
    spec = importlib.util.spec_from_file_location("torch_fashion_mnist", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Task:
    """A model, per-worker shards of the training data, and a test evaluation."""

    name = "?"
    metric = "?"

    def __init__(self, rank, size, seed):
        self.rank, self.size, self.seed = rank, size, seed

    def model(self):
        raise NotImplementedError

    def optimizer(self, model):
        raise NotImplementedError

    def steps_per_epoch(self):
        raise NotImplementedError

    def batches(self, epoch):
        """This worker's (input, target) batches of `epoch`, steps_per_epoch() of them."""
        raise NotImplementedError

    def loss(self, model, x, y):
        raise NotImplementedError

    def evaluate(self, model):
        """(correct, count, summed loss) on this worker's share of the test set."""
        raise NotImplementedError


class FashionMnist(Task):
    name = "fmnist"
    metric = "test accuracy"

    def __init__(self, rank, size, seed, batch_size=64, lr=1e-3):
        super().__init__(rank, size, seed)
        self.demo = _demo_module()
        self.train_x, self.train_y = self.demo.load("train")
        self.test_x, self.test_y = self.demo.load("t10k")
        order = torch.randperm(len(self.train_x),
                               generator=torch.Generator().manual_seed(1234 + seed))
        self.shard = order[rank::size]
        self.batch_size, self.lr = batch_size, lr
        self.test_shard = torch.arange(rank, len(self.test_x), size)

    def model(self):
        return self.demo.Net()

    def optimizer(self, model):
        return torch.optim.Adam(model.parameters(), lr=self.lr * self.size ** 0.5)

    def steps_per_epoch(self):
        return (len(self.train_x) // self.size) // self.batch_size

    def batches(self, epoch):
        g = torch.Generator().manual_seed(1000 * self.seed + epoch)
        perm = self.shard[torch.randperm(len(self.shard), generator=g)]
        for i in range(self.steps_per_epoch()):
            idx = perm[i * self.batch_size:(i + 1) * self.batch_size]
            yield self.train_x[idx], self.train_y[idx]

    def loss(self, model, x, y):
        return F.cross_entropy(model(x), y)

    def evaluate(self, model):
        with torch.no_grad():
            out = model(self.test_x[self.test_shard])
            y = self.test_y[self.test_shard]
            return ((out.argmax(1) == y).sum().item(), len(y),
                    F.cross_entropy(out, y, reduction="sum").item())


class FashionMnistSgd(FashionMnist):
    """The demo's CNN, data and batches under momentum SGD, the optimizer of the OMGS-SGD and
    DGC experiments: 0.025 per worker (0.1 for 4 workers, linear scaling), momentum 0.9.

    Asked because Adam divides each coordinate's step by the root of its running squared
    gradient, so a coordinate that error feedback sends once in T steps, carrying T steps of
    gradient, moves about sqrt(T) steps' worth where dense training moves T, while SGD's step is
    linear in what is sent. bench/RESULTS.md has what it measured."""

    name = "fmnist-sgd"
    momentum = 0.9

    def __init__(self, rank, size, seed, batch_size=64, lr=0.025):
        super().__init__(rank, size, seed, batch_size, lr)

    def optimizer(self, model):
        return torch.optim.SGD(model.parameters(), lr=self.lr * self.size, momentum=self.momentum)


class CharLstm(Task):
    """Next-character prediction with a one-layer LSTM (embedding 16, hidden 64)."""

    name = "charlstm"
    metric = "test next-character accuracy"

    TRAIN_CHARS, TEST_CHARS = 200_000, 64_000

    def __init__(self, rank, size, seed, batch_size=16, seq_len=32, lr=2e-3):
        super().__init__(rank, size, seed)
        train, test = self._corpus()
        train, test = train[:self.TRAIN_CHARS], test[:self.TEST_CHARS]
        chars = sorted(set(train) | set(test))
        self.vocab = {c: i for i, c in enumerate(chars)}
        self.train = torch.tensor([self.vocab[c] for c in train], dtype=torch.long)
        self.test = torch.tensor([self.vocab[c] for c in test], dtype=torch.long)
        self.batch_size, self.seq_len, self.lr = batch_size, seq_len, lr
        # Training windows: every seq_len-th start, shuffled per seed, sharded over workers.
        starts = torch.arange(0, len(self.train) - seq_len - 1, seq_len)
        order = torch.randperm(len(starts), generator=torch.Generator().manual_seed(1234 + seed))
        self.shard = starts[order][rank::size]
        test_starts = torch.arange(0, len(self.test) - seq_len - 1, seq_len)
        self.test_starts = test_starts[rank::size]

    @staticmethod
    def _corpus():
        if not os.path.isdir(FORTUNES):
            raise SystemExit("%s is missing: install the Debian package 'fortunes' "
                             "(apt-get install fortunes)" % FORTUNES)
        texts = []
        for name in sorted(os.listdir(FORTUNES)):
            path = os.path.join(FORTUNES, name)
            if "." in name or os.path.islink(path) or not os.path.isfile(path):
                continue  # the .dat indexes and the .u8 links
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.extend(t.strip() + "\n" for t in f.read().split("\n%\n") if t.strip())
        # A fixed split of whole fortunes, the same for every seed: 1 in 10 is held out.
        random.Random(0).shuffle(texts)
        test = "".join(texts[::10])
        train = "".join(t for i, t in enumerate(texts) if i % 10)
        return train, test

    class Net(nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.embed = nn.Embedding(vocab, 16)
            self.lstm = nn.LSTM(16, 64, batch_first=True)
            self.out = nn.Linear(64, vocab)

        def forward(self, x):
            return self.out(self.lstm(self.embed(x))[0])

    def model(self):
        return CharLstm.Net(len(self.vocab))

    def optimizer(self, model):
        return torch.optim.Adam(model.parameters(), lr=self.lr * self.size ** 0.5)

    def steps_per_epoch(self):
        return len(self.train) // self.seq_len // self.size // self.batch_size

    def _windows(self, data, starts):
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
        w = data[idx]
        return w[:, :-1], w[:, 1:]

    def batches(self, epoch):
        g = torch.Generator().manual_seed(1000 * self.seed + epoch)
        perm = self.shard[torch.randperm(len(self.shard), generator=g)]
        for i in range(self.steps_per_epoch()):
            yield self._windows(self.train, perm[i * self.batch_size:(i + 1) * self.batch_size])

    def loss(self, model, x, y):
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    def evaluate(self, model):
        correct = count = 0
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(self.test_starts), 256):
                x, y = self._windows(self.test, self.test_starts[i:i + 256])
                out = model(x).flatten(0, 1)
                y = y.flatten()
                correct += (out.argmax(1) == y).sum().item()
                count += len(y)
                total += F.cross_entropy(out, y, reduction="sum").item()
        return correct, count, total


class FashionMnistSgdLocalMomentum(FashionMnistSgd):
    """fmnist-sgd with the optimizer's momentum off, for DGC, which keeps momentum 0.9 on each
    node before its selection (momentum correction, kernels/dgc_state.h): the wrapped optimizer
    then must not apply it a second time (README). The same learning rate."""

    name = "fmnist-sgd-local-momentum"
    momentum = 0.0


TASKS = {t.name: t for t in (FashionMnist, FashionMnistSgd, FashionMnistSgdLocalMomentum,
                             CharLstm)}


def bits_per_unit(summed_loss, count):
    """Mean cross-entropy in bits (per character for charlstm)."""
    return summed_loss / count / math.log(2)
