"""Compression and DistributedOptimizer of sparsync.torch (Horovod's API).

Each parameter gets a shared buffer registered with the daemon under op GRADIENT and the name
"gradient.<parameter name>". A hook on the parameter's AccumulateGrad node posts READY as soon as
backward has produced the gradient, so reduction overlaps the rest of backward. step() (or
synchronize()) posts the parameters that got no gradient (zeros, so no node waits for them) and
waits for every DONE.

The gradient lives in the shared buffer: after the first step p.grad is a tensor over it, so
backward accumulates where the daemon reads and the daemon writes the average back in place, with
no copy in either direction. Where p.grad was replaced (zero_grad(set_to_none=True), a script that
assigns p.grad) the new gradient is copied in once and p.grad becomes the shared tensor again.
Parameters whose layout the buffer cannot hold as is (not contiguous, channels-last, sent as
float16 by Compression.fp16) take one copy in and one out, as the log says at debug level. As in
Horovod, a gradient must not change while its reduction is in flight (between backward and
step()): call synchronize() before clipping or unscaling it; a change is detected and raised.

A parameter on a CUDA device gets a persistent device buffer instead, shared with the daemon
through CUDA IPC (docs/intake.md): the copy into it, the daemon's read of it and the copy of the
result out of it are ordered on the current CUDA stream by two interprocess events.
"""

import contextlib
import logging

import torch

from sparsync import _torch_state as shared
from sparsync import _wire as W
from sparsync._errors import SparsyncError

_log = logging.getLogger("sparsync")


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


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (halves the bytes; the daemon sums in float32)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor


class Sparsify:
    """The compressor DistributedOptimizer asks the daemon to apply to its gradients, overriding
    SPARSYNC_COMPRESSOR / SPARSYNC_DENSITY for them; e.g. ``sparsify=TopK(density=0.001)``.
    ``density=None`` keeps the daemon's SPARSYNC_DENSITY. Explicit allreduce stays exact."""

    def __init__(self, name, density=None):
        if name not in W.COMPRESSORS or name == "default":
            raise ValueError("unknown compressor %r; accepted: %s"
                             % (name, ", ".join(k for k in W.COMPRESSORS if k != "default")))
        if density is not None and not 0.0 < density <= 1.0:
            raise ValueError("density must be in (0, 1], got %r" % (density,))
        self.name = name
        self.density = density

    @property
    def wire(self):
        return W.COMPRESSORS[self.name], float(self.density or 0.0)

    def __repr__(self):
        return "Sparsify(%r, density=%r)" % (self.name, self.density)


def TopK(density=None):
    """Exact top-k with error feedback (Aji & Heafield 2017; Stich et al. 2018)."""
    return Sparsify("topk", density)


def GlobalTopK(density=None):
    """gTop-k (Shi et al., ICDCS 2019): global top-k by pairwise merge-and-reselect."""
    return Sparsify("gtopk", density)


def RandomK(density=None):
    """k coordinates drawn with a seed shared by all nodes, with error feedback."""
    return Sparsify("randomk", density)


def Threshold(density=None):
    """|x| above a threshold (SPARSYNC_THRESHOLD, or estimated from a sample for the density)."""
    return Sparsify("threshold", density)


def GaussianK(density=None):
    """Gaussian-k (Shi et al. 2019): threshold from the mean and deviation of the gradient."""
    return Sparsify("gaussiank", density)


def Wangni(density=None):
    """Unbiased optimal sparsification of Wangni et al. (NeurIPS 2018); no error feedback."""
    return Sparsify("wangni", density)


def DGC(density=None):
    """Deep Gradient Compression (Lin et al., ICLR 2018). It keeps its own momentum: give the
    wrapped optimizer momentum=0."""
    return Sparsify("dgc", density)


def Dense():
    """No compression for this optimizer's gradients, whatever SPARSYNC_COMPRESSOR says."""
    return Sparsify("none")


