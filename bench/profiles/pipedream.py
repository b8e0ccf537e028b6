"""Reads PipeDream's published per-layer profiles and folds them into gradient-ready times.

PipeDream (Narayanan et al., SOSP 2019; github.com/msr-fiddle/pipedream) publishes, for several
torchvision models, a graph of layers profiled on a GPU: `profiler/image_classification/
profiles/<model>/graph.txt`. bench/profiles/pipedream/<model>.graph.txt are those files as
published (commit SOURCE_COMMIT). Each node line reads

    node<N> -- <layer repr> -- forward_compute_time=<ms>, backward_compute_time=<ms>,
        activation_size=<output bytes>, parameter_size=<parameter bytes>

and each edge line "\\tnode<A> -- node<B>" says B consumes A's output. Node numbers follow the
order in which forward ran the layers.

`fold` turns that into what the replay workers need (model_profile.py): the model's gradient
tensors in the order backward makes them ready, each with the time since the previous one was
ready, as OMGS-SGD's profiling.py measures it with hooks. The backward of a layer without
parameters (activation, pooling, addition) runs before the backward of every layer that fed it,
so its time counts toward the first of its parameter-holding ancestors that backward reaches.
"""

import re
from pathlib import Path

SOURCE_REPO = "https://github.com/msr-fiddle/pipedream"
SOURCE_COMMIT = "11c40c015e1b7a8e668363c8521609ad48e287f3"
SOURCE_PATH = "profiler/image_classification/profiles/%s/graph.txt"
HERE = Path(__file__).resolve().parent / "pipedream"

_NODE = re.compile(r"^(node\d+) -- (.*) -- forward_compute_time=([0-9.]+), "
                   r"backward_compute_time=([0-9.]+), activation_size=([0-9.]+), "
                   r"parameter_size=([0-9.]+)$")
_EDGE = re.compile(r"^\s*(node\d+) -- (node\d+)$")


class Node:
    def __init__(self, name, layer, forward_ms, backward_ms, activation_bytes, parameter_bytes):
        self.name, self.layer = name, layer
        self.number = int(name[4:])
        self.forward_ms, self.backward_ms = forward_ms, backward_ms
        self.activation_bytes, self.parameter_bytes = activation_bytes, parameter_bytes
        self.inputs = []  # names of the nodes whose outputs this one consumes

    @property
    def is_input(self):
        return self.layer == "Input"


def parse(text):
    """{name: Node} of a graph.txt; raises ValueError on a line it does not understand."""
    nodes, edges = {}, []
    for k, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _NODE.match(line)
        if m:
            name = m.group(1)
            nodes[name] = Node(name, m.group(2), float(m.group(3)), float(m.group(4)),
                               float(m.group(5)), float(m.group(6)))
            continue
        m = _EDGE.match(line)
        if not m:
            raise ValueError("line %d is neither a node nor an edge: %r" % (k, line[:80]))
        edges.append((m.group(1), m.group(2)))
    for a, b in edges:
        if a not in nodes or b not in nodes:
            raise ValueError("edge %s -- %s names an unknown node" % (a, b))
        nodes[b].inputs.append(a)
    return nodes


def load(model):
    return parse((HERE / ("%s.graph.txt" % model)).read_text())


def parameter_nodes(nodes):
    """The nodes holding parameters, in the order forward ran them."""
    return sorted((n for n in nodes.values() if n.parameter_bytes > 0), key=lambda n: n.number)


def _ancestors(nodes, name, memo):
    if name not in memo:
        found = set()
        for a in nodes[name].inputs:
            found.add(a)
            found |= _ancestors(nodes, a, memo)
        memo[name] = found
    return memo[name]


def fold(nodes, layer_order):
    """Per parameter node, in backward order, the backward time (ms) until its gradients are
    ready counted from the previous parameter node's: its own backward plus that of the
    parameter-free nodes that backward runs just before it.

    layer_order: the parameter nodes' names in the order backward reaches them. Returns
    [(name, ms)] in that order, and the ms of parameter-free nodes with no parameter-holding
    ancestor (the input's; never part of a gradient's time).
    """
    rank = {name: i for i, name in enumerate(layer_order)}
    params = {n.name for n in parameter_nodes(nodes)}
    if set(rank) != params:
        raise ValueError("layer order names %d nodes, the graph has %d parameter nodes"
                         % (len(rank), len(params)))
    extra = {name: 0.0 for name in layer_order}
    orphan_ms, memo = 0.0, {}
    for n in nodes.values():
        if n.name in params:
            continue
        owners = [a for a in _ancestors(nodes, n.name, memo) if a in params]
        if not owners:
            orphan_ms += n.backward_ms
            continue
        extra[min(owners, key=rank.get)] += n.backward_ms
    return [(name, nodes[name].backward_ms + extra[name]) for name in layer_order], orphan_ms


def forward_ms(nodes):
    """The model's forward time: every layer's forward except the input's (data loading)."""
    return sum(n.forward_ms for n in nodes.values() if not n.is_input)


def batch_size(nodes, input_shape):
    """The batch the profile was taken at, from the input node's activation size (float32)."""
    per_sample = 4
    for d in input_shape:
        per_sample *= d
    inputs = [n for n in nodes.values() if n.is_input]
    if len(inputs) != 1:
        raise ValueError("expected one Input node, found %d" % len(inputs))
    b = inputs[0].activation_bytes / per_sample
    if abs(b - round(b)) > 1e-6:
        raise ValueError("input activation %d bytes is not a whole batch of %s"
                         % (inputs[0].activation_bytes, input_shape))
    return int(round(b))
