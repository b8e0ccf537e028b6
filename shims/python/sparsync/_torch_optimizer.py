"""Compression and DistributedOptimizer of sparsync.torch (Horovod's API).

Each parameter gets a shared buffer registered with the daemon under op GRADIENT and the name
"gradient.<parameter name>". A hook on the parameter's AccumulateGrad node posts READY as soon as
backward has produced the gradient, so reduction overlaps the rest of backward. step() (or
synchronize()) posts the parameters that got no gradient (zeros, so no node waits for them) and
waits for every DONE.

The gradient lives in the shared buffer: after the first step p.grad is a tensor over it, so
backward accumulates where the daemon reads and the daemon writes the average back in place, with
no copy in either direction. zero_grad() without an argument zeroes such a gradient in place
and keeps it (torch 2's own default, set_to_none=True, would make backward allocate a new one
every step, each then copied in). Where p.grad was replaced (an explicit
zero_grad(set_to_none=True), module.zero_grad() under torch 2, a script that assigns p.grad) the
new gradient is copied in once and p.grad becomes the shared tensor again.
Parameters whose layout the buffer cannot hold as is (not contiguous, channels-last, sent as
float16 by Compression.fp16) take one copy in and one out, as the log says at debug level. As in
Horovod, a gradient must not change while its reduction is in flight (between backward and
step()): call synchronize() before clipping or unscaling it; a change is detected and raised.

A parameter on a CUDA device gets a persistent device buffer instead, shared with the daemon
through CUDA IPC (docs/intake.md): the copy into it, the daemon's read of it and the copy of the
result out of it are ordered on the current CUDA stream by two interprocess events.

With a process set other than the global one (process_set=), the gradients are reduced among
the set's members alone, exactly and dense: each is registered as an explicit ALLREDUCE with the
set's members (the daemon's GRADIENT op, which it may compress, spans every rank), under
"ps<id>/gradient.<parameter name>", in host shared memory (a CUDA gradient is copied to it and
back); sparsify= other than Dense is refused there.
"""

import contextlib
import logging

import torch

from sparsync import _torch_process_sets as sets
from sparsync import _torch_state as shared
from sparsync import _wire as W
from sparsync._compressors import (  # noqa: F401  (part of sparsync.torch)
    DGC,
    Compressor,
    Dense,
    GaussianK,
    GlobalTopK,
    NoneCompressor,
    RandomK,
    Sparsify,
    Threshold,
    TopK,
    Wangni,
)
from sparsync._errors import SparsyncError

_log = logging.getLogger("sparsync")


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