class _Slot:
    """One parameter's registration with the daemon, and the tensor over its shared region that
    serves as the parameter's gradient when the layout allows (`grad`, else None)."""

    __slots__ = ("reg", "wire", "dtype", "grad", "version")

    def __init__(self, reg, wire, dtype, grad):
        self.reg, self.wire, self.dtype, self.grad = reg, wire, dtype, grad
        self.version = None  # grad._version when posted (a write while in flight changes it)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=shared.Average, sparsify=None):
        super(self.__class__, self).__init__(params)
        if sparsify is not None and not isinstance(sparsify, Sparsify):
            raise TypeError("sparsify must be e.g. sparsync.torch.TopK(density=0.001), got %r"
                            % (sparsify,))
        self._sparsify = sparsify
        if op not in (shared.Average, shared.Sum):
            raise SparsyncError("DistributedOptimizer supports op=Average or op=Sum")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._compression = compression
        self._op = op
        self.backward_passes_per_step = backward_passes_per_step
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("param.%d.%d" % (gi, pi), p)
                                for gi, g in enumerate(self.param_groups)
                                for pi, p in enumerate(g["params"])]
        if any(not isinstance(n, tuple) for n in named_parameters):
            raise ValueError("named_parameters should be a sequence of (name, parameter), "
                             "usually model.named_parameters()")
        names = [n for n, _ in named_parameters]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError("parameter names in named_parameters must be unique: %s"
                             % ", ".join(dups))
        self._names = {id(p): n for n, p in named_parameters}
        unnamed = [p for p in all_params if id(p) not in self._names]
        if unnamed:
            raise ValueError("named_parameters was given but %d optimizer parameters are not in "
                             "it" % len(unnamed))
        self._requires_update = []
        self._delay = {}
        self._posted = {}  # id(p) -> (p, slot, compression ctx)
        self._slots = {}   # id(p) -> _Slot
        self._grad_accs = []
        self._copying = set()  # names already said to take the copying path (debug, once)
        self._synchronized = False
        self._should_synchronize = True
        shared.client()  # fail early when init() was not called
        self._track([p for p in all_params if p.requires_grad])

    def _track(self, params):
        """Hooks `params` (new ones only) so that each posts its gradient as backward makes it."""
        for p in params:
            if id(p) in self._delay:
                continue
            self._requires_update.append(p)
            self._delay[id(p)] = self.backward_passes_per_step
            p_tmp = p.expand_as(p)
            grad_acc = p_tmp.grad_fn.next_functions[0][0]
            grad_acc.register_hook(self._make_hook(p))
            self._grad_accs.append(grad_acc)

    def add_param_group(self, param_group):
        """Parameters added after construction are reduced too; unnamed ones are called
        'param.<group>.<index>', which every worker must then add in the same order."""
        super(self.__class__, self).add_param_group(param_group)
        if not hasattr(self, "_names"):
            return  # the base constructor's own calls: __init__ hooks everything afterwards
        gi = len(self.param_groups) - 1
        for pi, p in enumerate(self.param_groups[gi]["params"]):
            self._names.setdefault(id(p), "param.%d.%d" % (gi, pi))
        self._track([p for p in self.param_groups[gi]["params"] if p.requires_grad])

    def _make_hook(self, p):
        def hook(*ignore):
            if id(p) in self._posted and self._delay[id(p)] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")
            self._delay[id(p)] -= 1
            if self._delay[id(p)] == 0:
                self._post(p)
        return hook

    def _in_place_capable(self, p, dtype):
        """Whether p's gradient can live in its shared region: the region holds it in p's own
        layout (a host tensor, contiguous, sent in its own dtype). Otherwise it takes one copy in
        and one out."""
        return (self._compression is NoneCompressor and not p.is_cuda and dtype == p.dtype
                and p.is_contiguous() and p.numel() > 0)

    def _slot(self, p, dtype):
        slot = self._slots.get(id(p))
        if slot is not None and slot.dtype == dtype:
            return slot
        client = shared.client()
        if slot is not None:  # the dtype changed: its tensors keep their memory, not the daemon
            client.unregister(slot.reg)
        wire, _ = shared.wire_dtype("allreduce", dtype, self._op)
        if wire not in (W.FLOAT32, W.FLOAT64, W.FLOAT16, W.BFLOAT16):
            raise SparsyncError("gradient of '%s' has dtype %s; DistributedOptimizer reduces "
                                "float32/float64/float16/bfloat16" % (self._names[id(p)], dtype))
        compressor, density = self._sparsify.wire if self._sparsify else (0, 0.0)
        name = "gradient." + self._names[id(p)]
        grad = None
        if p.is_cuda and p.numel() > 0:
            # CUDA IPC intake: a persistent device buffer the daemon reads and writes in place.
            buf = torch.empty(p.numel(), dtype=dtype, device=p.device)
            reg = client.register_cuda(name, W.OP_GRADIENT, wire, tuple(p.shape), buf.device.index,
                                       buf.data_ptr(), self._op, 0, compressor, density)
            reg.buffer = buf
        else:
            reg = client.register(name, W.OP_GRADIENT, wire, tuple(p.shape), self._op, 0,
                                  compressor, density)
            if self._in_place_capable(p, dtype):
                grad = shared.buffer_view(reg, dtype).view(p.shape)
        slot = _Slot(reg, wire, dtype, grad)
        self._slots[id(p)] = slot
        return slot

    def _post(self, p):
        with shared.state.lock:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            compressed, ctx = self._compression.compress(grad.detach())
            slot = self._slot(p, compressed.dtype)
            reg = slot.reg
            # Backward wrote the gradient where the daemon reads it: nothing to copy.
            in_place = slot.grad is not None and _same_memory(compressed, slot.grad)
            buf = slot.grad if in_place else reg.buffer
            if buf is None:
                buf = shared.buffer_view(reg, compressed.dtype)
                if self._names[id(p)] not in self._copying:
                    self._copying.add(self._names[id(p)])
                    _log.debug("gradient of '%s' copied into its shared buffer (%s)",
                               self._names[id(p)],
                               "first step, or its gradient was replaced" if slot.grad is not None
                               else "its layout or compression keeps it out of shared memory")
            if buf.numel():
                if not in_place:
                    buf.view(-1).copy_(compressed.reshape(-1))  # CUDA: on the current stream
                if self._op == shared.Average and self.backward_passes_per_step > 1:
                    buf.mul_(1.0 / self.backward_passes_per_step)
            slot.version = slot.grad._version if slot.grad is not None else None
            shared.client().post(reg, _cuda_stream(reg))
            self._posted[id(p)] = (p, slot, ctx)

    def synchronize(self):
        """Waits for every gradient's reduction and puts the result into p.grad: for a gradient
        that lives in its shared buffer that is p.grad itself (no copy)."""
        for p in self._requires_update:
            if id(p) not in self._posted:
                self._post(p)  # no gradient this step (or not enough passes): still take part
        client = shared.client()
        try:
            for p, slot, ctx in self._posted.values():
                shared.wait(client, slot.reg, _cuda_stream(slot.reg))
            for p, slot, ctx in self._posted.values():
                if slot.grad is not None:
                    if slot.grad._version != slot.version:
                        raise SparsyncError(
                            "the gradient of '%s' was modified while its reduction was in "
                            "flight (between backward and step()); call optimizer.synchronize() "
                            "before changing gradients (clipping, GradScaler.unscale_) and step() "
                            "inside optimizer.skip_synchronize()" % self._names[id(p)])
                    if p.grad is None or not _same_memory(p.grad, slot.grad):
                        p.grad = slot.grad  # from now on backward accumulates into it
                    continue
                if slot.reg.buffer is not None:  # the current stream waits for the daemon's copy
                    result = slot.reg.buffer.view(p.shape)
                else:
                    result = shared.buffer_view(slot.reg, slot.dtype).reshape(p.shape)
                result = self._compression.decompress(result, ctx)
                if p.grad is None:
                    p.grad = result.to(dtype=p.dtype, device=p.device, copy=True)
                else:
                    p.grad.copy_(result)
        finally:
            self._posted.clear()
            for p in self._requires_update:
                self._delay[id(p)] = self.backward_passes_per_step
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Lets step() skip synchronize() after an explicit call (e.g. for gradient clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                import warnings
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(); this reduces the gradients "
                              "a second time.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._posted:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def unregister(self):
        """Releases the shared gradient buffers (the optimizer is unusable afterwards). Gradients
        that live in them keep their values: the memory stays while a tensor holds it."""
        client = shared.state.client
        for slot in self._slots.values():
            if client is not None:
                client.unregister(slot.reg)
        self._slots.clear()


def _same_memory(a, b):
    """Whether `a` and `b` are the same elements in the same memory (one may be a view)."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


def _cuda_stream(reg):
    """The current stream of a CUDA registration's device (as an int), None for host ones."""
    if reg.buffer is None:
        return None
    return torch.cuda.current_stream(reg.buffer.device).cuda_stream


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=shared.Average, sparsify=None,
                         **unsupported):
    """Wraps `optimizer` so that step() applies gradients averaged over all workers.

    The daemon compresses the gradients as configured (SPARSYNC_COMPRESSOR); `sparsify`, e.g.
    ``sparsync.torch.TopK(density=0.001)``, chooses the compressor for this optimizer instead.

    Same contract as horovod.torch.DistributedOptimizer; Adasum, process sets and
    gradient_predivide_factor other than 1 are not supported.
    """
    if unsupported.get("gradient_predivide_factor", 1.0) != 1.0 or unsupported.get(
            "process_set") is not None or unsupported.get("groups") is not None:
        raise SparsyncError("DistributedOptimizer: gradient_predivide_factor, groups and "
                            "process_set are not supported by sparsync")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression,
                  backward_passes_per_step, op, sparsify)
    # Groups added later (add_param_group) take their missing settings from the optimizer the
    # user made, not from the class's signature.
    wrapped.defaults = dict(optimizer.defaults)
    return wrapped
