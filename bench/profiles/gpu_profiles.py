"""Writes GPU-speed model profiles for the cluster benchmark from published per-layer GPU times.

Two kinds, each file saying which in "measurement" (source, method, batch size):

- <model>_pipedream.json (alexnet, vgg16_imagenet, resnet50): PipeDream's published per-layer
  GPU profiles (pipedream.py; the files as published are in pipedream/), folded into the time
  until each gradient is ready as OMGS-SGD's profiling.py measures it. The tensors, their
  shapes and their backward order are those of the torchvision model, traced once on the CPU
  (layer_trace.py); every PipeDream layer is matched to the torchvision module of the same
  repr and parameter size, in forward order.
- <model>_flops.json (resnet20, vgg16 for CIFAR-10, inception_v4, lstm_ptb): no published
  per-layer GPU times exist, so they are derived: each layer's FLOPs (convolutions, linear and
  LSTM layers) or written elements (everything else), counted on sparsync's own model definition
  (models.py), times the rate the three PipeDream profiles achieve on the same kind of work
  (ms per FLOP, ms per element; fitted as ratio of sums, forward and backward apart), and no
  less than the shortest layer time they record (what a kernel launch costs at least). A
  parameter-free module's time counts toward the parameter layer that ran last before it.

    /usr/bin/python3 bench/profiles/gpu_profiles.py            # writes all seven
    /usr/bin/python3 bench/profiles/gpu_profiles.py --only resnet50_pipedream --check

--check recomputes and compares with the files instead of writing them. Real GPU measurements
come from make_profiles.py --device cuda on a GPU.
"""

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torchvision

import layer_trace
import make_profiles
import models
import pipedream

HERE = Path(__file__).resolve().parent
IMAGENET = (3, 224, 224)

# profile -> (PipeDream model directory, torchvision builder, dataset, description)
PUBLISHED = {
    "alexnet_pipedream": ("alexnet", torchvision.models.alexnet, "ImageNet",
                          "torchvision.models.alexnet()"),
    "vgg16_imagenet_pipedream": ("vgg16", torchvision.models.vgg16, "ImageNet",
                                 "torchvision.models.vgg16() (ImageNet VGG-16, no batch norm, "
                                 "138 M parameters)"),
    "resnet50_pipedream": ("resnet50", torchvision.models.resnet50, "ImageNet",
                           "torchvision.models.resnet50()"),
}
# profile -> (models.MODELS name, batch size per GPU: a choice, stated in the file)
DERIVED = {"resnet20_flops": ("resnet20", 128), "vgg16_flops": ("vgg16", 128),
           "inception_v4_flops": ("inception_v4", 128), "lstm_ptb_flops": ("lstm_ptb", 20)}
TRACE_BATCH = 2


def _imagenet_batch(batch):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((batch,) + IMAGENET, generator=gen)
    y = torch.randint(0, 1000, (batch,), generator=gen)
    return x, lambda out: torch.nn.functional.cross_entropy(out, y)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _traced(model, x, loss_of):
    torch.manual_seed(0)
    model.train()
    layers, order = layer_trace.trace(model, x, loss_of, TRACE_BATCH)
    shapes = {n: list(p.shape) for n, p in model.named_parameters()}
    return layers, order, shapes


def _backward_layers(layers, order):
    """Parameter layers in the order backward makes their first gradient ready; checks that a
    layer's gradients are ready one after the other."""
    owner = {t: layer for layer in layers for t in layer.tensors}
    out, seen = [], set()
    for name in order:
        layer = owner[name]
        if layer.key in seen:
            if out[-1].key != layer.key:
                raise RuntimeError("gradients of %s are not ready together" % layer.key)
            continue
        seen.add(layer.key)
        out.append(layer)
    return out


def _tensors(order, shapes, layer_ms, layers):
    """Profile tensors in backward order: a layer's first gradient carries the layer's time."""
    owner = {t: layer.key for layer in layers for t in layer.tensors}
    done, rows = set(), []
    for name in order:
        key = owner[name]
        ms = 0.0 if key in done else layer_ms[key]
        done.add(key)
        rows.append({"name": name, "shape": shapes[name], "numel": _numel(shapes[name]),
                     "backward_s": round(ms / 1e3, 9)})
    return rows


