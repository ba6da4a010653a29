import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from automlperf.graph import INPUT, Graph, seeds
from automlperf.graph.graph import conv, dense, simple
from automlperf.search import Limits, MorphError, morph
from automlperf.search.morph import channel_group, deepen, skip, skip_targets, widen
from automlperf.train import build_module
from automlperf.train.inherit import InheritError, inherit

SMALL = seeds.resnet_small(num_classes=10, image_size=16)
BIG = seeds.resnet50(num_classes=10, image_size=32)


def randomised(graph, seed):
    """A module with non-trivial BN statistics, so identity blocks are really tested."""
    module = build_module(graph, seed=seed).double()
    gen = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
    return module.eval()


def check_function_preserved(parent, child, seed):
    pm = randomised(parent, seed)
    cm = build_module(child, init=None).double()
    cm.load_state_dict(inherit(parent, pm.state_dict(), child, seed=seed))
    cm.eval()
    x = torch.randn(3, *parent.input_shape, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expected, got = pm(x), cm(x)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), (got - expected).abs().max()


def apply_random(graph, seed, steps):
    rng = random.Random(seed)
    records = []
    for _ in range(steps):
        graph, record = morph(graph, "random", rng, kernel_size=rng.choice((3, 5, 7)))
        records.append(record)
    return graph, records


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), steps=st.integers(1, 10))
def test_random_morph_sequences_on_small_seed(seed, steps):
    child, records = apply_random(SMALL, seed, steps)
    assert Graph.from_json(child.to_json()) == child  # still a valid graph
    assert len(records) == steps and child.num_classes == 10
    check_function_preserved(SMALL, child, seed)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), steps=st.integers(1, 10))
def test_random_morph_sequences_on_resnet50(seed, steps):
    child, _ = apply_random(BIG, seed, steps)
    assert Graph.from_json(child.to_json()) == child
    check_function_preserved(BIG, child, seed)


def test_float32_child_matches_parent_within_relative_tolerance():
    child, _ = apply_random(SMALL, 7, 6)
    pm = build_module(SMALL, seed=1).eval()
    cm = build_module(child, init=None)
    cm.load_state_dict(inherit(SMALL, pm.state_dict(), child))
    cm.eval()
    x = torch.randn(4, *SMALL.input_shape)
    with torch.no_grad():
        assert torch.allclose(cm(x), pm(x), rtol=1e-4, atol=1e-5)
    assert all(v.dtype == torch.float32 for v in cm.state_dict().values() if v.is_floating_point())


@pytest.mark.parametrize("kernel", [3, 5, 7])
def test_deepen_inserts_an_identity_block(kernel):
    child, record = deepen(SMALL, "s1b1_relu1", kernel)
    assert record.op == "deepen" and record.detail["kernel"] == kernel
    new = child[record.detail["layers"][0]]
    assert new.kernel == kernel and new.stride == 1 and child.shapes[new.name] == SMALL.shapes["s1b1_relu1"]
    assert child["s1b1_conv2"].inputs == (record.detail["layers"][2],)
    check_function_preserved(SMALL, child, 0)


def test_widen_propagates_through_the_channel_group():
    child, record = widen(SMALL, "s1b1_conv3", 2.0)
    producers, readers = channel_group(SMALL, "s1b1_conv3")
    assert set(producers) == {"s1b1_conv3", "s1b1_convp"}  # tied by the add
    assert "s2b1_conv1" in readers and "s2b1_convp" in readers
    assert record.detail["to"] == 2 * record.detail["from"]
    assert child.shapes["s1b1_out"][0] == 2 * SMALL.shapes["s1b1_out"][0]
    check_function_preserved(SMALL, child, 1)


def test_widen_the_stem_and_the_last_stage():
    for target in ("stem_conv", "s3b1_conv3"):
        child, _ = widen(SMALL, target, 1.5)
        check_function_preserved(SMALL, child, 2)


def test_skip_with_and_without_projection():
    projected, rec = skip(SMALL, "s1b1_relu1", "s2b1_bn2")
    assert rec.detail["projection"] and rec.detail["stride"] == 2
    check_function_preserved(SMALL, projected, 3)
    plain, rec = skip(SMALL, "s2b1_relu1", "s2b1_bn2")
    assert not rec.detail["projection"]
    check_function_preserved(SMALL, plain, 4)


def test_illegal_targets_are_refused():
    with pytest.raises(MorphError, match="not a ReLU"):
        deepen(SMALL, "s1b1_conv1")
    with pytest.raises(MorphError, match="kernel size must be odd"):
        deepen(SMALL, "s1b1_relu1", 4)
    with pytest.raises(MorphError, match="not a convolution"):
        widen(SMALL, "s1b1_bn1")
    with pytest.raises(MorphError, match="does not come after"):
        skip(SMALL, "s2b1_relu1", "s1b1_bn2")
    once, _ = skip(SMALL, "s1b1_relu1", "s2b1_bn2")
    with pytest.raises(MorphError, match="exists already"):
        skip(once, "s1b1_relu1", "s2b1_bn2")
    assert ("s1b1_relu1", "s2b1_bn2") not in skip_targets(once)
    # The seed's own projection shortcut already joins these two.
    with pytest.raises(MorphError, match="exists already"):
        skip(SMALL, "stem_relu", "s1b1_bn3")
    with pytest.raises(MorphError, match="unknown morph"):
        morph(SMALL, "shrink", 0)


def test_limits_are_enforced():
    with pytest.raises(MorphError, match=f"layers, over the limit of {len(SMALL)}"):
        deepen(SMALL, "stem_relu", limits=Limits(max_layers=len(SMALL)))
    with pytest.raises(MorphError, match="parameters, over the limit"):
        widen(SMALL, "s3b1_conv3", 2.0, limits=Limits(max_params=130_000))


def test_widen_refuses_channels_tied_to_the_image():
    g = Graph.build((4, 8, 8), [
        conv("c", INPUT, 4, 3, 1), simple("a", "add", "c", INPUT), simple("r", "relu", "a"),
        simple("p", "global_avgpool", "r"), dense("fc", "p", 2), simple("s", "softmax", "fc")])
    with pytest.raises(MorphError, match="tied to the input image"):
        widen(g, "c")


def test_same_seed_same_morph():
    a = apply_random(SMALL, 11, 5)[0]
    b = apply_random(SMALL, 11, 5)[0]
    assert a.content_hash() == b.content_hash()


def test_inherit_refuses_unrelated_graphs():
    other = seeds.resnet_small(num_classes=10, image_size=16, in_channels=1)
    pm = build_module(SMALL)
    with pytest.raises(InheritError, match="layer 'p' \\(global_avgpool\\) is new in the child"):
        inherit(SMALL, pm.state_dict(), Graph.build(other.input_shape, [
            conv("brand_new", INPUT, 8, 3, 1), simple("p", "global_avgpool", "brand_new"),
            dense("fc", "p", 10), simple("softmax", "softmax", "fc")]))
