"""The cluster benchmark's model profiles (bench/profiles/): CPU-measured, folded from
PipeDream's published GPU times, and FLOP-scaled; each loads, has its model's size and names its
source and method, and the fold keeps every layer's time."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "cluster"))
sys.path.insert(0, str(REPO / "bench" / "profiles"))

import model_profile  # noqa: E402
import pipedream  # noqa: E402

MODELS = {  # parameter counts of the model definitions (bench/profiles/models.py)
    "resnet20": 269722, "vgg16": 14728266, "alexnet": 61100840, "resnet50": 25557032,
    "inception_v4": 42679816, "lstm_ptb": 66034000, "fmnist_cnn": 105866,
}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_profiles_load_with_the_models_sizes_and_measured_times(model):
    doc = model_profile.load(model)
    tensors = doc["tensors"]
    assert doc["total_numel"] == sum(t["numel"] for t in tensors) == MODELS[model]
    assert doc["num_tensors"] == len(tensors)
    for t in tensors:
        n = 1
        for d in t["shape"]:
            n *= d
        assert n == t["numel"], t
    assert all(t["backward_s"] >= 0 for t in tensors)
    total = sum(t["backward_s"] for t in tensors)
    assert 0 < total <= doc["backward_s"] * 1.5 + 1e-3
    assert doc["forward_s"] > 0
    m = doc["measurement"]
    assert m["batch_size"] >= 1 and m["threads"] >= 1 and m["measured_iters"] >= 1
    assert m["machine"]["cpu"] and "make_profiles.py" in m["command"]
    # Backward order: the classifier's gradients come first, the first layer's last.
    first = {"resnet20": "fc.", "vgg16": "2.", "alexnet": "classifier.", "resnet50": "fc.",
             "inception_v4": "fc.", "lstm_ptb": "decoder.", "fmnist_cnn": "fc2."}[model]
    assert tensors[0]["name"].startswith(first), tensors[0]["name"]
    schedule = model_profile.Schedule(doc, time_scale=0.5)
    assert schedule.ready_s == sorted(schedule.ready_s)
    assert schedule.backward_s == pytest.approx(0.5 * total)


GPU_MODELS = {"alexnet_pipedream": MODELS["alexnet"], "resnet50_pipedream": MODELS["resnet50"],
              "vgg16_imagenet_pipedream": 138357544, "resnet20_flops": MODELS["resnet20"],
              "vgg16_flops": MODELS["vgg16"], "inception_v4_flops": MODELS["inception_v4"],
              "lstm_ptb_flops": MODELS["lstm_ptb"]}


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_gpu_profiles_name_their_source_and_method(model):
    doc = model_profile.load(model)
    tensors = doc["tensors"]
    assert doc["total_numel"] == sum(t["numel"] for t in tensors) == GPU_MODELS[model]
    assert doc["backward_s"] == pytest.approx(sum(t["backward_s"] for t in tensors), abs=1e-5)
    assert doc["forward_s"] > 0 and doc["backward_s"] > 0
    m = doc["measurement"]
    assert m["batch_size"] >= 1 and len(m["method"]) > 100 and "gpu_profiles.py" in m["command"]
    src = m["source"]
    assert "msr-fiddle/pipedream" in src["repository"] and len(src["commit"]) == 40
    if model.endswith("_pipedream"):
        assert src["kind"] == "published per-layer GPU times"
        assert (REPO / src["copy"]).exists()
    else:
        assert src["kind"].startswith("FLOP-scaled") and "not measured" in m["device"]
        assert src["rates"]["matmul_bwd_ms_per_gflop"] > 0
    # The gradients come in the order of the CPU profile of the same model, where there is one.
    cpu = {"alexnet_pipedream": "alexnet", "resnet50_pipedream": "resnet50"}.get(
        model, model.replace("_flops", "") if model.endswith("_flops") else None)
    if cpu:
        assert [t["name"] for t in tensors] == [t["name"] for t in
                                                model_profile.load(cpu)["tensors"]]


@pytest.mark.parametrize("name", ["alexnet", "vgg16", "resnet50"])
def test_pipedream_fold_keeps_every_layers_backward_time(name):
    nodes = pipedream.load(name)
    profile = model_profile.load({"vgg16": "vgg16_imagenet"}.get(name, name) + "_pipedream")
    total_ms = sum(n.backward_ms for n in nodes.values())
    unassigned = profile["measurement"]["unassigned_backward_ms"]
    assert 1e3 * profile["backward_s"] + unassigned == pytest.approx(total_ms, abs=1e-3)
    assert pipedream.batch_size(nodes, (3, 224, 224)) == profile["measurement"]["batch_size"]
    params = pipedream.parameter_nodes(nodes)
    assert 4 * profile["total_numel"] == sum(n.parameter_bytes for n in params)
    # The last layer's gradient is the first ready: its own backward, nothing before it.
    assert profile["tensors"][0]["backward_s"] == pytest.approx(params[-1].backward_ms / 1e3)


def test_pipedream_fold_charges_activations_to_the_next_parameter_layer_in_backward():
    text = "\n".join([
        "node1 -- Input -- forward_compute_time=5.000, backward_compute_time=0.000, "
        "activation_size=4.000, parameter_size=0.000",
        "node2 -- Conv2d(a) -- forward_compute_time=1.000, backward_compute_time=2.000, "
        "activation_size=4.000, parameter_size=40.000",
        "node3 -- ReLU(inplace) -- forward_compute_time=1.000, backward_compute_time=0.500, "
        "activation_size=4.000, parameter_size=0.000",
        "node4 -- Conv2d(b) -- forward_compute_time=1.000, backward_compute_time=3.000, "
        "activation_size=4.000, parameter_size=8.000",
        "node5 -- Conv2d(c) -- forward_compute_time=1.000, backward_compute_time=4.000, "
        "activation_size=4.000, parameter_size=8.000",
        "node6 -- Add(inplace) -- forward_compute_time=0.000, backward_compute_time=0.250, "
        "activation_size=4.000, parameter_size=0.000",
        "\tnode1 -- node2", "\tnode2 -- node3", "\tnode3 -- node4", "\tnode3 -- node5",
        "\tnode4 -- node6", "\tnode5 -- node6"])
    nodes = pipedream.parse(text)
    # Backward reaches node5, then node4, then node2: the add goes to node5 (first reached of
    # the layers that fed it), the ReLU between node2 and the branches to node2.
    folded, orphan = pipedream.fold(nodes, ["node5", "node4", "node2"])
    assert folded == [("node5", 4.25), ("node4", 3.0), ("node2", 2.5)] and orphan == 0.0
    assert pipedream.forward_ms(nodes) == 4.0  # the input node's (data loading) left out
    with pytest.raises(ValueError):
        pipedream.fold(nodes, ["node5", "node4"])
    with pytest.raises(ValueError):
        pipedream.parse("node1 -- garbage")