def fold_published(profile):
    """(profile document, work sums for the rates) of one PipeDream model."""
    directory, build, dataset, description = PUBLISHED[profile]
    nodes = pipedream.load(directory)
    batch = pipedream.batch_size(nodes, IMAGENET)
    model = build()
    x, loss_of = _imagenet_batch(TRACE_BATCH)
    layers, order, shapes = _traced(model, x, loss_of)
    param_layers = [l for l in layers if l.tensors]
    pd_nodes = pipedream.parameter_nodes(nodes)
    if len(param_layers) != len(pd_nodes):
        raise RuntimeError("%s: %d parameter layers in torchvision, %d in PipeDream's graph"
                           % (profile, len(param_layers), len(pd_nodes)))
    node_of = {}
    for layer, node in zip(param_layers, pd_nodes):
        module = model.get_submodule(layer.module_name)
        numel = sum(_numel(shapes[t]) for t in layer.tensors)
        if repr(module) != node.layer or 4 * numel != node.parameter_bytes:
            raise RuntimeError("%s: %s (%r, %d parameters) does not match %s (%r, %d bytes)"
                               % (profile, layer.key, repr(module), numel, node.name,
                                  node.layer, node.parameter_bytes))
        node_of[layer.key] = node.name
    backward = _backward_layers(layers, order)
    folded, orphan_ms = pipedream.fold(nodes, [node_of[l.key] for l in backward])
    layer_ms = {l.key: ms for l, (_, ms) in zip(backward, folded)}
    tensors = _tensors(order, shapes, layer_ms, layers)
    sums = {"matmul_flops": 0.0, "matmul_fwd_ms": 0.0, "matmul_bwd_ms": 0.0,
            "elem": 0.0, "elem_fwd_ms": 0.0, "elem_bwd_ms": 0.0, "floors": {}}

    def floor(kind, direction, t):
        if t > 0:
            key = "%s_%s_ms_floor" % (kind, direction)
            sums["floors"][key] = min(t, sums["floors"].get(key, t))
    by_key = {l.key: l for l in param_layers}
    matmul_nodes = set()
    for key, name in node_of.items():
        if by_key[key].kind == "matmul":
            n = nodes[name]
            sums["matmul_flops"] += by_key[key].flops * batch
            sums["matmul_fwd_ms"] += n.forward_ms
            sums["matmul_bwd_ms"] += n.backward_ms
            floor("matmul", "fwd", n.forward_ms)
            floor("matmul", "bwd", n.backward_ms)
            matmul_nodes.add(name)
    for n in nodes.values():
        if n.name not in matmul_nodes and not n.is_input:
            sums["elem"] += n.activation_bytes / 4
            sums["elem_fwd_ms"] += n.forward_ms
            sums["elem_bwd_ms"] += n.backward_ms
            floor("elementwise", "fwd", n.forward_ms)
            floor("elementwise", "bwd", n.backward_ms)
    total_ms = sum(ms for _, ms in folded)
    doc = {
        "model": profile, "dataset": dataset, "description": description,
        "input_shape": list(IMAGENET), "num_tensors": len(tensors),
        "total_numel": sum(t["numel"] for t in tensors),
        "forward_s": round(pipedream.forward_ms(nodes) / 1e3, 6),
        "backward_s": round(total_ms / 1e3, 6),
        "measurement": {
            "device": "gpu (published profile)", "batch_size": batch,
            "source": {"kind": "published per-layer GPU times",
                       "repository": pipedream.SOURCE_REPO, "commit": pipedream.SOURCE_COMMIT,
                       "path": pipedream.SOURCE_PATH % directory,
                       "copy": "bench/profiles/pipedream/%s.graph.txt" % directory,
                       "gpu": "not recorded in the profile (the PipeDream paper's clusters "
                              "used NVIDIA V100s)"},
            "method": "PipeDream's per-layer forward and backward ms (batch %d) folded into "
                      "the time until each gradient is ready, as OMGS-SGD's profiling.py "
                      "measures it: parameter layers in the torchvision model's backward "
                      "order; each layer's backward plus that of the parameter-free layers "
                      "(activations, pooling, additions) backward runs just before it goes "
                      "to the layer's first gradient, the rest of its gradients 0 s after; "
                      "forward_s: every layer's forward except the input node (data loading, "
                      "%.1f ms)" % (batch, sum(n.forward_ms for n in nodes.values()
                                               if n.is_input)),
            "unassigned_backward_ms": round(orphan_ms, 3),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench/profiles/gpu_profiles.py",
        },
        "tensors": tensors,
    }
    return doc, sums


def fit_rates(all_sums):
    """ms per GFLOP and per million elements, forward and backward, over the published
    profiles (ratio of sums), and the floors: the shortest non-zero time they record for a
    layer of each kind, what one kernel launch costs at least."""
    tot = {k: sum(s[k] for s in all_sums) for k in all_sums[0] if k != "floors"}
    rates = {"matmul_fwd_ms_per_gflop": tot["matmul_fwd_ms"] / tot["matmul_flops"] * 1e9,
             "matmul_bwd_ms_per_gflop": tot["matmul_bwd_ms"] / tot["matmul_flops"] * 1e9,
             "elementwise_fwd_ms_per_melem": tot["elem_fwd_ms"] / tot["elem"] * 1e6,
             "elementwise_bwd_ms_per_melem": tot["elem_bwd_ms"] / tot["elem"] * 1e6}
    for key in all_sums[0]["floors"]:
        rates[key] = min(s["floors"][key] for s in all_sums)
    return rates


