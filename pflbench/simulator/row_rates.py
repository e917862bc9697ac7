"""The engine's SGD rule with its hyperparameters as device tensors, one entry per client row.

Why: rows of a batched step that belong to different cells (a cell group's merged call,
`pflbench.simulator.groups`) may train with different learning rates (a column's rows: 0.005, 0.01, 0.05 ...),
and a step captured as a CUDA graph (`pflbench.simulator.static_step`) must not bake a learning rate into the
graph: with the rates in tensors, rows with different values share one step, and a new value is a
copy into a buffer, not a new graph.

Bits. `pflbench.simulator.training.SGD.apply` is torch.optim.SGD's rule: `g.add(p, alpha=wd)`,
`m.mul_(momentum).add_(d)`, `p.add_(d, alpha=-lr)`. A scalar `alpha` is one fused multiply-add
(`vec::fmadd`), so `p - lr * d` written as a multiplication and then a subtraction differs in the last
bit. `torch.addcmul(p, d, -lr)` with `-lr` a tensor rounds once as well and gives add's bits; measured
on this CPU at its AVX-512, AVX2 and default kernels, for every parameter shape of the CNNs at widths
1-20 (tests/test_row_rates.py checks it here, on whatever CPU runs the tests). The momentum's
multiplication and addition stay two operations, as in the scalar rule. So a row of `RowRates.apply`
gets, bit for bit, what `SGD.apply` with that row's scalars gives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol
from collections.abc import Sequence

import torch
from torch import Tensor


class Rule(Protocol):
    """What a row's rule gives (`pflbench.simulator.training.SGD`, not imported: training imports this module)."""

    @property
    def lr(self) -> float: ...

    @property
    def momentum(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...


def structure(rule: Rule) -> tuple[bool, bool]:
    """What rows must share to train in one step: whether the rule has momentum, weight decay. (A row
    without momentum is not run as momentum 0: with a non-finite gradient 0 * m is NaN, not 0.)"""
    return bool(rule.momentum), bool(rule.weight_decay)


@dataclass(frozen=True)
class RowRates:
    """Per row k: `neg_lr[k]` = -lr, and `momentum[k]`, `weight_decay[k]` (None where the rows' rules have
    none), each [K] on the device, in the parameters' dtype."""

    neg_lr: Tensor
    momentum: Tensor | None = None
    weight_decay: Tensor | None = None

    @classmethod
    def of(cls, rules: Sequence[Rule], device: torch.device | str, dtype: torch.dtype = torch.float32) -> RowRates:
        """The rates of `rules` (one per row, all of one `structure`), in one copy to the device."""
        if not rules:
            raise ValueError("RowRates of no rows")
        shapes = {structure(r) for r in rules}
        if len(shapes) != 1:
            raise ValueError(
                f"rows of one step share whether they have momentum and weight decay; got {sorted(shapes)}"
            )
        momentum, decay = shapes.pop()
        columns = [[-r.lr for r in rules]]
        columns += [[r.momentum for r in rules]] if momentum else []
        columns += [[r.weight_decay for r in rules]] if decay else []
        packed = torch.tensor(columns, dtype=dtype).to(device)
        rest = iter(packed[1:])
        return cls(packed[0], next(rest) if momentum else None, next(rest) if decay else None)

    def __len__(self) -> int:
        return len(self.neg_lr)

    def rows(self, rows: Tensor) -> RowRates:
        """The rates of rows `rows` (indices into the leading dimension)."""
        return RowRates(
            self.neg_lr[rows],
            None if self.momentum is None else self.momentum[rows],
            None if self.weight_decay is None else self.weight_decay[rows],
        )

    def fill(self, other: RowRates) -> None:
        """Copy `other`'s values into these tensors in place (a captured step's buffers)."""
        for mine, theirs in (
            (self.neg_lr, other.neg_lr),
            (self.momentum, other.momentum),
            (self.weight_decay, other.weight_decay),
        ):
            if (mine is None) != (theirs is None):
                raise ValueError("rates of another structure (momentum, weight decay)")
            if mine is not None and theirs is not None:
                mine.copy_(theirs)

    def updates(
        self, params: list[Tensor], grads: list[Tensor] | tuple[Tensor, ...], momenta: list[Tensor] | None
    ) -> tuple[list[Tensor], list[Tensor] | None]:
        """The rule's new parameters and momenta for every row, out of place (the inputs unchanged):
        d = g + wd * p; with momentum m' = momentum * m + d and d = m'; p' = p - lr * d."""
        with torch.no_grad():
            directions = list(grads)
            if self.weight_decay is not None:
                directions = list(torch._foreach_addcmul(directions, params, _views(self.weight_decay, params)))
            new_momenta = None
            if self.momentum is not None:
                if momenta is None:
                    raise ValueError("rates with momentum need momentum buffers")
                new_momenta = list(torch._foreach_mul(momenta, _views(self.momentum, momenta)))
                torch._foreach_add_(new_momenta, directions)
                directions = new_momenta
            return list(torch._foreach_addcmul(params, directions, _views(self.neg_lr, params))), new_momenta

    def apply(
        self, params: list[Tensor], grads: list[Tensor] | tuple[Tensor, ...], momenta: list[Tensor] | None
    ) -> None:
        """One step of every row in place (`SGD.apply` with each row's own values)."""
        if not params:
            return
        with torch.no_grad():
            directions = list(grads)
            if self.weight_decay is not None:
                directions = list(torch._foreach_addcmul(directions, params, _views(self.weight_decay, params)))
            if self.momentum is not None:
                if momenta is None:
                    raise ValueError("rates with momentum need momentum buffers")
                torch._foreach_mul_(momenta, _views(self.momentum, momenta))
                torch._foreach_add_(momenta, directions)
                directions = momenta
            torch._foreach_addcmul_(params, directions, _views(self.neg_lr, params))

    def apply_rows(
        self, params: list[Tensor], grads: list[Tensor] | tuple[Tensor, ...], momenta: list[Tensor] | None, rows: Tensor
    ) -> None:
        """`apply` to rows `rows` only; the others keep their parameters and momenta
        (`SGD.apply_rows`'s gathers and scatters)."""
        with torch.no_grad():
            chosen = [p[rows] for p in params]
            chosen_momenta = None if momenta is None else [m[rows] for m in momenta]
            self.rows(rows).apply(chosen, [g[rows] for g in grads], chosen_momenta)
            for p, new in zip(params, chosen):
                p.index_copy_(0, rows, new)
            for m, new in zip(momenta or [], chosen_momenta or []):
                m.index_copy_(0, rows, new)


def _views(values: Tensor, like: list[Tensor]) -> list[Tensor]:
    """`values` [K] viewed to broadcast over each tensor of `like` ([K, ...])."""
    return [values.view(-1, *([1] * (t.dim() - 1))) for t in like]