class _Slot:
    """One parameter's registration with the daemon, and the tensor over its shared region that
    serves as the parameter's gradient when the layout allows (`grad`, else None)."""

    __slots__ = ("reg", "wire", "dtype", "grad", "address", "posted", "version")

    def __init__(self, reg, wire, dtype, grad):
        self.reg, self.wire, self.dtype, self.grad = reg, wire, dtype, grad
        # Where the region is: `grad` keeps its identity when a module's .double() or a script
        # sets its .data, but then no longer holds the region's memory.
        self.address = grad.data_ptr() if grad is not None else None
        # The p.grad that was posted and its _version then: a write while in flight changes it
        # (in shared memory a race with the daemon; copied in, a change the result would drop).
        self.posted, self.version = None, None


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=shared.Average, sparsify=None, gradient_predivide_factor=1.0,
                 sparse_as_dense=False, process_set=None):
        super(self.__class__, self).__init__(params)
        self._process_set = process_set  # resolved: None for the global set
        self._predivide = float(gradient_predivide_factor)
        self._sparse_as_dense = bool(sparse_as_dense)
        self._sparse = _SparseGradients(self)
        if sparsify is not None and not isinstance(sparsify, Sparsify):
            raise TypeError("sparsify must be e.g. sparsync.torch.TopK(density=0.001), got %r"
                            % (sparsify,))
        self._sparsify = sparsify
        if op not in (shared.Average, shared.Sum):
            raise ValueError("DistributedOptimizer supports op=Average or op=Sum")
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
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
                # Runs once p.grad holds this backward's gradient, also under torch.compile.
                self._grad_accs.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))
                continue
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
        key = id(p)

        def hook(*ignore):
            left = self._delay[key]
            if left <= 0 and key in self._posted:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")
            self._delay[key] = left - 1
            if left == 1:
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
        ps = self._process_set
        if ps is not None:
            # The set's members alone: an exact ALLREDUCE of host memory (module docstring).
            reg = client.register(sets.full_name(ps, name), W.OP_ALLREDUCE, wire,
                                  tuple(p.shape), self._op, 0, members=sets.members(ps))
            if self._in_place_capable(p, dtype):
                grad = shared.buffer_view(reg, dtype).view(p.shape)
        elif p.is_cuda and p.numel() > 0:
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
        slot = self._slots.get(id(p))
        grad = p.grad
        if slot is not None and slot.grad is not None and grad is slot.grad \
                and grad.dtype == slot.dtype and grad.data_ptr() == slot.address \
                and id(p) not in self._sparse._known:
            # The steady state: backward accumulated into the shared region, and p.grad is the
            # tensor over it that synchronize() put there. What the general path below does for
            # it comes down to this: no conversion, no copy (slot.grad implies Compression.none
            # and a host tensor), the scaling, the post.
            with shared.state.lock:
                self._scale(slot.grad)
                slot.posted, slot.version = slot.grad, slot.grad._version
                shared.client().post(slot.reg)
                self._posted[id(p)] = (p, slot, None)
            return
        if self._sparse.takes(p):
            return  # an allgather of its indices and values (sparse_as_dense=False)
        with shared.state.lock:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            if grad.is_sparse:  # sparse_as_dense: reduced dense, made sparse again afterwards
                grad = grad.to_dense()
            compressed, ctx = self._compression.compress(grad.detach())
            with shared.collective_errors():  # a mismatch between ranks: HorovodInternalError
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
                self._scale(buf)
            slot.posted = p.grad
            slot.version = p.grad._version if p.grad is not None else None
            shared.client().post(reg, _cuda_stream(reg))
            self._posted[id(p)] = (p, slot, ctx)

    def _scale(self, buf):
        """Scales a gradient before it is sent: 1/f of Horovod's split average (f after), and
        1/backward_passes_per_step for an average of accumulated passes."""
        scale = 1.0 / self._predivide
        if self._op == shared.Average and self.backward_passes_per_step > 1:
            scale /= self.backward_passes_per_step
        if scale != 1.0:
            buf.mul_(scale)

    def synchronize(self):
        """Waits for every gradient's reduction and puts the result into p.grad: for a gradient
        that lives in its shared buffer that is p.grad itself (no copy)."""
        for p in self._requires_update:
            if id(p) not in self._posted and not self._sparse.posted(p):
                self._post(p)  # no gradient this step (or not enough passes): still take part
        client = shared.client()
        try:
            for p, slot, ctx in self._posted.values():
                shared.wait(client, slot.reg, _cuda_stream(slot.reg))
            self._sparse.finish()
            for p, slot, ctx in self._posted.values():
                if slot.posted is not None and slot.posted._version != slot.version:
                    raise SparsyncError(
                        "the gradient of '%s' was modified while its reduction was in "
                        "flight (between backward and step()); call optimizer.synchronize() "
                        "before changing gradients (clipping, GradScaler.unscale_) and step() "
                        "inside optimizer.skip_synchronize()" % self._names[id(p)])
                if slot.grad is not None:
                    grad = p.grad
                    if grad is not slot.grad and (grad is None or grad.is_sparse
                                                  or not _same_memory(grad, slot.grad)):
                        p.grad = slot.grad  # from now on backward accumulates into it
                    continue
                if slot.reg.buffer is not None:  # the current stream waits for the daemon's copy
                    result = slot.reg.buffer.view(p.shape)
                else:
                    result = shared.buffer_view(slot.reg, slot.dtype).reshape(p.shape)
                result = self._compression.decompress(result, ctx)
                if self._predivide != 1.0:
                    result = result * self._predivide
                if p.grad is None or p.grad.is_sparse:
                    p.grad = result.to(dtype=p.dtype, device=p.device, copy=True)
                else:
                    p.grad.copy_(result)
            for p, slot, ctx in self._posted.values():
                if slot.grad is not None and self._predivide != 1.0:
                    slot.grad.mul_(self._predivide)
            self._sparse.restore_sparse_layout(self._posted.values())
        finally:
            for p, slot, ctx in self._posted.values():
                slot.posted = None  # holds no replaced gradient's memory past the step
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

    def zero_grad(self, set_to_none=None):
        """torch's zero_grad, except that without an argument a gradient living in its shared
        buffer is zeroed in place and kept, so that the next backward accumulates into it again
        (torch 2's default, set_to_none=True, would cost a copy per step). Every parameter has
        a gradient after step() anyway (one without is reduced as zeros), so only the copy
        differs. An explicit set_to_none is torch's."""
        if self._posted or self._sparse.any_posted():
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        base = super(self.__class__, self)
        if set_to_none is not None:
            return base.zero_grad(set_to_none=set_to_none)
        kept = []
        for p in self._requires_update:
            slot = self._slots.get(id(p))
            grad = p.grad
            if slot is not None and slot.grad is not None and grad is not None and (
                    grad is slot.grad or not grad.is_sparse and _same_memory(grad, slot.grad)):
                kept.append((p, grad))
        base.zero_grad()  # torch's default for the others
        for p, grad in kept:
            if p.grad is None:  # torch 2 let it go: zero it and give it back
                grad.zero_()
                p.grad = grad

    def unregister(self):
        """Releases the shared gradient buffers (the optimizer is unusable afterwards). Gradients
        that live in them keep their values: the memory stays while a tensor holds it."""
        client = shared.state.client
        for slot in self._slots.values():
            if client is not None:
                client.unregister(slot.reg)
        self._slots.clear()