def derive(profile, rates):
    name, batch = DERIVED[profile]
    spec = models.MODELS[name]
    model = spec.build()
    x, loss_of = spec.batch(TRACE_BATCH, torch.Generator().manual_seed(0))
    layers, order, shapes = _traced(model, x, loss_of)

    def ms(layer, direction):
        least = layer.kernels * rates["%s_%s_ms_floor" % (layer.kind, direction)]
        if layer.kind == "matmul":
            t = layer.flops * batch * rates["matmul_%s_ms_per_gflop" % direction] / 1e9
        else:
            t = layer.elements * batch * rates["elementwise_%s_ms_per_melem" % direction] / 1e6
        return max(least, t)

    layer_ms, owner, unassigned = {}, None, 0.0
    for layer in layers:
        if layer.tensors:
            owner = layer.key
            layer_ms[owner] = layer_ms.get(owner, 0.0) + ms(layer, "bwd")
        elif owner is None:
            unassigned += ms(layer, "bwd")
        else:
            layer_ms[owner] += ms(layer, "bwd")
    _backward_layers(layers, order)  # checks each layer's gradients are ready together
    tensors = _tensors(order, shapes, layer_ms, layers)
    forward = sum(ms(l, "fwd") for l in layers)
    return {
        "model": profile, "dataset": spec.dataset, "description": spec.description,
        "input_shape": list(spec.input_shape), "num_tensors": len(tensors),
        "total_numel": sum(t["numel"] for t in tensors),
        "forward_s": round(forward / 1e3, 6),
        "backward_s": round(sum(layer_ms.values()) / 1e3, 6),
        "measurement": {
            "device": "gpu (derived from FLOPs, not measured)", "batch_size": batch,
            "source": {"kind": "FLOP-scaled from published per-layer GPU times",
                       "rates_from": sorted(PUBLISHED), "repository": pipedream.SOURCE_REPO,
                       "commit": pipedream.SOURCE_COMMIT, "rates": {
                           k: round(v, 6) for k, v in rates.items()}},
            "method": "no published per-layer GPU profile exists for this model: each layer's "
                      "time = its FLOPs per sample (convolution, linear: 2 x multiply-adds; "
                      "LSTM: 2 x steps x 4H x (input or H) per layer and half) or its written "
                      "elements (every other module) x batch %d x the rate the PipeDream "
                      "profiles achieve on that kind of work (ratio of sums, forward and "
                      "backward apart), but no less than the shortest time they record for "
                      "a layer of that kind (per time step for an LSTM's recurrent half); "
                      "a parameter-free module's time counts toward the "
                      "parameter layer that ran last before it; functional operations that "
                      "are not modules (F.relu, residual additions, torch.cat) are not "
                      "counted; a layer's first gradient in backward order carries its time"
                      % batch,
            "unassigned_backward_ms": round(unassigned, 3),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench/profiles/gpu_profiles.py",
        },
        "tensors": tensors,
    }


def _same(a, b):
    """The profiles agree up to the date (times to 1e-9 s)."""
    strip = [dict(d, measurement={k: v for k, v in d["measurement"].items() if k != "date"})
             for d in (a, b)]
    return strip[0] == strip[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated profile names (default: all)")
    p.add_argument("--check", action="store_true",
                   help="compare with the files in --out-dir instead of writing")
    p.add_argument("--out-dir", default=str(HERE))
    args = p.parse_args(argv)
    wanted = [n for n in args.only.split(",") if n] or list(PUBLISHED) + list(DERIVED)
    unknown = [n for n in wanted if n not in PUBLISHED and n not in DERIVED]
    if unknown:
        p.error("unknown profiles %s; known: %s" % (unknown, ", ".join(
            list(PUBLISHED) + list(DERIVED))))
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    docs, sums = {}, []
    for name in PUBLISHED:  # the rates need all three, whichever are written
        docs[name], s = fold_published(name)
        sums.append(s)
    rates = fit_rates(sums)
    print("rates: " + ", ".join("%s %.4g" % kv for kv in rates.items()), flush=True)
    for name in DERIVED:
        if name in wanted:
            docs[name] = derive(name, rates)
    rc = 0
    for name in wanted:
        doc, path = docs[name], Path(args.out_dir) / ("%s.json" % name)
        print("%-26s %4d tensors %11d elements  forward %7.1f ms  backward %7.1f ms  batch %d"
              % (name, doc["num_tensors"], doc["total_numel"], 1e3 * doc["forward_s"],
                 1e3 * doc["backward_s"], doc["measurement"]["batch_size"]), flush=True)
        if args.check:
            if not path.exists() or not _same(json.loads(path.read_text()), doc):
                print("  differs from %s" % path)
                rc = 1
        else:
            path.write_text(make_profiles._dump(doc))
    return rc


if __name__ == "__main__":
    sys.exit(main())
