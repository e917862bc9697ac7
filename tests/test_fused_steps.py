"""The custom steps without host overhead (issue 56, item 2): fused (foreach) updates give the per-tensor
expressions' values bit for bit, pFedMe's and Per-FedAvg's rounds give what their per-step, per-tensor
form gave (written out below as it was, syncing at every step), their steps read nothing from the
device however many there are, and a non-finite loss still raises `Diverged` naming the client (and,
for Per-FedAvg, the step)."""

from functools import partial

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pflbench.algorithms.perfedavg import STREAMS, PerFedAvg, hessian_free, minus_scaled, scaled
from pflbench.algorithms.pfedme import PFedMe, inner_step, pull
from pflbench.kit.steps import Active, LossCheck, finite, loss_and_grads, per_client, rows_where, step_ids, step_plan
from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.federation import Federation
from pflbench.simulator.rounds import prepare_cell
from pflbench.simulator.training import SGD, Diverged
from cells import received, small_cell


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit, NaNs and signed zeros included."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def awkward(seed: int, *shapes) -> list[torch.Tensor]:
    """Random tensors salted with the values where two roundings and one differ, or order matters:
    signed zeros, infinities, NaN, subnormals, huge and tiny magnitudes."""
    gen = torch.Generator().manual_seed(seed)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-40, 3e38, -3e38, 1e-30])
    out = []
    for shape in shapes:
        t = torch.randn(*shape, generator=gen) * torch.exp(4 * torch.randn(*shape, generator=gen))
        flat = t.view(-1)
        spots = torch.randint(0, flat.numel(), (min(flat.numel() // 4, 20),), generator=gen)
        flat[spots] = special[torch.randint(0, len(special), (len(spots),), generator=gen)]
        out.append(t)
    return out


SHAPES = [(4, 7, 5), (4, 11), (4, 3, 2, 3, 3), (4, 1)]


# ---- the engine's SGD rule: foreach against one tensor at a time ----------------------------------------
def per_tensor_sgd(rule: SGD, params, grads, momenta, lr):
    """torch.optim.SGD's single-tensor rule (`_single_tensor_sgd`), one tensor at a time."""
    for i, (p, g) in enumerate(zip(params, grads)):
        d = g.add(p, alpha=rule.weight_decay) if rule.weight_decay else g
        if rule.momentum:
            momenta[i].mul_(rule.momentum).add_(d)
            d = momenta[i]
        p.add_(d, alpha=-lr)


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.5, 1e-3), (0.0, 5e-4)])
def test_sgd_apply_and_apply_rows_are_the_per_tensor_rule_to_the_bit(momentum, weight_decay):
    rule = SGD(0.05, momentum, weight_decay)
    fused, momenta = awkward(0, *SHAPES), awkward(1, *SHAPES) if momentum else None
    alone = [p.clone() for p in fused]
    alone_momenta = None if momenta is None else [m.clone() for m in momenta]
    rows = torch.tensor([0, 2, 3])
    fused_rows = [p.clone() for p in fused]
    rows_momenta = None if momenta is None else [m.clone() for m in momenta]
    by_rows = [p.clone() for p in fused]
    by_rows_momenta = None if momenta is None else [m.clone() for m in momenta]
    for step in range(3):
        grads = awkward(10 + step, *SHAPES)
        rule.apply(fused, grads, momenta, lr=0.3)
        per_tensor_sgd(rule, alone, grads, alone_momenta, 0.3)
        rule.apply_rows(fused_rows, grads, rows_momenta, rows)
        # the rows variant by hand: gather, the per-tensor rule, scatter back
        chosen = [p[rows] for p in by_rows]
        chosen_momenta = None if by_rows_momenta is None else [m[rows] for m in by_rows_momenta]
        per_tensor_sgd(rule, chosen, [g[rows] for g in grads], chosen_momenta, rule.lr)
        for p, c in zip(by_rows, chosen):
            p[rows] = c
        for m, c in zip(by_rows_momenta or [], chosen_momenta or []):
            m[rows] = c
        for a, b in zip(fused + (momenta or []), alone + (alone_momenta or [])):
            assert same_bits(a, b), f"apply, step {step}"
        for a, b in zip(fused_rows + (rows_momenta or []), by_rows + (by_rows_momenta or [])):
            assert same_bits(a, b), f"apply_rows, step {step}"
        assert all(same_bits(a[1], b[1]) for a, b in zip(fused_rows, awkward(0, *SHAPES))), "row 1 moved"


