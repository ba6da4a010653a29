"""The trials' optimizer is torch's SGD, bit for bit, and an eagerly trained trial never
imports torch._dynamo (train/optim.py)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from automlperf.train import optim
from helpers import SMALL8


def _trained(make, steps=6):
    from automlperf.train.builder import build_module

    module = build_module(SMALL8, seed=0)
    opt = make(module)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, *SMALL8.input_shape, generator=gen)
        y = torch.randint(0, SMALL8.num_classes, (16,), generator=gen)
        loss = torch.nn.functional.cross_entropy(module(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
    return module, opt


def _groups(module):
    decay = [p for p in module.parameters() if p.ndim > 1]
    rest = [p for p in module.parameters() if p.ndim <= 1]
    return [{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}]


def test_the_trials_sgd_computes_torchs_sgd_bit_for_bit():
    assert optim.UNTRACED  # this torch has the wrappers; otherwise the test proves nothing
    ours, ours_opt = _trained(lambda m: optim.trial_optimizer(m, 0.1, 5e-4, 0.9, True))
    theirs, theirs_opt = _trained(lambda m: torch.optim.SGD(_groups(m), lr=0.1, momentum=0.9,
                                                            nesterov=True))
    assert type(ours_opt) is not torch.optim.SGD and isinstance(ours_opt, torch.optim.SGD)
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    mine, other = ours_opt.state_dict(), theirs_opt.state_dict()
    assert mine["param_groups"] == other["param_groups"]
    for key, state in mine["state"].items():
        assert torch.equal(state["momentum_buffer"], other["state"][key]["momentum_buffer"])
    # A saved state loads back into a new optimizer of either kind.
    again = optim.sgd(_groups(ours), lr=0.1, momentum=0.9, nesterov=True)
    again.load_state_dict(other)
    assert again.state_dict()["param_groups"] == other["param_groups"]


def test_where_torch_has_no_such_wrappers_it_is_torchs_sgd(monkeypatch):
    monkeypatch.setattr(optim, "UNTRACED", False)
    module = torch.nn.Linear(2, 2)
    assert type(optim.sgd(module.parameters(), lr=0.1)) is torch.optim.SGD
    monkeypatch.setattr(optim, "UNTRACED", True)
    assert type(optim.sgd(module.parameters(), lr=0.1, differentiable=True)) is torch.optim.SGD


@pytest.mark.slow
def test_an_eager_trial_never_imports_dynamo():
    """A rank's eager trial (the trainer with its optimizer, schedule, validation and the
    weights it keeps) in a fresh interpreter: neither torch._dynamo nor sympy (which
    ``Module.to_empty`` would import, train/builder.py) is ever imported, so no rank, memory
    probe or doctor's process pays for them."""
    probe = """
import sys
import torch
sys.path.insert(0, {tests!r})
from helpers import Recorder, trial_spec
from automlperf.graph import seeds
from automlperf.train.data import SyntheticDataset
from automlperf.train.trainer import RankContext, train_on_rank
data = SyntheticDataset(image_size=8, num_classes=10, train_images=64)
graph = seeds.resnet_small(num_classes=10, image_size=8, in_channels=3)
out = train_on_rank(trial_spec("eager", graph=graph, epochs=2, batch_size=16),
                    RankContext(0, 1, torch.device("cpu"), data), Recorder())
print(out.status, out.extra.get("compiled_graphs"), "torch._dynamo" in sys.modules,
      "sympy" in sys.modules, out.reason)
""".format(tests=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:4] == ["completed", "None", "False", "False"], \
        done.stdout + done.stderr
