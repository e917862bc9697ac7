"""Per-row SGD rates as device tensors (pflbench.simulator.row_rates): every row of `RowRates.apply` and
`apply_rows` is, bit for bit, `SGD.apply` with that row's scalars (torch.optim.SGD's rule), for every
parameter shape of the CNNs and awkward values (signed zeros, infinities, NaN, subnormals); this CPU's
fused multiply-add included (`addcmul` with a tensor rate rounds once, as `add` with a scalar alpha)."""

import pytest
import torch

from pflbench.simulator.models import build_model
from pflbench.simulator.row_rates import RowRates, structure
from pflbench.simulator.training import SGD
from test_fused_steps import awkward, same_bits

MODEL_SHAPES = sorted(
    {
        tuple(p.shape)
        for name, shape in [("cnn", (1, 28, 28)), ("cnn-bn", (3, 32, 32)), ("cnn", (3, 32, 32))]
        for p in build_model(name, shape, 10).parameters()
    }
)
LRS = [0.005, 0.01, 0.05, 0.1, 0.015, 0.09, 0.3]


def rules(momentum: float, weight_decay: float, width: int) -> list[SGD]:
    return [
        SGD(
            LRS[k % len(LRS)],
            momentum * (1 + k / 10) if momentum else 0.0,
            weight_decay * (1 + k) if weight_decay else 0.0,
        )
        for k in range(width)
    ]


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.5, 1e-3), (0.0, 5e-4)])
@pytest.mark.parametrize("width", [2, 7])
def test_each_row_is_the_scalar_rule_to_the_bit(momentum, weight_decay, width):
    shapes = [(width, *shape) for shape in MODEL_SHAPES]
    row_rules = rules(momentum, weight_decay, width)
    rates = RowRates.of(row_rules, "cpu")
    params = awkward(0, *shapes)
    momenta = awkward(1, *shapes) if momentum else None
    by_row = [[p[k].clone() for p in params] for k in range(width)]
    by_row_momenta = [[m[k].clone() for m in momenta] if momenta else None for k in range(width)]
    rows = torch.tensor([k for k in range(width) if k % 2 == 0])
    partial = [p.clone() for p in params]
    partial_momenta = None if momenta is None else [m.clone() for m in momenta]
    for step in range(3):
        grads = awkward(10 + step, *shapes)
        rates.apply(params, grads, momenta)
        rates.apply_rows(partial, grads, partial_momenta, rows)
        for k, rule in enumerate(row_rules):
            rule.apply(by_row[k], [g[k] for g in grads], by_row_momenta[k])
            for p, expected in zip(params, by_row[k]):
                assert same_bits(p[k], expected)
            for m, expected in zip(momenta or [], by_row_momenta[k] or []):
                assert same_bits(m[k], expected)
    # apply_rows: the chosen rows took every step as `apply` gave them, the others none
    for p, trained, original in zip(partial, params, awkward(0, *shapes)):
        for k in range(width):
            assert same_bits(p[k], trained[k] if k in rows.tolist() else original[k])


def test_updates_are_apply_out_of_place():
    shapes = [(3, *shape) for shape in MODEL_SHAPES]
    rates = RowRates.of(rules(0.9, 1e-3, 3), "cpu")
    params, momenta, grads = awkward(0, *shapes), awkward(1, *shapes), awkward(2, *shapes)
    kept = [p.clone() for p in params], [m.clone() for m in momenta]
    new, new_momenta = rates.updates(params, grads, momenta)
    for p, k in zip(params + momenta, kept[0] + kept[1]):
        assert same_bits(p, k)  # inputs unchanged
    rates.apply(params, grads, momenta)
    assert new_momenta is not None
    for a, b in zip(new + new_momenta, params + momenta):
        assert same_bits(a, b)


def test_rows_of_another_structure_refused_and_fill_keeps_the_buffers():
    with pytest.raises(ValueError, match="share whether they have momentum"):
        RowRates.of([SGD(0.1), SGD(0.1, momentum=0.9)], "cpu")
    with pytest.raises(ValueError, match="no rows"):
        RowRates.of([], "cpu")
    assert structure(SGD(0.1, 0.9, 0.0)) == (True, False) and structure(SGD(0.1)) == (False, False)
    buffers = RowRates.of([SGD(0.1), SGD(0.2)], "cpu")
    address = buffers.neg_lr.data_ptr()
    buffers.fill(RowRates.of([SGD(0.3), SGD(0.4)], "cpu"))
    assert buffers.neg_lr.data_ptr() == address and buffers.neg_lr.tolist() == pytest.approx([-0.3, -0.4])
    with pytest.raises(ValueError, match="another structure"):
        buffers.fill(RowRates.of([SGD(0.3, 0.9), SGD(0.4, 0.9)], "cpu"))