class _SparseGradients:
    """Sparse gradients (nn.Embedding(sparse=True)) as Horovod reduces them: an allgather of every
    rank's indices and values (exact; the values divided by size() for Average), giving a sparse
    gradient that holds every rank's rows. With sparse_as_dense=True they go dense through the
    daemon like any gradient (compressible) and are made sparse again afterwards.

    A parameter counts as sparse from the first step its gradient is sparse on this rank; a rank
    whose first steps give it no gradient for such a parameter posts zeros densely, which the
    others' allgather does not match (the daemon names the mismatch)."""

    def __init__(self, opt):
        self._opt = opt
        self._known = {}   # id(p) -> (sparse_dim, dense shape rest) once p's gradient was sparse
        self._posted = {}  # id(p) -> (p, indices handle, values handle)

    def takes(self, p):
        """Posts p's sparse gradient and returns True, or returns False (a dense path)."""
        grad = p.grad
        if grad is not None and grad.is_sparse:
            self._known[id(p)] = grad.sparse_dim()
        if self._opt._sparse_as_dense or id(p) not in self._known:
            return False
        from sparsync import torch as hvd

        sparse_dim = self._known[id(p)]
        if grad is None or not grad.is_sparse:
            grad = torch.sparse_coo_tensor(torch.zeros((sparse_dim, 0), dtype=torch.int64),
                                           torch.zeros((0,) + tuple(p.shape[sparse_dim:]),
                                                       dtype=p.dtype), p.shape)
        grad = grad.detach().coalesce()
        name = "sparse_gradient." + self._opt._names[id(p)]
        ps = self._opt._process_set or sets.global_process_set
        # Indices are gathered transposed (one row per nonzero) so that ranks' rows concatenate.
        hi = hvd.allgather_async(grad.indices().t().contiguous(), name + ".indices", ps)
        hv = hvd.allgather_async(grad.values().contiguous(), name + ".values", ps)
        self._posted[id(p)] = (p, hi, hv)
        return True

    def posted(self, p):
        return id(p) in self._posted

    def any_posted(self):
        return bool(self._posted)

    def finish(self):
        """Waits for the posted allgathers and sets each p.grad to the gathered sparse tensor."""
        from sparsync import torch as hvd

        n = sets.set_size(self._opt._process_set)
        try:
            for p, hi, hv in self._posted.values():
                indices, values = hvd.synchronize(hi), hvd.synchronize(hv)
                if self._opt._op == shared.Average:
                    values = values / n
                p.grad = torch.sparse_coo_tensor(indices.t(), values, p.shape).coalesce()
        finally:
            self._posted.clear()

    def restore_sparse_layout(self, posted):
        """sparse_as_dense: gives parameters whose gradient was sparse a sparse gradient again."""
        for p, slot, ctx in posted:
            if id(p) in self._known and p.grad is not None and not p.grad.is_sparse:
                p.grad = p.grad.to_sparse(self._known[id(p)])


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
                         backward_passes_per_step=1, op=shared.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None, *, sparsify=None):
    """Wraps `optimizer` so that step() applies gradients averaged over all workers.

    Horovod's signature (an unknown keyword is a TypeError). The daemon compresses the gradients
    as configured (SPARSYNC_COMPRESSOR); `sparsify`, e.g. ``sparsync.torch.TopK(density=0.001)``,
    chooses the compressor for this optimizer instead.

    gradient_predivide_factor f (op=Average only, as in Horovod): gradients are scaled by 1/f
    before the sum and by f/size after it. sparse_as_dense: sparse gradients are densified and
    reduced like the others (then made sparse again); otherwise they go through an allgather
    (_SparseGradients). num_groups and groups are accepted: the daemon's planner forms its own
    merge groups (SPARSYNC_MERGE), which changes timing, never values. op=Adasum is refused (see
    sparsync.torch.Adasum's explanation in README).

    process_set: an added hvd.ProcessSet of which this rank is a member; only its members make
    and step the optimizer, and the gradients are averaged (or summed) over them alone. Such a
    set's gradients go as exact, dense allreduces (the daemon does not sparsify within a set):
    sparsify= other than Dense() raises NotImplementedError. The global set (the default) is the
    path described above.
    """
    if op == shared.Adasum:
        raise ValueError(
            "DistributedOptimizer(op=Adasum) is not supported by sparsync: Horovod's Adasum "
            "optimizer reduces model deltas with a data-dependent pairwise combination that the "
            "daemon's sum-based, sparsifying exchange cannot carry. Use op=Average (the "
            "default), optionally with sparsify=TopK(...); explicit allreduce(op=Adasum) works")
    if op not in (shared.Average, shared.Sum):
        raise ValueError("DistributedOptimizer supports op=Average or op=Sum, got %r" % (op,))
    if gradient_predivide_factor != 1.0:
        if op != shared.Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if not gradient_predivide_factor > 0:
            raise ValueError("gradient_predivide_factor must be > 0, got %r"
                             % (gradient_predivide_factor,))
    if num_groups != 0 or groups is not None:
        if groups is not None and not (isinstance(groups, int) or hasattr(groups, "__iter__")):
            raise ValueError("groups must be an int or a list of lists of parameters")
        _log.info("DistributedOptimizer: num_groups/groups accepted; the daemon's planner forms "
                  "the merge groups (SPARSYNC_MERGE)")
    ps = sets.resolve(process_set, "DistributedOptimizer")
    if ps is not None and isinstance(sparsify, Sparsify) and sparsify.name != "none":
        raise NotImplementedError(
            "DistributedOptimizer(process_set=%s, sparsify=%r): sparsync reduces a process set's "
            "gradients exactly and dense (an allreduce among its members); the daemon's "
            "sparsified exchange spans every rank. Drop sparsify= for this optimizer, or use the "
            "global set" % (ps, sparsify))
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression,
                  backward_passes_per_step, op, sparsify, gradient_predivide_factor,
                  sparse_as_dense, ps)
    # Groups added later (add_param_group) take their missing settings from the optimizer the
    # user made, not from the class's signature.
    wrapped.defaults = dict(optimizer.defaults)
    return wrapped