# ---- the algorithms' fused updates against their per-tensor expressions --------------------------------
@pytest.mark.parametrize("mu", [0.0, 1e-3])
def test_pfedme_inner_step_and_pull_are_the_per_tensor_expressions_to_the_bit(mu):
    theta, grads, w = awkward(2, *SHAPES), awkward(3, *SHAPES), awkward(4, *SHAPES)
    lam, lr = 15.0, 0.01
    fused = inner_step(theta, grads, w, lam, lr, mu)
    expected = [t - lr * (g + lam * (t - v) + mu * t) for t, g, v in zip(theta, grads, w)]
    assert all(same_bits(a, b) for a, b in zip(fused, expected))
    assert all(same_bits(a, b) for a, b in zip(pull(w, theta, lam), [lam * (v - t) for v, t in zip(w, theta)]))
    assert all(same_bits(t, u) for t, u in zip(theta, awkward(2, *SHAPES)))  # inputs untouched


def test_perfedavg_fused_updates_are_the_per_tensor_expressions_to_the_bit():
    w, g, plus, minus = (awkward(seed, *SHAPES) for seed in (5, 6, 7, 8))
    alpha, delta = 0.01, 0.001
    assert all(same_bits(a, b) for a, b in zip(minus_scaled(w, g, alpha), [p - alpha * q for p, q in zip(w, g)]))
    shift = scaled(g, delta)
    assert all(same_bits(a, p + delta * q) for a, p, q in zip(torch._foreach_add(w, shift), w, g))
    assert all(same_bits(a, p - delta * q) for a, p, q in zip(torch._foreach_sub(w, shift), w, g))
    expected = [q - alpha * (u - v) / (2 * delta) for q, u, v in zip(g, plus, minus)]
    assert all(same_bits(a, b) for a, b in zip(hessian_free(g, plus, minus, alpha, delta), expected))


# ---- whole rounds against the per-step form ----------------------------------------------------------
def plan_by_hand(fed, rnd, clients, stream=None, **plan):
    """Sample ids [K, S, B] and step counts [K] as the per-step form built them: client by client."""
    plans = fed.local_plans(rnd, clients, stream=stream, **plan)
    counts = torch.tensor([len(p) for p in plans])
    ids = torch.zeros(len(plans), int(counts.max()), fed.cell.batch_size, dtype=torch.long)
    for k, (plan, c) in enumerate(zip(plans, clients.tolist())):
        if len(plan):
            ids[k, : len(plan)] = fed.splits["train"][c][plan]
            ids[k, len(plan) :] = ids[k, len(plan) - 1]
    return ids, counts


def sgd_by_mask(sgd, params, grads, momenta, lr, active):
    names = list(params)
    tensors, buffers = [params[n] for n in names], [momenta[n] for n in names] if sgd.momentum else None
    if bool(active.all()):
        sgd.apply(tensors, [grads[n] for n in names], buffers, lr)
    elif bool(active.any()):
        sgd.apply_rows(tensors, [grads[n] for n in names], buffers, torch.nonzero(active).flatten(), lr)


def restore(buffers, kept, active):
    if kept is not None:
        for n in buffers:
            buffers[n] = torch.where(active.view(-1, *([1] * (buffers[n].dim() - 1))), buffers[n], kept[n])


def pfedme_per_step(alg, rnd, clients, state, theta_start):
    """pFedMe's round as it was written before the fused, sync-free form: per-tensor updates, the loss
    checked (read on the host) at every inner step."""
    fed, hp = alg.engine, alg.hp
    names, buffer_names = fed.model.param_names, fed.model.buffer_names
    w = {n: state[n].detach().clone() for n in names}
    theta = {n: theta_start[n].detach().clone() for n in names}
    buffers = {n: theta_start[n].detach().clone() for n in buffer_names}
    ids, counts = plan_by_hand(fed, rnd, clients)
    momenta = {n: torch.zeros_like(p) for n, p in w.items()} if fed.sgd.momentum else {}
    for step in range(int(counts.max())):
        active = counts > step
        kept = None if bool(active.all()) else {n: b.clone() for n, b in buffers.items()}
        start = {n: t.clone() for n, t in theta.items()}
        for _ in range(hp.k):
            loss, grads = loss_and_grads(fed, theta, buffers, ids[:, step])
            if (active & ~torch.isfinite(loss)).any():
                raise Diverged(f"non-finite pFedMe loss for clients {clients[active & ~torch.isfinite(loss)].tolist()}")
            with torch.no_grad():
                theta = {
                    n: theta[n] - hp.personal_lr * (grads[n] + hp.lam * (theta[n] - w[n]) + hp.mu * theta[n])
                    for n in names
                }
        with torch.no_grad():
            theta = {n: rows_where(active, theta[n], start[n]) for n in names}
            pulled = {n: hp.lam * (w[n] - theta[n]) for n in names}
        sgd_by_mask(fed.sgd, w, pulled, momenta, fed.cell.lr, active)
        restore(buffers, kept, active)
    local, personal = {**w, **buffers}, {**theta, **buffers}
    if not (finite(local).all() and finite(personal).all()):
        raise Diverged(f"non-finite pFedMe parameters for clients {clients.tolist()}")
    return local, personal


