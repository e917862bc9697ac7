"""FedRep (Collins, Hassani, Mokhtari & Shakkottai, ICML 2021, "Exploiting Shared Representations for
Personalized Federated Learning").

What the paper says: the model is a shared representation (the body) followed by a personal head.
In every round a selected client receives the global body, then (1) trains its own head for tau_h
local epochs with the body fixed, and (2) trains the body for tau_b epochs with its new head fixed;
it sends back the body only, which the server averages. Heads never leave the clients. The head is
the final linear classifier; the paper's experiments use many more head epochs than body epochs
(10 for the head, 1 for the representation, with SGD), since updating the small head is cheap. The
personalized model of a client is the global body with its own head.

Where the paper is silent / what was chosen here:
- Head = the last `personal_layers` layers (`fed.model.split_layers`; default 1, the classifier),
  body = the rest, including BatchNorm layers and their statistics (shared; FedRep does not keep
  them local).
- `head_epochs` default 10 (the paper); `body_epochs` default None = the cell's `local_epochs`, so the
  shared part gets the same amount of training as every other method's model at that setting.
- Both phases use the cell's optimizer settings (lr, momentum, weight decay, batch size); the head
  phase uses its own batch order (salt `HEAD_SALT`), the body phase the engine's default one.
  BatchNorm statistics follow both phases' forward passes.
- Every client's head starts from the common initial model's head; clients not sampled keep theirs.
- Aggregation of the body: the engine's sample-size-weighted mean (the official code weights by
  client data size; the paper writes a plain mean, which is the same for equal client sizes).
- Communication: the body down and up; the head never appears in what is sent (tested).
- Batched: yes, both phases are `fed.train` calls with `trainable=` the phase's tensors.
- Cost: a round makes head_epochs + body_epochs passes over the client's data (the head phase's
  backward stops at the head). Measured on the demo's Fashion-MNIST cells (300 samples per client,
  10 clients, 5 rounds, shared 2-core CPU): about 22-35 s per cell, `local` about 8 s.
"""
from __future__ import annotations

from pydantic import Field

from pflbench.algorithm import ALGORITHMS, Algorithm, Hyperparams


@ALGORITHMS.register("fedrep")
class FedRep(Algorithm):
    name = "fedrep"
    paper = "Collins, Hassani, Mokhtari & Shakkottai, ICML 2021"
    personalizes = "the head (classifier), trained first with the shared representation fixed"
    HEAD_SALT = 0xFE0E

    class Hyperparams(Hyperparams):
        head_epochs: int = Field(10, ge=0)
        body_epochs: int | None = Field(None, ge=1)   # None: the cell's local_epochs
        personal_layers: int = Field(1, ge=1)

    search_space = {"head_epochs": ("int", 1, 15), "personal_layers": ("choice", [1, 2])}

    def setup(self) -> None:
        super().setup()
        _, self._head = self.fed.model.split_layers(self.hp.personal_layers)
        params = self.fed.model.param_names
        self._head_params = [n for n in params if n in self._head]
        self._body_params = [n for n in params if n not in self._head]

    def is_local(self, name: str) -> bool:
        return name in self._head

    def local_train(self, rnd, clients, state):
        if self.hp.head_epochs:
            state = self.fed.train(rnd, clients, state, trainable=self._head_params,
                                   epochs=self.hp.head_epochs, salt=self.HEAD_SALT).state
        return self.fed.train(rnd, clients, state, trainable=self._body_params,
                              epochs=self.hp.body_epochs).state
