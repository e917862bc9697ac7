"""Named random streams (pflbench/streams.py): every generator of a cell comes from one function; the
names that existed before as hand-picked salts keep their draws (published cells re-run bit for bit);
nothing outside the module seeds anything by hand; FedMN's router samples follow the cell's seed."""
import hashlib
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from cells import federation, small_cell
from pflbench import streams
from pflbench.steps import step_ids

ROOT = Path(__file__).resolve().parents[1]
SEEDING = re.compile(r"manual_seed\(|default_rng\(|Generator\(|SeedSequence\(|RandomState\(|np\.random\.seed\(|"
                     r"random\.seed\(|random\.Random\(")
# Seeding that is not a cell's randomness, each with why. A new entry needs a reason as good.
ALLOWED = {
    "pflbench/streams.py": "the one place cells' generators are made",
    "pflbench/data/synthetic.py": "the dataset's own `seed` option generates its samples (part of the dataset's checksum)",
    "pflbench/data/synthetic_images.py": "likewise",
    "pflbench/bench.py": "the speed benchmark's inputs, no cell",
    "pflbench/reports/figures.py": "a fixed jitter of points in a figure",
    "pflbench/verify.py": "which published cells CI re-runs (--seed), no cell",
}


def _sources():
    for folder in ("pflbench", "algorithms", "partitions"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_seeding_outside_the_streams_module():
    found = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if SEEDING.search(code):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, ("seeded outside pflbench/streams.py (use streams.generator / streams.torch_global with a "
                       "stream name):\n" + "\n".join(found))


def test_no_hand_picked_salts_outside_the_streams_module():
    salt = re.compile(r"\b[A-Z_]*SALTS?\b\s*=|salt=0x|\bseed\s*\*\s*\d")
    found = [f"{p.relative_to(ROOT).as_posix()}:{n}" for p in _sources() if p.name != "streams.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if salt.search(line.split("#", 1)[0])]
    assert not found, found


def _sha_seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


@pytest.mark.parametrize("seed", [0, 3])
def test_the_legacy_names_draw_what_the_hand_seeded_code_drew(seed):
    """A few of the derivations published cells depend on, written out as the code had them."""
    def same_numpy(name, entropy, **where):
        assert np.array_equal(streams.generator(seed, name, kind="numpy", **where).random(5),
                              np.random.default_rng(entropy).random(5)), name

    def same_torch(name, value, **where):
        assert torch.equal(torch.randperm(50, generator=streams.generator(seed, name, **where)),
                           torch.randperm(50, generator=torch.Generator().manual_seed(value))), name

    same_numpy("schedule", [seed, 0x5A3])
    same_numpy("newcomers", [seed, 0x0E3C])
    same_numpy("system", [seed, 0x5E7])
    same_numpy("fedfomo.explore", [seed, 4, 0xF0F0], round=4)
    same_numpy("partition.split", np.random.SeedSequence(seed).spawn(2)[1])
    same_torch("batches", _sha_seed(f"{seed}/4/7/0"), round=4, client=7)
    same_torch("batches.newcomer-fit", _sha_seed(f"{seed}/4/7/{0x0E3D}"), round=4, client=7)
    same_torch("privacy.noise", _sha_seed(f"{seed}/2/1/{0xD1F}"), round=2, client=1)
    same_torch("pfedla.hypernet", seed * 7919 + 17)
    assert streams.seed(seed, "global") == _sha_seed(f"{seed}/global-rng")
    assert streams.seed(seed, "fedmn.adapt-dropout", 5, 2) == seed * 1_000_003 + 5 * 1009 + 2


def test_new_names_are_their_own_streams():
    draw = lambda *a, **k: torch.rand(4, generator=streams.generator(*a, **k))  # noqa: E731
    assert torch.equal(draw(0, "myalgo.noise", 1, 2), draw(0, "myalgo.noise", 1, 2))
    others = [draw(1, "myalgo.noise", 1, 2), draw(0, "myalgo.other", 1, 2), draw(0, "myalgo.noise", 2, 2),
              draw(0, "myalgo.noise", 1, 3), draw(0, "myalgo.noise")]
    assert not any(torch.equal(draw(0, "myalgo.noise", 1, 2), o) for o in others)
    rng = streams.generator(0, "myalgo.coins", kind="numpy")
    assert isinstance(rng, np.random.Generator)


def test_a_stream_is_drawn_with_its_own_kind_and_its_own_keys():
    with pytest.raises(ValueError, match="numpy"):
        streams.generator(0, "schedule")
    with pytest.raises(ValueError, match="round"):
        streams.generator(0, "batches", client=1)


def test_torch_global_seeds_inside_and_restores_after():
    before = torch.random.get_rng_state()
    with streams.torch_global(0, "model.init"):
        inside = torch.rand(3)
    assert torch.equal(torch.random.get_rng_state(), before)
    with streams.torch_global(0, "model.init"):
        assert torch.equal(torch.rand(3), inside)


def test_fedmn_router_samples_follow_the_cell_seed():
    """They drew from the client alone (the same at every seed: a defect); seed 0 keeps those draws."""
    def sample(seed, client):
        return torch.randperm(100, generator=streams.generator(seed, "fedmn.router-samples", client=client))

    assert torch.equal(sample(0, 3), torch.randperm(100, generator=torch.Generator().manual_seed(3)))
    assert not torch.equal(sample(0, 3), sample(1, 3))
    assert not torch.equal(sample(1, 3), sample(1, 4))


def test_fedmn_routing_draws_its_samples_from_the_cell_seed(tmp_path, monkeypatch):
    from pflbench.algorithms.fedmn import FedMN

    hp = {"dims": [16, 8], "encoder_hidden": 16, "router_x_dim": 8, "router_y_dim": 4, "router_samples": 8}
    drawn = {}
    for seed in (0, 1):
        cell = small_cell(algorithm="fedmn", dataset="synthetic-images", dataset_options={"num_samples": 240},
                          clients=3, seed=seed, hp=hp)
        fed = federation(cell, tmp_path)
        alg = FedMN(fed, FedMN.parse_hyperparams(hp))
        alg.setup()
        seen = []
        original = FedMN._client_data

        def spy(self, fed, client, generator=None):
            seen.append(generator.get_state())
            return original(self, fed, client, generator)
        monkeypatch.setattr(FedMN, "_client_data", spy)
        alg._fixed_routing(fed, 0, alg.server_router)
        monkeypatch.undo()
        drawn[seed] = seen[0]
    assert not torch.equal(drawn[0], drawn[1])


def test_the_deprecated_salt_still_works_and_names_the_stream(tmp_path):
    fed = federation(small_cell(), tmp_path)
    clients = torch.arange(3)
    named, _ = step_ids(fed, 1, clients, stream="ditto.personal")
    with pytest.warns(DeprecationWarning, match="stream='ditto.personal'"):
        salted, _ = step_ids(fed, 1, clients, salt=0xD1770)
    assert torch.equal(named, salted)
    with pytest.warns(DeprecationWarning, match="batches.<purpose>"):
        own, _ = step_ids(fed, 1, clients, salt=0x1234)
    with pytest.warns(DeprecationWarning):
        generators = fed.batch_generators(1, clients, 0x1234)
    assert [g.initial_seed() for g in generators] == [_sha_seed(f"0/1/{int(fed.client_ids[c])}/{0x1234}")
                                                      for c in range(3)]
    assert not torch.equal(own, named)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step_ids(fed, 1, clients)  # the default stream warns nothing
