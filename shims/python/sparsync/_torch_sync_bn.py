"""Horovod's SyncBatchNorm for sparsync.torch: batch normalization over the global batch.

In training, each forward sums the batch's per-channel count, sum and sum of squares over every
rank (one exact Sum allreduce, in float64), so every rank normalizes with the global mean and
variance; backward sums the two per-channel terms the input gradient needs (a second
allreduce). The affine parameters' gradients stay local, as in Horovod: DistributedOptimizer
averages them like any gradient. Running statistics use the unbiased global variance, as
torch.nn.BatchNorm does. In eval mode, or with one rank, it is torch's batch norm.

Every rank must run the same SyncBatchNorm layers in the same order (the collectives are named
after the layer's creation index).
"""

import itertools

import torch
import torch.nn.functional as F

from sparsync import torch as _hvd

_instances = itertools.count()


def _stats_dims(x):
    return [0] + list(range(2, x.dim()))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, name):
        dims = _stats_dims(x)
        x64 = x.detach().to(torch.float64)
        count = torch.tensor([x.numel() // x.shape[1]], dtype=torch.float64)
        local = torch.cat([count, x64.sum(dims), (x64 * x64).sum(dims)])
        total = _hvd.allreduce(local, name=name + ".forward", op=_hvd.Sum)
        channels = x.shape[1]
        n = total[0]
        mean = total[1:1 + channels] / n
        var = torch.clamp(total[1 + channels:] / n - mean * mean, min=0.0)
        invstd = torch.rsqrt(var + eps)
        shape = [1, channels] + [1] * (x.dim() - 2)
        xhat = (x64 - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.detach().to(torch.float64).view(shape)
        if bias is not None:
            y = y + bias.detach().to(torch.float64).view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.name, ctx.n, ctx.has_bias = name, n, bias is not None
        mean, var = mean.to(x.dtype), var.to(x.dtype)
        ctx.mark_non_differentiable(mean, var, n)
        return y.to(x.dtype), mean, var, n

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar, _dn):
        xhat, invstd, weight = ctx.saved_tensors
        dims = _stats_dims(dy)
        channels = dy.shape[1]
        shape = [1, channels] + [1] * (dy.dim() - 2)
        dy64 = dy.to(torch.float64)
        sum_dy = dy64.sum(dims)
        sum_dy_xhat = (dy64 * xhat).sum(dims)
        total = _hvd.allreduce(torch.cat([sum_dy, sum_dy_xhat]), name=ctx.name + ".backward",
                               op=_hvd.Sum)
        g_sum_dy, g_sum_dy_xhat = total[:channels], total[channels:]
        scale = invstd if weight is None else invstd * weight.detach().to(torch.float64)
        dx = scale.view(shape) * (dy64 - (g_sum_dy / ctx.n).view(shape)
                                  - xhat * (g_sum_dy_xhat / ctx.n).view(shape))
        dweight = sum_dy_xhat.to(dy.dtype) if weight is not None else None
        dbias = sum_dy.to(dy.dtype) if ctx.has_bias else None
        return dx.to(dy.dtype), dweight, dbias, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """torch.nn.BatchNorm{1,2,3}d whose training statistics span every rank's batch."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self._sync_name = "sync_batch_norm.%d" % next(_instances)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def _momentum(self):
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # a cumulative moving average
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def forward(self, input):
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or _hvd.size() == 1:
            momentum = self._momentum() if use_batch_stats else 0.0
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, use_batch_stats, momentum, self.eps)
        momentum = self._momentum()
        y, mean, var, n = _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.eps,
                                                       self._sync_name)
        if self.track_running_stats:
            with torch.no_grad():
                unbiased = var * (n / (n - 1)) if n > 1 else var
                self.running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        return y
