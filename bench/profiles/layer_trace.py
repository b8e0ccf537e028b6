"""One traced training step of a model on the CPU: its layers, their FLOPs, and gradient order.

`trace` runs one forward and backward pass on a small batch and records
- every leaf module that ran, in forward order, with the FLOPs and output elements of one sample:
  convolutions and linear layers (and each LSTM layer's input and recurrent halves) as
  multiply-adds x 2 ("matmul" work), everything else (batch norm, activations, pooling, dropout,
  embedding look-ups) by the elements it writes ("elementwise" work);
- the gradient tensors in the order their AccumulateGrad hooks fire, as in make_profiles.py.

Functional operations that are not modules (F.relu, residual additions, torch.cat) are not seen;
the derived profiles say so. Used by gpu_profiles.py; the times it measures are not used.
"""

import torch.nn as nn

MATMUL = (nn.Conv2d, nn.Linear, nn.LSTM)


class Layer:
    """A unit of work whose gradients become ready together: a module, or one half (input or
    recurrent weights) of one LSTM layer."""

    def __init__(self, key, module_name, kind, flops, elements, tensors, kernels=1):
        self.key, self.module_name, self.kind = key, module_name, kind
        self.flops, self.elements = flops, elements  # per sample
        self.tensors = tensors  # parameter names, [] for parameter-free modules
        self.kernels = kernels  # sequential kernel launches (an LSTM's recurrence: one a step)

    def __repr__(self):
        return "Layer(%s, %s, flops=%d, elements=%d, %d tensors)" % (
            self.key, self.kind, self.flops, self.elements, len(self.tensors))


def _own_params(module):
    return [n for n, _ in module.named_parameters(recurse=False)]


def _lstm_layers(name, m, inputs, batch):
    """An LSTM as 2 * num_layers Layers in forward order: per layer l, the input half
    (weight_ih, bias_ih), then the recurrent half (weight_hh, bias_hh), whose gradients backward
    makes ready first; FLOPs 2 * steps * 4H * (the layer's input or H). The input half is one
    product over all steps; the recurrent half one per step (each needs the previous state)."""
    x = inputs[0]
    steps = x.shape[0] if not m.batch_first else x.shape[1]
    h = m.hidden_size
    out = []
    for l in range(m.num_layers):
        width = m.input_size if l == 0 else h * (2 if m.bidirectional else 1)
        for half, fan_in in (("ih", width), ("hh", h)):
            names = ["%s.%s_%s_l%d" % (name, w, half, l) for w in ("weight", "bias")]
            names = [n for n in names if n.split(".")[-1] in dict(m.named_parameters())]
            out.append(Layer("%s.%s_l%d" % (name, half, l), name, "matmul",
                             2 * steps * 4 * h * fan_in, steps * 4 * h, names,
                             kernels=steps if half == "hh" else 1))
    return out


def trace(model, inputs, loss_of, batch):
    """Layers in forward order and parameter names in backward order; `batch` is the number of
    samples in `inputs` (FLOPs are reported per sample)."""
    layers, handles = [], []

    def hook_for(name, m):
        def hook(module, args, output):
            if isinstance(module, nn.LSTM):
                layers.extend(_lstm_layers(name, module, args, batch))
                return
            out = output[0] if isinstance(output, tuple) else output
            elements = out.numel() // batch
            if isinstance(module, nn.Conv2d):
                per_out = (module.in_channels // module.groups) * module.kernel_size[0] \
                    * module.kernel_size[1]
                flops, kind = 2 * elements * per_out, "matmul"
            elif isinstance(module, nn.Linear):
                flops, kind = 2 * elements * module.in_features, "matmul"
            else:
                flops, kind = 0, "elementwise"
            layers.append(Layer(name, name, kind, flops, elements,
                                ["%s.%s" % (name, p) if name else p for p in _own_params(m)]))
        return hook

    for name, m in model.named_modules():
        if not list(m.children()) or isinstance(m, nn.LSTM):
            handles.append(m.register_forward_hook(hook_for(name, m)))
    order, accs = [], []
    for name, p in model.named_parameters():
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(lambda *_, name=name: order.append(name))
        accs.append(acc)
    try:
        loss_of(model(inputs)).backward()
    finally:
        for h in handles:
            h.remove()
    seen = {n for layer in layers for n in layer.tensors}
    missing = [n for n, _ in model.named_parameters() if n not in seen]
    if missing:
        raise RuntimeError("parameters of no traced layer: %s" % missing[:5])
    return layers, order
