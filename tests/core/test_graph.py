import json
import random
from pathlib import Path

import pytest

from automlperf.graph import INPUT, Graph, GraphError, Layer, seeds
from automlperf.graph.graph import conv, dense, simple
from automlperf.ops import layer_table

DATA = Path(__file__).resolve().parents[1] / "data"


def small_graph(extra=()):
    layers = [
        conv("c1", INPUT, 8, 3, 2),
        simple("b1", "batchnorm", "c1"),
        simple("r1", "relu", "b1"),
        conv("c2", "r1", 8, 3, 1),
        simple("b2", "batchnorm", "c2"),
        simple("a1", "add", "b2", "r1"),
        simple("r2", "relu", "a1"),
        simple("p", "global_avgpool", "r2"),
        dense("fc", "p", 5),
        simple("sm", "softmax", "fc"),
        *extra,
    ]
    return Graph.build((3, 16, 16), layers)


def test_resnet50_v1_layout():
    g = seeds.resnet50(num_classes=1000, image_size=224)
    assert g.count("conv2d") == 53 and g.count("add") == 16
    assert g.shapes["stem_pool"] == (64, 56, 56)
    # v1: the stride sits on the first 1x1 convolution of a stage's first block.
    assert g["s2b1_conv1"].stride == 2 and g["s2b1_conv1"].kernel == 1
    assert g["s2b1_conv2"].stride == 1
    assert g.shapes["s2b1_conv1"] == (128, 28, 28)
    assert g.shapes["s4b3_out"] == (2048, 7, 7)
    assert g.num_classes == 1000 and g.output.kind == "softmax"


@pytest.mark.parametrize("size,classes,channels", [(224, 1000, 3), (64, 100, 3), (32, 10, 1)])
def test_resnet50_any_size_and_classes(size, classes, channels):
    g = seeds.resnet50(num_classes=classes, image_size=size, in_channels=channels)
    assert g.num_classes == classes and g.input_shape == (channels, size, size)


def test_the_small_seeds_width_multiplies_every_convolution_and_nothing_else():
    narrow, wide = seeds.resnet_small(10, 12, 1), seeds.seed("resnet_small", 10, 12, 1, width=4)
    assert [layer.name for layer in wide.layers] == [layer.name for layer in narrow.layers]
    for a, b in zip(narrow.layers, wide.layers):
        if a.kind == "conv2d":
            assert (b.out_channels, b.kernel, b.stride) == (4 * a.out_channels, a.kernel, a.stride)
    assert wide.num_classes == narrow.num_classes and wide.content_hash() != narrow.content_hash()
    with pytest.raises(ValueError, match="resnet_small only"):
        seeds.seed("resnet50", 1000, 224, 3, width=2)


def test_resnet_small_is_small():
    g = seeds.resnet_small(num_classes=10, image_size=32)
    assert g.num_classes == 10 and g.count("conv2d") < 20
    assert g.shapes["s3b1_out"][1:] == (8, 8)


def test_json_round_trip_and_hash_stability():
    for g in (seeds.resnet50(), seeds.resnet_small(), small_graph()):
        back = Graph.from_json(g.to_json())
        assert back == g and back.shapes == g.shapes
        assert back.content_hash() == g.content_hash()
        assert json.loads(g.to_json())["schema_version"] == 1


def test_committed_sample_graph_still_reads():
    g = Graph.from_json((DATA / "graph_v1_resnet_small.json").read_text())
    assert g == seeds.resnet_small(10, 32, 3)
    # Changing this hash breaks every stored run: it must stay put.
    assert g.content_hash() == "429356fecbd93f433f8a615e68b93a63"


def test_hash_ignores_names_and_listing_order():
    g = small_graph()
    data = json.loads(g.to_json())
    rename = {layer["name"]: f"x{i}" for i, layer in enumerate(data["layers"])}
    for layer in data["layers"]:
        layer["name"] = rename[layer["name"]]
        layer["inputs"] = [rename.get(s, s) for s in layer["inputs"]]
    random.Random(1).shuffle(data["layers"])
    other = Graph.from_dict(data)
    assert other.content_hash() == g.content_hash()
    bigger = Graph.build(g.input_shape, [conv("c2", "r1", 8, 5, 1) if x.name == "c2" else x
                                         for x in g.layers])
    assert bigger.content_hash() != g.content_hash()


def test_summary_names_layers():
    text = layer_table(seeds.resnet_small())
    assert "stem_conv" in text and "s1b1_add" in text and "parameters" in text


def _bad(mutate):
    data = json.loads(small_graph().to_json())
    mutate(data)
    return json.dumps(data)


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["layers"][3].update(inputs=["nope"]), "layer 'c2': input 'nope' does not exist"),
    (lambda d: d["layers"][0].update(inputs=["r1"]), "part of a cycle"),
    (lambda d: d["layers"][3].update(stride=2), "layer 'a1': shape mismatch"),
    (lambda d: d["layers"][3].update(kind="conv3d"), "layer 'c2': unknown kind 'conv3d'"),
    (lambda d: d["layers"][3].pop("kernel"), "layer 'c2': conv2d needs an integer 'kernel'"),
    (lambda d: d["layers"][3].update(in_channels=7), "layer 'c2': in_channels is 7"),
    (lambda d: d["layers"][8].update(inputs=["r2"]), "layer 'fc': dense needs a flat"),
    (lambda d: d["layers"].append({"name": "extra", "kind": "relu", "inputs": ["r1"]}),
     "layer 'extra': its output is never used"),
    (lambda d: d["layers"].append(dict(d["layers"][1])), "layer 'b1': name used twice"),
    (lambda d: d.update(schema_version=99), "schema_version 99 is not supported"),
    (lambda d: d["layers"][0].update(stride=0), "layer 'c1': kernel and stride must be >= 1"),
    (lambda d: d["layers"][1].update(bias=True), "layer 'b1': unknown field(s) bias"),
])
def test_invalid_graphs_name_the_layer(mutate, message):
    with pytest.raises(GraphError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Graph.from_json(_bad(mutate))


def test_malformed_json_is_rejected():
    with pytest.raises(GraphError, match="not valid JSON"):
        Graph.from_json('{"schema_version": 1, "layers": [')
    with pytest.raises(GraphError, match="must be an object"):
        Graph.from_json("[1, 2]")


def test_too_small_input_is_rejected():
    with pytest.raises(GraphError, match="layer 'c': input 4x4 is too small"):
        Graph.build((3, 4, 4), [conv("c", INPUT, 4, 7, 1, padding=0),
                                simple("p", "global_avgpool", "c")])


def test_layer_params_are_immutable():
    layer = Layer("c", "conv2d", (INPUT,), 4, 3, 1, 1)
    with pytest.raises(AttributeError):
        layer.kernel = 5  # type: ignore[misc]
