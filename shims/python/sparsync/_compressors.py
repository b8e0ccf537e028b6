"""The daemon-side gradient compressors a shim can ask for, per optimizer or per tape:
``sparsify=TopK(density=0.001)``, and the interface of Horovod's shim-side ``Compression``
(each framework adds its float16 cast). Framework-neutral: both shims export these. Explicit
allreduce is never compressed by the daemon.
"""

from sparsync import _wire as W

# factory name -> (wire name, what it is)
_KINDS = {
    "TopK": ("topk", "exact top-k with error feedback (Aji & Heafield 2017; Stich et al. 2018)"),
    "GlobalTopK": ("gtopk", "gTop-k (Shi et al., ICDCS 2019): global top-k by pairwise "
                            "merge-and-reselect"),
    "RandomK": ("randomk", "k coordinates drawn with a seed shared by all nodes, with error "
                           "feedback"),
    "Threshold": ("threshold", "|x| above a threshold (SPARSYNC_THRESHOLD, or estimated from a "
                               "sample for the density)"),
    "GaussianK": ("gaussiank", "Gaussian-k (Shi et al. 2019): threshold from the mean and "
                               "deviation of the gradient"),
    "Wangni": ("wangni", "unbiased optimal sparsification of Wangni et al. (NeurIPS 2018); no "
                         "error feedback"),
    "DGC": ("dgc", "Deep Gradient Compression (Lin et al., ICLR 2018); it keeps its own "
                   "momentum: give the wrapped optimizer momentum=0"),
}


class Compressor:
    """Interface: compress before the reduction, decompress after (Horovod's)."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class Sparsify:
    """The compressor the daemon applies to one optimizer's (or tape's) gradients, instead of
    SPARSYNC_COMPRESSOR / SPARSYNC_DENSITY. ``density=None`` keeps the daemon's density."""

    def __init__(self, name, density=None):
        accepted = [k for k in W.COMPRESSORS if k != "default"]
        if name not in accepted:
            raise ValueError("unknown compressor %r; accepted: %s" % (name, ", ".join(accepted)))
        if density is not None and not 0.0 < density <= 1.0:
            raise ValueError("density must be in (0, 1], got %r" % (density,))
        self.name, self.density = name, density

    @property
    def wire(self):
        """(wire compressor code, density; 0.0 for the daemon's)."""
        return W.COMPRESSORS[self.name], float(self.density or 0.0)

    def __repr__(self):
        return "Sparsify(%r, density=%r)" % (self.name, self.density)


def _factory(public, wire_name, doc):
    def make(density=None):
        return Sparsify(wire_name, density)
    make.__name__ = make.__qualname__ = public
    make.__doc__ = doc[0].upper() + doc[1:] + "."
    return make


TopK, GlobalTopK, RandomK, Threshold, GaussianK, Wangni, DGC = (
    _factory(public, *_KINDS[public]) for public in
    ("TopK", "GlobalTopK", "RandomK", "Threshold", "GaussianK", "Wangni", "DGC"))


def Dense():
    """No compression for these gradients, whatever SPARSYNC_COMPRESSOR says."""
    return Sparsify("none")


def wire_of(sparsify):
    """(compressor code, density) for a Sparsify or None (the daemon's choice); TypeError else."""
    if sparsify is None:
        return W.COMPRESSOR_DEFAULT, 0.0
    if not isinstance(sparsify, Sparsify):
        raise TypeError("sparsify must be e.g. TopK(density=0.001), got %r" % (sparsify,))
    return sparsify.wire
