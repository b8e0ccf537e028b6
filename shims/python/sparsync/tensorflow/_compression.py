"""Compression of sparsync.tensorflow (Horovod's): a cast before the reduction and back after.
Independent of the daemon's sparsification (``sparsify=``), which may come on top."""

import tensorflow as tf

from sparsync._compressors import Compressor, NoneCompressor  # noqa: F401


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes; the daemon sums in float32)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
