"""FedAvg (McMahan et al., 2017) as a base other methods extend: `pflbench.algorithm.Algorithm` is only
the hooks, and this is FedAvg's behaviour for them, with partial personalization. The server keeps one
global model, each client keeps its own copy of everything, and `is_local(name)` says which tensors never
leave the client: with nothing local this is FedAvg; with BatchNorm local it is FedBN; with the head local
FedPer; with everything local Local training. Methods that do more (a regularized objective, a personal
model beside the global one, a server step of their own) override the hooks they change; one that changes
only the server's step (server momentum, FedAvgM) starts from `weighted_mean(upload)`, FedAvg's average of
the uploads.

It lives in the engine's package, beside `Algorithm`, because a base a method extends is part of the
method API (typed, documented, importable as `pflbench.fedavg` wherever pflbench is installed);
pflbench/algorithms/fedavg.py registers it under its name, "fedavg", with its card and its paper.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from pflbench.algorithm import HP, Algorithm, ClientRound, Models, Payload, Round, Serving
from pflbench.api_types import State, weighted_mean


class FedAvg(Algorithm[HP]):
    """A global model ([1, ...] per tensor, `global_state`), every client's copy ([N, ...],
    `client_state`: its latest trained model, whose `is_local` part it keeps), the sample-weighted mean of
    the uploads (`weighted_mean`). Generic over the hyperparameters like `Algorithm`
    (`class FedPer(FedAvg[FedPerHP])`). Registered as "fedavg" by pflbench/algorithms/fedavg.py."""

    # What rounds change (pflbench.algorithm, checkpoints); a subclass extends it: (*FedAvg.state, ...).
    state: ClassVar[tuple[str, ...]] = ("global_state", "client_state")
    global_state: State  # [1, ...] per tensor
    client_state: State  # [N, ...] per tensor

    def setup(self) -> None:
        """The global model and every client's copy, all the same initial model."""
        self.global_state = self.engine.init_state(1)
        self.client_state = self.engine.init_state(self.engine.num_clients)

    def is_local(self, name: str) -> bool:
        """Whether the tensor `name` stays on the client (never sent, never aggregated). FedAvg: none."""
        return False

    def stays_on_client(self, name: str) -> bool:
        """`is_local`, or a tensor that never leaves a client under the privacy knob (BatchNorm
        statistics, `pflbench.simulator.privacy`: `engine.kept_local`): each client's model keeps its own."""
        return self.is_local(name) or name in self.engine.kept_local

    def shared_names(self) -> list[str]:
        """The model's tensors that leave the clients (not `stays_on_client`), in the model's order."""
        return [n for n in self.engine.model.names if not self.stays_on_client(n)]

    # ---- the round ---------------------------------------------------------------------------------
    def configure(self, rnd: Round) -> Payload:
        """The global model's shared part, stacked once per sampled client."""
        return Payload.broadcast({n: self.global_state[n] for n in self.shared_names()}, rnd.clients)

    def receive(self, rnd: ClientRound, download: Payload) -> State:
        """The downloaded model, completed by the client's own local part, stacked [K, ...]."""
        sent = download.state
        return {n: sent[n] if n in sent else self.client_state[n][rnd.clients] for n in self.engine.model.names}

    def send(self, rnd: ClientRound, state: State) -> Payload:
        """The trained model is the client's; its shared part is uploaded. Every key of `state` is kept:
        each is written into `client_state` (a key `client_state` does not hold is a KeyError), and the
        upload is the `shared_names()` of it. A method that trains extra values beside the model (e.g.
        SCAFFOLD's control variates) splits them off `state` before calling this and adds them to the
        returned Payload itself. Under the privacy knob every floating tensor of the upload is privatized
        with the model (`Algorithm.dp_upload`)."""
        for n, t in state.items():
            self.client_state[n][rnd.clients] = t
        return Payload.from_state({n: state[n] for n in self.shared_names()}, rnd.clients)

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        """The global model becomes the uploads' `weighted_mean`."""
        average = self.weighted_mean(upload)
        if average:  # an empty upload (everything local, e.g. Local across architectures) leaves no global model
            self.global_state.update(average)

    def weighted_mean(self, upload: Payload, weights: torch.Tensor | None = None) -> State:
        """FedAvg's average of a stacked `upload` (e.g. `aggregate`'s): each tensor averaged over the
        uploading clients (`upload.clients`), weighted by their training samples, or by `weights`
        ([len(upload.clients)], normalized here to sum to 1); integer tensors (BatchNorm's batch
        counters) take the maximum. Shaped like `global_state` ([1, ...] per tensor) and new tensors:
        the algorithm's state is not changed. A server step of its own (server momentum, a server
        learning rate) starts from it:

            def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
                average = self.weighted_mean(upload)
                ...  # the step from self.global_state towards `average`
        """
        if weights is None:
            weights = self.engine.train_sizes[upload.clients].float()
        weights = weights / weights.sum()
        return {n: weighted_mean(t, weights).unsqueeze(0) for n, t in upload.state.items()}

    # ---- evaluation ----------------------------------------------------------------------------------
    def personalized(self) -> Models:
        """The global shared part with each client's local part (`global_with_local`)."""
        return self.global_with_local()

    def global_with_local(self) -> State:
        """The global shared part with each client's local part: a stacked State [N, ...], what a method
        building its personalized models on FedAvg's starts from."""
        n_clients = self.engine.num_clients
        return {
            n: (
                self.client_state[n]
                if self.stays_on_client(n)
                else self.global_state[n].expand(n_clients, *self.global_state[n].shape[1:])
            )
            for n in self.engine.model.names
        }

    def newcomer_models(self, serving: Serving) -> Models:
        """The global model's shared part; a local part, where there is one, starts from the initial
        model and is trained on the newcomer's train split for the cell's `local_epochs` with the shared
        part frozen (FedRep's procedure for new clients). So FedAvg, FedProx, Ditto, APFL, L2GD, pFedMe
        get the global model; FedPer, LG-FedAvg, FedBN fit their personal layers."""
        return self.fit_local_part(serving, self.engine.budget.local_epochs)

    def fit_local_part(self, serving: Serving, epochs: int, trainable: list[str] | None = None) -> State:
        """The global shared part with the initial local part, that local part (or `trainable`)
        trained for `epochs` on each of `serving.clients`' train split."""
        newcomers = serving.clients
        count = newcomers.num_clients
        start = newcomers.init_state(count)
        for n in self.shared_names():
            start[n] = self.global_state[n].expand(count, *self.global_state[n].shape[1:]).clone()
        if trainable is None:
            trainable = [n for n in self.engine.model.param_names if self.is_local(n)]
        if not trainable or not epochs:
            return start
        everyone = torch.arange(count, device=newcomers.device)
        return newcomers.train(
            serving.round, everyone, start, trainable=trainable, epochs=epochs, stream="batches.newcomer-fit"
        ).state
