"""Inputs of the collective tests, reproducible from (case, rank) by workers and by the tests."""

import numpy as np

# name -> (shape, numpy dtype name); bfloat16 travels as float32 numbers rounded to bfloat16.
ALLREDUCE_CASES = {
    "f32_scalar": ((), "float32"),
    "f32_1": ((1,), "float32"),
    "f32_7": ((7,), "float32"),
    "f32_1000": ((1000,), "float32"),
    "f32_1e6": ((1000000,), "float32"),
    "f32_odd": ((3, 5, 7), "float32"),
    "f64_7": ((7,), "float64"),
    "f64_1000": ((10, 100), "float64"),
    "f64_1e6": ((1000, 1000), "float64"),
    "f16_7": ((7,), "float16"),
    "f16_1000": ((1000,), "float16"),
    "f16_odd": ((13, 77), "float16"),
    "bf16_1000": ((1000,), "bfloat16"),
}


def allreduce_input(case, rank):
    shape, dtype = ALLREDUCE_CASES[case]
    seed = (sum(map(ord, case)) * 1009 + rank * 7919) % (2 ** 31)
    x = np.random.default_rng(seed).uniform(-1, 1, size=shape)
    if dtype == "bfloat16":
        # Round to bfloat16 (keep the top 16 bits of float32) so the input is exact.
        b = np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
        return b.view(np.float32)
    return x.astype(dtype)


def allgather_input(rank):
    return np.arange((rank + 1) * 3 * 2, dtype=np.float32).reshape(rank + 1, 3, 2) + 100 * rank


def broadcast_input(rank):
    return np.full((4, 5), rank, dtype=np.float64) + np.arange(20).reshape(4, 5)
