"""The seed's module as a trial starts it: freshly initialised, or a child's, built without an
initialisation and given every weight its parent passes on."""

import random

import torch
from safetensors.torch import save_file

from automlperf.graph import seeds
from automlperf.search import morph
from automlperf.train import build_module
from automlperf.train.builder import GraphModule, _allocate
from automlperf.train.inherit import inherit
from automlperf.train.spec import TrialSpec
from automlperf.train.trainer import _initial_module

SEED = seeds.resnet_small(num_classes=10, image_size=8, in_channels=1)


def test_a_child_starts_with_exactly_what_it_inherits_and_nothing_else(tmp_path):
    parent = build_module(SEED, seed=3)
    weights = tmp_path / "parent.safetensors"
    save_file({k: v.contiguous() for k, v in parent.state_dict().items()}, weights)
    child_graph, _ = morph(SEED, "random", random.Random(5), kernel_size=3)
    spec = TrialSpec("child", child_graph.to_dict(), epochs=1, batch_size=8, patience=1,
                     parent_graph=SEED.to_dict(), parent_weights=str(weights), seed=7)
    child = _initial_module(spec, child_graph)
    inherited = inherit(SEED, parent.state_dict(), child_graph, seed=7)
    state = child.state_dict()
    assert state.keys() == inherited.keys()
    assert all(torch.equal(state[k], inherited[k]) for k in state)
    # The same as a child first initialised, then overwritten: the initialisation it skips
    # reaches nothing.
    initialised = build_module(child_graph, seed=7)
    initialised.load_state_dict(inherited)
    x = torch.randn(4, *SEED.input_shape)
    with torch.no_grad():
        assert torch.equal(child.eval()(x), initialised.eval()(x))


class _Parts(torch.nn.Module):
    """What a layer may hold: trained and frozen parameters, saved and unsaved buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.frozen = torch.nn.Parameter(torch.ones(2, 3), requires_grad=False)
        self.register_buffer("scratch", torch.zeros(5, dtype=torch.int32), persistent=False)


def test_memory_is_given_as_a_module_made_on_the_device_would_have_it():
    """Memory given without ``Module.to_empty``: every parameter and buffer keeps its name,
    shape, type, whether it trains and whether it is saved, on the caller's device."""
    for make in (_Parts, lambda: GraphModule(SEED)):
        reference = make()
        with torch.device("meta"):
            given = make()
        _allocate(given, torch.device("cpu"))
        assert given.state_dict().keys() == reference.state_dict().keys()
        want = dict([*reference.named_parameters(), *reference.named_buffers()])
        got = dict([*given.named_parameters(), *given.named_buffers()])
        assert got.keys() == want.keys()
        for name, tensor in got.items():
            assert isinstance(tensor, torch.nn.Parameter) == isinstance(want[name], torch.nn.Parameter)
            assert (tensor.shape, tensor.dtype, tensor.device, tensor.requires_grad) == (
                want[name].shape, want[name].dtype, torch.device("cpu"), want[name].requires_grad)
