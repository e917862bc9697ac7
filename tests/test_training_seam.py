"""One training seam: one way to plan a round's batches (stragglers already cut), one SGD rule for
the engine's path, custom steps and FedMN, `None` as the only "the cell's epochs" marker, and the
routed/generated algorithms reaching the data through the Federation's public methods."""

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from pflbench.algorithms.fedmn import _sgd_step as fedmn_sgd_step
from cells import federation as make_federation, small_cell
from pflbench.kit.steps import sgd_step, step_ids
from pflbench.simulator.system import SystemParams, SystemPlan
from pflbench.simulator.training import SGD, batch_plan

ROOT = Path(__file__).resolve().parents[1]


# ---- one plan ------------------------------------------------------------------------------------------
def test_zero_epochs_train_nothing_and_none_is_the_cells_epochs(tmp_path):
    fed = make_federation(small_cell(local_epochs=2), tmp_path)
    clients = torch.arange(fed.num_clients)
    assert all(len(p) == 0 for p in fed.local_plans(1, clients, epochs=0))
    assert all(len(p) == 0 for p in batch_plan([30, 0], 8, 0, None, [torch.Generator()] * 2))
    assert all(len(p) == 0 for p in batch_plan([30], 8, 1, 0, [torch.Generator()]))
    default = fed.local_plans(1, clients)
    assert [len(p) for p in default] == [len(p) for p in fed.local_plans(1, clients, epochs=2)]
    assert [len(p) for p in default] == [2 * len(p) for p in fed.local_plans(1, clients, epochs=1)]
    start = fed.init_state(fed.num_clients)
    trained = fed.train(1, clients, start, epochs=0)
    assert all(torch.equal(trained.state[n], start[n]) for n in start)
    assert torch.equal(trained.loss, torch.zeros(fed.num_clients))
    moved = fed.train(1, clients, start)  # the default still trains
    assert not torch.equal(moved.state[fed.model.param_names[0]], start[fed.model.param_names[0]])
    ids, counts = step_ids(fed, 1, clients, epochs=0)
    assert ids.shape[1] == 0 and (counts == 0).all()


def test_the_plan_is_cut_for_stragglers_when_given_the_rounds_context_only(tmp_path):
    system = {"stragglers": 0.4, "straggler_work": 0.2}
    fed = make_federation(small_cell(participation=1.0, local_epochs=2, system=system), tmp_path)
    clients = torch.arange(fed.num_clients)
    full = [len(p) for p in fed.local_plans(1, clients)]
    rnd = fed.round(1, clients)  # the round's context, as the engine hands it to the hooks
    cut = fed.local_plans(rnd, clients)
    later = [len(p) for p in fed.local_plans(rnd.number + 1, clients)]  # e.g. adaptation's batch order of round 2
    ids, counts = step_ids(fed, rnd, clients)
    slow = SystemPlan(SystemParams(**system), fed.num_clients, 1, seed=fed.cell.seed).straggler[fed.client_ids]
    assert slow.any() and [len(p) for p in cut] == [math.ceil(0.2 * n - 1e-9) if s else n for n, s in zip(full, slow)]
    assert later == [len(p) for p in fed.local_plans(2, clients)] and counts.tolist() == [len(p) for p in cut]
    assert [len(p) for p in fed.local_plans(1, clients)] == full  # a round number alone: nothing is cut
    for k, plan in enumerate(cut):  # the cut plan is a prefix of the full one, as sample ids
        own = fed.sample_ids(k)
        assert torch.equal(ids[k, : len(plan)], own[plan]) and torch.equal(
            plan, fed.local_plans(1, clients)[k][: len(plan)]
        )
    row = clients[1:3]  # a subset trained with the round (one client at a time, pFedHN's loop): its own shares
    assert [len(p) for p in fed.local_plans(rnd, row)] == [len(p) for p in cut[1:3]]