def perfedavg_per_step(alg, rnd, clients, state):
    """Per-FedAvg's round as it was written before the fused, sync-free form."""
    fed, hp = alg.engine, alg.hp
    params = {n: state[n].detach().clone() for n in fed.model.param_names}
    buffers = {n: state[n].detach().clone() for n in fed.model.buffer_names}
    plans = [plan_by_hand(fed, rnd, clients, stream) for stream in STREAMS[: 3 if hp.variant == "hf" else 2]]
    counts = plans[0][1]
    momenta = {n: torch.zeros_like(p) for n, p in params.items()} if fed.sgd.momentum else {}
    clone = lambda s: {n: t.clone() for n, t in s.items()}  # noqa: E731
    for step in range(int(counts.max())):
        active = counts > step
        kept = None if bool(active.all()) else clone(buffers)
        loss, grads = loss_and_grads(fed, params, buffers, plans[0][0][:, step])
        w_tmp = {n: params[n] - hp.alpha * grads[n] for n in params}
        meta_loss, g = loss_and_grads(fed, w_tmp, clone(buffers), plans[1][0][:, step])
        if hp.variant == "hf":
            ids = plans[2][0][:, step]
            _, plus = loss_and_grads(fed, {n: params[n] + hp.delta * g[n] for n in params}, clone(buffers), ids)
            _, minus = loss_and_grads(fed, {n: params[n] - hp.delta * g[n] for n in params}, clone(buffers), ids)
            g = {n: g[n] - hp.alpha * (plus[n] - minus[n]) / (2 * hp.delta) for n in params}
        bad = active & ~(torch.isfinite(loss) & torch.isfinite(meta_loss))
        if bad.any():
            raise Diverged(f"non-finite Per-FedAvg loss for clients {clients[bad].tolist()} at local step {step}")
        sgd_by_mask(fed.sgd, params, g, momenta, alg.beta, active)
        restore(buffers, kept, active)
    trained = {**params, **buffers}
    if not finite(trained).all():
        raise Diverged(f"non-finite Per-FedAvg parameters for clients {clients.tolist()}")
    return trained


def adapt_per_tensor(alg, clients, state):
    """Per-FedAvg's adaptation step as it was written before the fused form."""
    fed = alg.engine
    ids, counts = plan_by_hand(fed, 0, clients, stream=PerFedAvg.ADAPT_STREAM, steps=1)
    params = {n: state[n] for n in fed.model.param_names}
    buffers = {n: state[n] for n in fed.model.buffer_names}
    _, grads = loss_and_grads(fed, params, {n: t.clone() for n, t in buffers.items()}, ids[:, 0])
    with torch.no_grad():
        stepped = {n: rows_where(counts > 0, p - alg.hp.alpha * grads[n], p) for n, p in params.items()}
    return {**stepped, **buffers}


def cell(algorithm, hp, data, **overrides):
    """Momentum and weight decay on, stragglers cut some clients' plans (tail steps with some clients
    inactive); "bn": a convolutional model with BatchNorm statistics."""
    options = dict(
        algorithm=algorithm,
        hp=hp,
        rounds=2,
        momentum=0.9,
        weight_decay=1e-3,
        system={"stragglers": 0.4, "straggler_work": 0.5},
    )
    if data == "bn":
        options.update(dataset="synthetic-images", dataset_options={"num_samples": 250, "channels": 3, "size": 32})
    return small_cell(**{**options, **overrides})


def make(alg_cls, cell_config, tmp_path, batching):
    dataset, splits = prepare_cell(cell_config, tmp_path)
    fed = Federation(cell_config, dataset, splits, ExecutionOptions(client_batching=batching))
    alg = alg_cls(fed, alg_cls.parse_hyperparams(cell_config.hp))
    alg.setup()
    return alg


def finish_round(alg, context, clients, trained) -> None:
    """The round's upload and aggregation, as `run_round` does them."""
    upload = alg.send(context, trained).delivered(alg.engine.arrived(context.number, clients)).arrived()
    if len(upload):
        alg.aggregate(context, upload)


