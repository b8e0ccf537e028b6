#!/usr/bin/env python3
"""Baselines for exact top-k by magnitude on CPU, on the sizes and densities of sparsify_bench.

Times torch.topk(x.abs(), k) and numpy.argpartition(-abs(x), k - 1)[:k] on float32 N(0, 1)
gradients of 1 Mi and 25 Mi elements at densities 0.001 and 0.01, and prints one line per case
with the median time and the input bytes per second (4 bytes per element, as sparsify_bench).

    /usr/bin/python3 bench/kernels/torch_baseline.py [--repeats 5] [--threads N]
"""

import argparse
import statistics
import time

import numpy as np
import torch


def median_seconds(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__} (threads={torch.get_num_threads()}), numpy {np.__version__}")
    print(f"{'case':<34}{'median ms':>12}{'GB/s':>10}")
    rng = np.random.default_rng(42)
    for n, label in ((1 << 20, "1M"), (25 << 20, "25M")):
        x_np = rng.standard_normal(n, dtype=np.float32)
        x_t = torch.from_numpy(x_np)
        for density in (0.001, 0.01):
            k = int(density * n)
            cases = {
                "torch.topk(x.abs(), k)": lambda: torch.topk(x_t.abs(), k),
                "numpy.argpartition": lambda: np.argpartition(-np.abs(x_np), k - 1)[:k],
            }
            for name, fn in cases.items():
                t = median_seconds(fn, args.repeats)
                case = f"{name} {label}/{density:g}"
                print(f"{case:<34}{t * 1e3:>12.2f}{4 * n / t / 1e9:>10.2f}")


if __name__ == "__main__":
    main()
