"""A short real search: children born by morphism start from their parent's accuracy."""

import random

import pytest
import torch
from safetensors.torch import load_file

from automlperf.graph import Graph, seeds
from automlperf.search import Model, Searcher
from automlperf.train import build_module
from automlperf.train.data import digits
from automlperf.train.inherit import inherit
from automlperf.train.pool import DevicePool
from automlperf.train.pooltrainer import train_trial
from automlperf.train.trainer import TrialSpec
from helpers import data_section

pytestmark = pytest.mark.slow
SEED = seeds.resnet_small(num_classes=10, image_size=8, in_channels=1)


def accuracy(module, data):
    module.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in data.batches("val", 0, 1, 256, 0, 0, torch.device("cpu")):
            right += int((module(x).argmax(1) == y).sum())
            total += len(y)
    return right / total


def test_children_start_from_their_parents_accuracy(tmp_path):
    data = digits(8)
    history: list[Model] = []
    searcher = Searcher()
    with DevicePool(["cpu"], data_section("digits"), threads_per_rank=2) as pool:
        weights = str(tmp_path / "seed.safetensors")
        out = train_trial(pool, TrialSpec("seed", SEED.to_dict(), epochs=4, batch_size=64,
                                        patience=10, lr_per_256=0.4, warmup_epochs=1,
                                        weights_out=weights))
        assert out.status == "completed" and out.best_accuracy > 0.6
        history.append(Model("seed", SEED, out.best_accuracy))
        parent_module = build_module(SEED)
        parent_module.load_state_dict(load_file(weights))
        parent_acc = accuracy(parent_module, data)
        assert parent_acc == pytest.approx(out.best_accuracy)

        for r in range(2):
            cand = searcher.next_candidate(history, SEED, random.Random(r), kernel_size=3)
            assert cand.parent_id == "seed" and cand.morphs
            # At birth the child computes its parent's function exactly.
            child = build_module(cand.graph)
            child.load_state_dict(inherit(SEED, load_file(weights), cand.graph))
            assert accuracy(child, data) == pytest.approx(parent_acc)
            # After an epoch of training it is still near its parent ...
            events = []
            grown = train_trial(pool, TrialSpec(
                f"child{r}", cand.graph.to_dict(), epochs=1, batch_size=64, patience=10,
                lr_per_256=0.4, warmup_epochs=1, parent_graph=SEED.to_dict(),
                parent_weights=weights),
                lambda kind, msg, events=events: events.append(msg) if kind == "epoch" else None)
            assert grown.status == "completed"
            assert events[0]["val_accuracy"] >= parent_acc - 0.15
            # ... while the same architecture from scratch is far behind after that epoch.
            scratch = []
            train_trial(pool, TrialSpec(f"scratch{r}", cand.graph.to_dict(), epochs=1,
                                      batch_size=64, patience=10, lr_per_256=0.4,
                                      warmup_epochs=1),
                      lambda kind, msg, scratch=scratch: scratch.append(msg) if kind == "epoch" else None)
            assert scratch[0]["val_accuracy"] < events[0]["val_accuracy"] - 0.2
            history.append(Model(f"child{r}", Graph.from_dict(cand.graph.to_dict()),
                                 grown.best_accuracy))