def assert_same_state(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for n in a:
        assert same_bits(a[n], b[n]) if a[n].is_floating_point() else torch.equal(a[n], b[n]), n


CASES = [("mlp", "on"), ("mlp", "off"), ("bn", "on"), ("bn", "off")]


@pytest.mark.parametrize("data, batching", CASES)
@pytest.mark.parametrize(
    "hp", [{"k": 2, "personal_lr": 0.05, "mu": 0.01}, {"k": 2, "personal_lr": 0.05, "warm_start": "personal"}]
)
def test_pfedme_round_is_its_per_step_form_to_the_bit(tmp_path, data, batching, hp):
    alg = make(PFedMe, cell("pfedme", hp, data), tmp_path, batching)
    fed = alg.engine
    assert fed.batched == (batching == "on") and bool(fed.model.buffer_names) == (data == "bn")
    clients = torch.arange(fed.num_clients)
    counts = [len(p) for p in fed.local_plans(fed.round(1, clients), clients)]
    assert min(counts) < max(counts)  # some clients sit out the last steps
    for rnd in (1, 2):
        context, state = received(alg, rnd, clients)
        theta = (
            {n: t.clone() for n, t in state.items()}
            if alg.hp.warm_start == "global"
            else {n: t[clients].clone() for n, t in alg.personal_state.items()}
        )
        local, personal = per_client(fed, clients, partial(pfedme_per_step, alg, context), state, theta)
        trained = alg.local_train(context, state)
        assert_same_state(trained, local)
        assert_same_state({n: t[clients] for n, t in alg.personal_state.items()}, personal)
        finish_round(alg, context, clients, trained)


@pytest.mark.parametrize("data, batching", CASES)
@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_round_is_its_per_step_form_to_the_bit(tmp_path, data, batching, variant):
    alg = make(PerFedAvg, cell("perfedavg", {"variant": variant, "beta": 0.05}, data), tmp_path, batching)
    fed = alg.engine
    clients = torch.arange(fed.num_clients)
    for rnd in (1, 2):
        context, state = received(alg, rnd, clients)
        expected = per_client(fed, clients, partial(perfedavg_per_step, alg, context), state)
        trained = alg.local_train(context, state)
        assert_same_state(trained, expected)
        finish_round(alg, context, clients, trained)
    # the adaptation step (the personalized models), fused the same way
    start = {n: t.expand(fed.num_clients, *t.shape[1:]).clone() for n, t in alg.global_state.items()}
    assert_same_state(
        per_client(fed, clients, alg.adapt, start), per_client(fed, clients, partial(adapt_per_tensor, alg), start)
    )


def test_step_plan_is_the_engines_plan_with_counts_on_the_host_and_the_tail_masked(tmp_path):
    alg = make(PFedMe, cell("pfedme", {}, "mlp", clients=6), tmp_path, "on")
    fed = alg.engine
    clients = torch.tensor([0, 2, 3, 5])
    context = fed.round(1, clients)
    plan, (ids, counts) = step_plan(fed, context, clients), plan_by_hand(fed, context, clients)
    assert torch.equal(plan.ids, ids) and torch.equal(plan.counts, counts) and plan.counts.device.type == "cpu"
    assert torch.equal(step_ids(fed, context, clients)[0], ids)
    for step in range(plan.steps):
        active = plan.active(step)
        assert active.everyone == bool((counts > step).all()) and torch.equal(active.mask, counts > step)
        assert active.everyone or torch.equal(active.rows, torch.nonzero(counts > step).flatten())
    assert not plan.active(plan.steps - 1).everyone
    empty = step_plan(fed, 1, clients, epochs=0)
    assert empty.steps == 0 and empty.ids.shape == (4, 0, fed.cell.batch_size) and (empty.counts == 0).all()


# ---- no reads from the device between the first and the last step -----------------------------------
class Reads(TorchDispatchMode):
    """Counts the operations that read a tensor's value on the host (each one a device synchronisation
    when the tensor lives on a GPU), and `.tolist()` calls."""

    READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::equal", "aten::item"}

    def __enter__(self):
        self.count = 0
        self._tolist = torch.Tensor.tolist

        def tolist(tensor):
            self.count += 1
            return self._tolist(tensor)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "algorithm, hp", [("pfedme", {"k": 5}), ("perfedavg", {"variant": "fo"}), ("perfedavg", {"variant": "hf"})]
)
def test_the_steps_read_nothing_from_the_device_however_many_there_are(tmp_path, algorithm, hp):
    reads, steps = {}, {}
    for epochs in (1, 3):
        alg = make(
            PFedMe if algorithm == "pfedme" else PerFedAvg,
            cell(algorithm, hp, "mlp", local_epochs=epochs, rounds=1),
            tmp_path,
            "on",
        )
        clients = torch.arange(alg.engine.num_clients)
        context, state = received(alg, 1, clients)
        steps[epochs] = max(len(p) for p in alg.engine.local_plans(context, clients))
        with Reads() as counter:
            alg.local_train(context, state)
        reads[epochs] = counter.count
    # the per-step form read 7 values a step for pFedMe (k = 5) and 3 for Per-FedAvg, 2 more in tail
    # steps; now a round reads the same few (the clients' ids, the plan's counts, the final check of
    # the losses and the parameters, one read: `LossCheck.verdict`)
    assert steps[3] >= 3 * steps[1] - 1 and reads[1] == reads[3], (steps, reads)


