"""What a method's checkpoint captures of it: the attributes its class declares (`state`), saved as they
are, and the objects with their own state (`state_objects`), saved through it (pflbench.algorithm's
module doc, "State for checkpoints").

The capture itself is generic: any object whose class declares `state_objects` (a method), and the values it accepts are tensors,
arrays and plain values in any nesting of lists, tuples and dicts (`check_capturable`). `Algorithm`
(pflbench.algorithm) says which attributes; this module says how they are taken and put back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class StateError(TypeError):
    """An algorithm attribute that `Algorithm.state_dict()` cannot capture (pflbench.algorithm's module doc)."""


def captured_state(algorithm: Any, names: tuple[str, ...]) -> dict:
    """`Algorithm.state_dict()` of the attributes `names` (those the instance has: some are set on first
    use, e.g. by an evaluation) and of its class's `state_objects`."""
    where, own = type(algorithm).__name__, vars(algorithm)
    values = {}
    for name in names:
        if name in own:
            check_capturable(own[name], f"{where}.{name}")
            values[name] = own[name]
    objects = {n: object_state(getattr(algorithm, n, None), f"{where}.{n}") for n in type(algorithm).state_objects}
    return {"attributes": values, "objects": objects}


def restore_state(algorithm: Any, state: dict, names: tuple[str, ...]) -> None:
    """`Algorithm.load_state_dict()`: `state` (`captured_state`'s of `names`) into `algorithm`, after its
    `setup()`; StateError if it was not taken from such an instance."""
    cls = type(algorithm)
    saved = set(state["attributes"])
    missing = [n for n in names if n in vars(algorithm) and n not in saved]
    foreign = sorted(saved - set(names))
    if missing or foreign or set(state["objects"]) != set(cls.state_objects):
        raise StateError(
            f"the state was not taken from a {cls.__name__}: it lacks {', '.join(missing) or 'nothing setup() creates'}"
            f"; it has {', '.join(foreign) or 'nothing undeclared'}; its objects are {sorted(state['objects'])}, "
            f"this class's {sorted(cls.state_objects)}"
        )
    for name, value in state["attributes"].items():
        setattr(algorithm, name, value)
    for name in cls.state_objects:
        load_object_state(algorithm, name, state["objects"][name])


PLAIN_TYPES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.Tensor,
    np.ndarray,
    np.generic,
    torch.dtype,
    torch.device,
    torch.Size,
)


def check_capturable(value: Any, where: str) -> None:
    """StateError unless `value` is tensors / arrays / plain values in lists, tuples, sets and dicts."""
    if isinstance(value, PLAIN_TYPES):
        return
    if type(value) in (list, tuple, set, frozenset):
        for i, item in enumerate(value):
            check_capturable(item, f"{where}[{i}]")
        return
    if type(value) is dict:
        for key, item in value.items():
            check_capturable(key, f"{where} key {key!r}")
            check_capturable(item, f"{where}[{key!r}]")
        return
    raise StateError(
        f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint cannot capture "
        f"generically (tensors, numpy arrays, plain values and lists/tuples/dicts of them): name the attribute in "
        f"`state_objects` if it is an nn.Module, an optimizer or a random generator, in `state_rebuilt` if setup() "
        f"rebuilds it unchanged from the cell, or extend state_dict()/load_state_dict() (pflbench/algorithm.py)"
    )


def object_state(obj: Any, where: str) -> Any:
    """The state of a `state_objects` attribute: state_dict() of a module or optimizer, a generator's state."""
    if obj is None:
        return None
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, np.random.Generator):
        return obj.bit_generator.state
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return obj.state_dict()
    raise StateError(
        f"{where} is in `state_objects` but a {type(obj).__qualname__} has no state_dict()/"
        f"load_state_dict() and is not a random generator"
    )


def load_object_state(owner: Any, name: str, saved: Any) -> None:
    obj = getattr(owner, name, None)
    if saved is None or obj is None:
        if (saved is None) != (obj is None):
            raise StateError(
                f"{type(owner).__name__}.{name}: the checkpoint has "
                f"{'none' if saved is None else 'one'}, this instance {'none' if obj is None else 'one'}"
            )
        return
    if isinstance(obj, torch.Generator):
        obj.set_state(saved.cpu())  # a generator's state is a CPU tensor, wherever the payload was loaded
    elif isinstance(obj, np.random.Generator):
        obj.bit_generator.state = saved
    else:
        obj.load_state_dict(saved)
