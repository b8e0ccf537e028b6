"""Bytes on the wire per sent coordinate for each sparse payload coding, on real gradients.

    .venv/bin/python bench/wire_bytes.py [--steps 200] [--dump-at 1,50,100,150,200]
                                         [--density 0.001] [--binary build/bench/wire_bytes]

Trains the Fashion-MNIST CNN of examples/torch_fashion_mnist.py in one process (its model and
data loader, Adam, batch 64), dumps the flattened gradient of every parameter at a few steps as
raw float32 files (one directory per step), and runs build/bench/wire_bytes on them, which
sparsifies each gradient with the CPU kernels (top-k; Wangni for sign-scale), encodes it with
every coding and prints the Markdown tables (issue 3, "Bytes on the wire").
"""

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import types

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
try:
    example = importlib.import_module("torch_fashion_mnist")
except ImportError:
    # The example imports sparsync.torch at the top; its model and loader do not need it.
    sys.modules["sparsync"] = types.ModuleType("sparsync")
    sys.modules["sparsync.torch"] = types.ModuleType("sparsync.torch")
    example = importlib.import_module("torch_fashion_mnist")


def dump_gradients(model, directory):
    os.makedirs(directory)
    paths = []
    for i, (name, p) in enumerate(model.named_parameters()):
        path = os.path.join(directory, "%02d_%s.f32" % (i, name))
        p.grad.detach().flatten().to(torch.float32).numpy().tofile(path)
        paths.append(path)
    return paths


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dump-at", default="1,50,100,150,200",
                        help="comma-separated steps (1-based) whose gradients are dumped")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "bench", "wire_bytes"))
    args = parser.parse_args()
    dump_at = {int(s) for s in args.dump_at.split(",")}

    torch.manual_seed(0)
    train_x, train_y = example.load("train")
    model = example.Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(1234))

    with tempfile.TemporaryDirectory(prefix="wire_bytes_") as tmp:
        paths = []
        for step in range(1, args.steps + 1):
            start = ((step - 1) * args.batch_size) % (len(order) - args.batch_size)
            idx = order[start:start + args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            loss.backward()
            if step in dump_at:
                paths += dump_gradients(model, os.path.join(tmp, "step%04d" % step))
                print("step %d: loss %.4f, gradients dumped" % (step, loss.item()),
                      file=sys.stderr)
            optimizer.step()
        if not paths:
            sys.exit("no step of --dump-at is within --steps")
        cmd = [args.binary, "--density", str(args.density)] + paths
        print("$ wire_bytes --density %g <%d files>" % (args.density, len(paths)),
              file=sys.stderr)
        sys.exit(subprocess.run(cmd, check=False).returncode)


if __name__ == "__main__":
    main()