# ---- divergence --------------------------------------------------------------------------------------
@pytest.mark.parametrize("batching", ["on", "off"])
@pytest.mark.parametrize("algorithm", ["pfedme", "perfedavg"])
def test_a_nan_loss_raises_diverged_naming_the_client_as_before(tmp_path, batching, algorithm):
    alg_cls = PFedMe if algorithm == "pfedme" else PerFedAvg
    alg = make(alg_cls, cell(algorithm, {}, "mlp"), tmp_path, batching)
    fed = alg.engine
    fed.features = fed.features.clone()  # (not the dataset's cached tensor)
    fed.features[fed.splits["train"][3]] = float("nan")  # client 3's training data
    clients = torch.arange(fed.num_clients)
    context, state = received(alg, 1, clients)
    with pytest.raises(Diverged) as now:
        alg.local_train(context, state)
    if algorithm == "pfedme":
        reference = partial(pfedme_per_step, alg, context)
        args = (state, {n: t.clone() for n, t in state.items()})
    else:
        reference, args = partial(perfedavg_per_step, alg, context), (state,)
    with pytest.raises(Diverged) as before:
        per_client(fed, clients, reference, *args)
    assert str(now.value) == str(before.value)
    assert str(now.value) == (
        "non-finite pFedMe loss for clients [3]"
        if algorithm == "pfedme"
        else "non-finite Per-FedAvg loss for clients [3] at local step 0"
    )


def test_loss_check_finds_the_first_failing_check_and_ignores_inactive_clients():
    nan = float("nan")
    check = LossCheck()
    everyone = Active(True, torch.ones(3, dtype=torch.bool))
    check.add(everyone, torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 1.0, 1.0]))
    check.add(
        Active(False, torch.tensor([True, False, True]), torch.tensor([0, 2])),
        torch.tensor([1.0, nan, 3.0]),
        torch.tensor([1.0, 1.0, 1.0]),
    )  # inactive client 1: ignored
    assert check.first_failure() is None
    check.add(everyone, torch.tensor([1.0, 2.0, 3.0]), torch.tensor([float("inf"), 1.0, nan]))
    check.add(everyone, torch.tensor([nan, nan, nan]), torch.tensor([1.0, 1.0, 1.0]))
    index, clients = check.first_failure()
    assert index == 2 and clients.tolist() == [True, False, True]
    with pytest.raises(ValueError):
        check.add(everyone, torch.zeros(3))
    assert LossCheck().first_failure() is None


def test_the_losses_and_the_trained_rows_are_checked_in_one_read_of_the_device():
    """`LossCheck.verdict`: `first_failure` and whether every trained row is finite, one read where no
    check failed (the round's only one at its end), and the same answers as the two separate checks."""
    nan = float("nan")
    everyone = Active(True, torch.ones(3, dtype=torch.bool))
    for losses, rows in (
        ([1.0, 2.0, 3.0], [True, True, True]),
        ([1.0, 2.0, 3.0], [True, False, True]),
        ([1.0, nan, 3.0], [True, True, True]),
        ([nan, 2.0, nan], [False, True, True]),
    ):
        check = LossCheck()
        check.add(everyone, torch.tensor([1.0, 1.0, 1.0]))
        check.add(everyone, torch.tensor(losses))
        with Reads() as reads:
            failure, ok = check.verdict(torch.tensor(rows))
        assert ok == all(rows)
        separate = check.first_failure()
        if separate is None:
            assert failure is None and reads.count == 1
        else:
            assert failure[0] == separate[0] == 1 and failure[1].tolist() == separate[1].tolist()
            assert failure[1].tolist() == [x != x for x in losses]
    assert LossCheck().verdict() == (None, True)
    assert LossCheck().verdict(torch.tensor([True, False])) == (None, False)
