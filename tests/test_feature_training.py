"""pflbench/kit/feature_training.py: the representation before a linear head, from one forward, on every path the
engine calls a model (one client bound, the natively batched twin, vmap), and local SGD on an objective
that reads it, batched or one client at a time."""

import pytest
import torch
import torch.nn.functional as F

from cells import federation, small_cell
from pflbench.simulator.models import CNN, MLP
from pflbench.kit.feature_training import forward_with_features, head_of, train_with_features
from pflbench.simulator.client_model import ClientModel


def _stacked(model, clients):
    state = model.init(clients, seed=0)
    return {
        n: t + 0.01 * torch.arange(clients, dtype=t.dtype).view(-1, *([1] * (t.dim() - 1)))
        if t.is_floating_point()
        else t
        for n, t in state.items()
    }


@pytest.mark.parametrize("clients", [1, 3], ids=["bound", "stacked"])
@pytest.mark.parametrize("native", [True, False], ids=["twin", "vmap"])
@pytest.mark.parametrize(
    "net", [lambda: MLP((60,), 10), lambda: CNN((3, 32, 32), 10, batch_norm=True)], ids=["mlp", "cnn-bn"]
)
def test_logits_are_the_models_and_the_representation_is_the_heads_input(net, native, clients):
    model = ClientModel(net(), native=native)
    state = _stacked(model, clients)
    x = torch.randn(clients, 5, *((60,) if isinstance(model._module, MLP) else (3, 32, 32)))
    head = head_of(model)
    assert (head.weight, head.bias, head.dim) == (
        "fc3.weight",
        "fc3.bias",
        64 if isinstance(model._module, MLP) else 84,
    )
    logits, features = forward_with_features(model, state, x, train=False)
    torch.testing.assert_close(logits, model.forward(state, x, train=False))
    torch.testing.assert_close(head.logits(state, features), logits, rtol=1e-5, atol=1e-6)
    assert features.shape == (clients, 5, head.dim) and bool((features >= 0).all())  # after fc2's ReLU


def test_batchnorm_statistics_move_in_training_mode_as_in_the_engines_forward():
    model = ClientModel(CNN((3, 32, 32), 10, batch_norm=True))
    x = torch.randn(2, 4, 3, 32, 32)
    ours, engines = _stacked(model, 2), _stacked(model, 2)
    forward_with_features(model, ours, x, train=True)
    model.forward(engines, x, train=True)
    for n in model.buffer_names:
        torch.testing.assert_close(ours[n], engines[n])
    assert not torch.equal(ours["bn1.running_mean"], _stacked(model, 2)["bn1.running_mean"])


def test_a_model_whose_last_layer_is_not_linear_is_refused():
    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 2, 3)

        def forward(self, x):
            return self.conv(x).flatten(1)

    with pytest.raises(ValueError, match="last layer \\(conv\\) is a Conv2d"):
        head_of(ClientModel(Conv()))


def test_training_on_the_plain_objective_is_the_engines_training(tmp_path):
    """With the cross-entropy of the model's own logits, train_with_features is the engine's local SGD."""
    fed = federation(small_cell(), tmp_path)
    clients = torch.arange(3)
    start = fed.init_state(3)

    def objective(logits, features, labels, state, carry):
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(
            1
        ), carry

    ours, _, loss = train_with_features(fed, 1, clients, start, objective)
    engines = fed.train(1, clients, start)
    for n in fed.model.names:
        torch.testing.assert_close(ours[n], engines.state[n], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, engines.loss, rtol=1e-5, atol=1e-6)


def test_batched_and_one_at_a_time_agree_with_a_carry_and_a_tensor_of_the_methods(tmp_path):
    fed = federation(small_cell(), tmp_path)
    clients = torch.tensor([0, 2, 4])
    dim = head_of(fed.model).dim
    start = {**fed.init_state(3), "shift": torch.zeros(3, dim)}

    def objective(logits, features, labels, state, carry):
        head = head_of(fed.model)
        shifted = head.logits(state, features + state["shift"].unsqueeze(1))
        ce = F.cross_entropy(shifted.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(1)
        mean = 0.5 * carry["mean"] + 0.5 * features.mean(1)
        return ce + (mean**2).mean(1), {"mean": mean}

    carry = {"mean": torch.zeros(3, dim)}
    batched = train_with_features(fed, 1, clients, start, objective, carry=carry)
    fed.batched = False
    looped = train_with_features(fed, 1, clients, start, objective, carry=carry)
    for a, b in zip(batched[:2], looped[:2]):
        for n in a:
            torch.testing.assert_close(a[n], b[n], rtol=1e-4, atol=1e-5)
    assert not torch.equal(batched[0]["shift"], start["shift"])  # the method's own tensor was trained