# ---- one SGD rule --------------------------------------------------------------------------------------
def _params(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(7, 5, generator=gen), torch.randn(11, generator=gen), torch.randn(3, 4, 2, 2, generator=gen)]


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.5, 1e-3), (0.0, 5e-4)])
def test_the_rule_is_torch_optim_sgd_to_the_bit(momentum, weight_decay):
    rule = SGD(0.05, momentum, weight_decay)
    ours = _params(0)
    theirs = [nn.Parameter(p.clone()) for p in ours]
    optimizer = torch.optim.SGD(theirs, lr=rule.lr, momentum=momentum, weight_decay=weight_decay)
    momenta = rule.momenta(ours)
    assert (momenta is None) == (momentum == 0)
    for step in range(4):
        grads = _params(step + 1)
        rule.apply(ours, grads, momenta)
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        optimizer.step()
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b.detach()), f"step {step}"


def test_rows_and_masked_steps_move_only_the_active_clients_by_the_same_rule():
    rule = SGD(0.1, 0.9, 1e-3)
    stacked = {"w": torch.randn(4, 6), "b": torch.randn(4, 3)}
    grads = {"w": torch.randn(4, 6), "b": torch.randn(4, 3)}
    momenta = {n: torch.randn_like(t) for n, t in stacked.items()}
    active = torch.tensor([True, False, True, False])
    params, buffers = {n: t.clone() for n, t in stacked.items()}, {n: t.clone() for n, t in momenta.items()}
    sgd_step(params, grads, buffers, rule, 0.3, active)
    alone = [stacked[n][active].clone() for n in stacked]
    alone_momenta = [momenta[n][active].clone() for n in stacked]
    rule.apply(alone, [grads[n][active] for n in stacked], alone_momenta, lr=0.3)
    for (name, start), moved, moved_momentum in zip(stacked.items(), alone, alone_momenta):
        assert torch.equal(params[name][active], moved) and torch.equal(buffers[name][active], moved_momentum)
        assert torch.equal(params[name][~active], start[~active])
        assert torch.equal(buffers[name][~active], momenta[name][~active])


def test_fedmn_steps_by_the_engine_rule_and_leaves_parameters_without_a_gradient_as_torch_optim_does():
    rule = SGD(0.05, 0.9, 5e-4)
    ours = [nn.Parameter(p) for p in _params(0)]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    optimizer = torch.optim.SGD(theirs, lr=rule.lr, momentum=rule.momentum, weight_decay=rule.weight_decay)
    momenta = rule.momenta(ours)
    for step in range(5):
        grads = _params(10 + step)
        off = step % 3  # a module routed off this step: no gradient, no decay, no momentum
        for params in (ours, theirs):
            for k, p in enumerate(params):
                p.grad = None if k == off else grads[k].clone()
        fedmn_sgd_step(rule, ours, momenta)
        optimizer.step()
        for a, b in zip(ours, theirs):
            assert torch.equal(a.detach(), b.detach()), f"step {step}"


# ---- the seam --------------------------------------------------------------------------------------------
def test_no_algorithm_plans_batches_or_builds_an_sgd_update_of_its_own():
    """Batch plans come from `Federation.local_plans` (the engine's batch_plan is called there only),
    the SGD rule from `SGD.apply`; FedMN and MH-pFedHN read samples through `sample_ids`/`data`."""
    for path in (ROOT / "pflbench" / "algorithms").glob("*.py"):
        text = path.read_text()
        assert "batch_plan(" not in text, path.name
        # a server's optimizer with its own settings (pFedHN's hypernetwork) is not the cell's local SGD
        assert not re.search(r"optim\.SGD\([^)]*sgd\.", text), path.name
    package = ROOT / "pflbench"
    callers = [str(p.relative_to(package)) for p in package.rglob("*.py") if "batch_plan(" in p.read_text()]
    assert sorted(callers) == ["simulator/federation.py", "simulator/training.py"]
    for name in ("fedmn.py", "mhpfedhn.py"):
        text = (ROOT / "pflbench" / "algorithms" / name).read_text()
        assert not re.search(r"fed\.(splits|features|labels|_\w+)\b|\._module\b", text), name
