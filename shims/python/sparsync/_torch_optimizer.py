"""Compression and DistributedOptimizer of sparsync.torch (Horovod's API).

Each parameter gets a shared buffer registered with the daemon under op GRADIENT and the name
"gradient.<parameter name>". A hook on the parameter's AccumulateGrad node copies the gradient
into the buffer and posts READY as soon as backward has produced it, so reduction overlaps the
rest of backward. step() (or synchronize()) posts the parameters that got no gradient (zeros, so
no node waits for them), waits for every DONE and copies the averaged gradient into p.grad.

A parameter on a CUDA device gets a persistent device buffer instead, shared with the daemon
through CUDA IPC (docs/intake.md): the copy into it, the daemon's read of it and the copy of the
result out of it are ordered on the current CUDA stream by two interprocess events.
"""

import contextlib

import torch

from sparsync import _torch_state as shared
from sparsync import _wire as W
from sparsync._errors import SparsyncError


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
        self._requires_update = [p for p in all_params if p.requires_grad]
        self._delay = {id(p): backward_passes_per_step for p in self._requires_update}
        self._posted = {}       # id(p) -> (p, registration, compression ctx)
        self._registrations = {}  # id(p) -> (wire dtype, torch dtype, registration)
        self._grad_accs = []
        self._synchronized = False
        self._should_synchronize = True
        shared.client()  # fail early when init() was not called
        self._register_hooks()

    def _register_hooks(self):
        for p in self._requires_update:
            p_tmp = p.expand_as(p)
            grad_acc = p_tmp.grad_fn.next_functions[0][0]
            grad_acc.register_hook(self._make_hook(p))
            self._grad_accs.append(grad_acc)

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

    def _registration(self, p, dtype):
        entry = self._registrations.get(id(p))
        if entry is not None and entry[1] == dtype:
            return entry[2]
        client = shared.client()
        if entry is not None:
            client.unregister(entry[2])
        wire, _ = shared.wire_dtype("allreduce", dtype, self._op)
        if wire not in (W.FLOAT32, W.FLOAT64, W.FLOAT16, W.BFLOAT16):
            raise SparsyncError("gradient of '%s' has dtype %s; DistributedOptimizer reduces "
                                "float32/float64/float16/bfloat16" % (self._names[id(p)], dtype))
        compressor, density = self._sparsify.wire if self._sparsify else (0, 0.0)
        name = "gradient." + self._names[id(p)]
        if p.is_cuda and p.numel() > 0:
            # CUDA IPC intake: a persistent device buffer the daemon reads and writes in place.
            buf = torch.empty(p.numel(), dtype=dtype, device=p.device)
            reg = client.register_cuda(name, W.OP_GRADIENT, wire, tuple(p.shape), buf.device.index,
                                       buf.data_ptr(), self._op, 0, compressor, density)
            reg.buffer = buf
        else:
            reg = client.register(name, W.OP_GRADIENT, wire, tuple(p.shape), self._op, 0,
                                  compressor, density)
        self._registrations[id(p)] = (wire, dtype, reg)
        return reg

    def _post(self, p):
        with shared.state.lock:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            compressed, ctx = self._compression.compress(grad.detach())
            reg = self._registration(p, compressed.dtype)
            buf = reg.buffer
            if buf is None:
                buf = shared.buffer_view(reg, compressed.dtype)
            if buf.numel():
                buf.copy_(compressed.reshape(-1))  # CUDA: queued on the current stream
                if self._op == shared.Average and self.backward_passes_per_step > 1:
                    buf.mul_(1.0 / self.backward_passes_per_step)
            shared.client().post(reg, _cuda_stream(reg))
            self._posted[id(p)] = (p, reg, ctx, compressed.dtype)

    def synchronize(self):
        """Waits for every gradient's reduction and puts the result into p.grad."""
        for p in self._requires_update:
            if id(p) not in self._posted:
                self._post(p)  # no gradient this step (or not enough passes): still take part
        client = shared.client()
        try:
            for p, reg, ctx, sent_dtype in self._posted.values():
                shared.wait(client, reg, _cuda_stream(reg))
            for p, reg, ctx, sent_dtype in self._posted.values():
                if reg.buffer is not None:  # the current stream waits for the daemon's copy
                    result = reg.buffer.view(p.shape)
                else:
                    result = shared.buffer_view(reg, sent_dtype).reshape(p.shape)
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
        """Releases the shared gradient buffers (the optimizer is unusable afterwards)."""
        client = shared.state.client
        for _, _, reg in self._registrations.values():
            if client is not None:
                client.unregister(reg)
        self._registrations.clear()


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
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, sparsify)
