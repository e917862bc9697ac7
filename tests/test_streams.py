"""Named random streams (pflbench/streams.py): every generator of a cell comes from one function; the
names that existed before as hand-picked salts keep their draws (published cells re-run bit for bit),
declared by the engine (`streams.ENGINE`) or by the method that draws them (its module); nothing outside
the module seeds anything by hand; FedMN's router samples follow the cell's seed."""

import hashlib
import importlib
import io
import pkgutil
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch

from cells import federation, small_cell
import pflbench.algorithms
from pflbench import streams
from pflbench.algorithms import fedmn
from pflbench.algorithms.fedfomo import EXPLORE
from pflbench.algorithms.pfedla import HYPERNET_STREAM as PFEDLA_HYPERNET

ROOT = Path(__file__).resolve().parents[1]
SEEDING = re.compile(
    r"manual_seed\(|default_rng\(|Generator\(|SeedSequence\(|RandomState\(|np\.random\.seed\(|"
    r"random\.seed\(|random\.Random\("
)
# Seeding that is not a cell's randomness, each with why. A new entry needs a reason as good.
ALLOWED = {
    "pflbench/streams.py": "the one place cells' generators are made",
    "pflbench/data/synthetic.py": "the dataset's own `seed` option generates its samples (part of the dataset's checksum)",
    "pflbench/data/synthetic_images.py": "likewise",
    "pflbench/run/bench.py": "the speed benchmark's inputs, no cell",
    "pflbench/reports/figures.py": "a fixed jitter of points in a figure",
    "pflbench/studies/verify.py": "which published cells CI re-runs (--seed), no cell",
    "pflbench/run/testing.py": "the resume check's two runs start from set global states, as new processes do",
}


def _sources():
    yield from sorted((ROOT / "pflbench").rglob("*.py"))  # the built-in algorithms and partitions included


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
    assert not found, (
        "seeded outside pflbench/streams.py (use streams.generator / streams.torch_global with a "
        "stream name):\n" + "\n".join(found)
    )


# Every stream that existed before streams had names: its seed (torch) or its first two draws of
# integers(0, 2**63 - 1) (numpy) at each of WHERE's (seed, round, client), computed with the code before
# the methods' derivations moved into their modules (when pflbench/streams.py held them all).
WHERE = [(0, 1, 0), (3, 4, 7), (12345, 0, 2), (1, 7, -1)]
PINNED = {
    "schedule": [
        (5676103438238707049, 2166313427327287168),
        (7648537903723649043, 8305796982283728449),
        (2665534353231790035, 2930968080000017298),
        (5388461352086132529, 1543356562560756108),
    ],
    "newcomers": [
        (7925327915524361171, 1340006181491684546),
        (2266639680229044132, 742041168107939948),
        (4849908292035930216, 4168194555195832721),
        (7269589918574622441, 2855980624956017124),
    ],
    "system": [
        (8047650873520783921, 5862143577525305254),
        (1559016216670376432, 2411197254169869541),
        (546155054142382981, 4850637832012419192),
        (4243844075932090859, 5296350748463203587),
    ],
    "privacy.budgets": [
        (4823852803796152905, 843031856432573294),
        (7395179158227499501, 2898687489375808731),
        (4017607068433296360, 6820990195679713680),
        (3872567221161341310, 2411712602851969965),
    ],
    "shift.feature": [
        (4435509159930335566, 780362456360052848),
        (7247534502289721822, 4863790417558952139),
        (1024837821607073873, 2231276709895550149),
        (1198319583812653167, 2813243275215053371),
    ],
    "shift.concept": [
        (7744663660255256030, 3732853077853236327),
        (602287640721322627, 6140082691646922853),
        (2265776615866913125, 6189987365146089839),
        (3184942916105149066, 3767193924922809946),
    ],
    "partition.assign": [
        (8697063857760222070, 2917695245530671818),
        (4993253684617869378, 3492691328359077705),
        (8024323073597710421, 5173221881267657625),
        (6447455697624344478, 1607961372863110169),
    ],
    "partition.split": [
        (6246038554070098265, 2241157181836120543),
        (925436521046458565, 5833910894473321769),
        (3477906780984928437, 6359953358406655181),
        (4388153156890594172, 5539450290268699443),
    ],
    "l2gd.coins": [
        (3731551886338948846, 8784075577403467016),
        (2657049894787611961, 6880342394189213699),
        (4768478459086877601, 8474045780220691042),
        (7858937088971473576, 4000286455414554568),
    ],
    "fedfomo.explore": [
        (3741929371488621735, 6576014941877852210),
        (6944503177713006596, 693200134179779745),
        (6116536568326585742, 3098837962123321672),
        (6915606109714037937, 1578406383121963407),
    ],
    "mh-pfedhn.client-order": [
        (1912622417223472242, 4867007987605107231),
        (3283663596323433470, 7513439792410100903),
        (1238074417740146431, 8822808561662411263),
        (3428432885710001220, 1509347452573328196),
    ],
    "batches": [2362824113613698982, 16466325820184843520, 13943833552369782562, 16010401638917891510],
    "batches.newcomer-fit": [5171707912390337773, 14963117548339330120, 8221122537087641079, 4342244244458931354],
    "ditto.personal": [4908981495412287134, 2714890908181241180, 5260050124491281373, 4185659128898195115],
    "apfl.personal": [17341225043527396767, 12028678176513491144, 10141482067115133558, 5961970977323107552],
    "apfl.alpha": [2546694054302340302, 12402159446112749874, 5356309647154580612, 17265201841060208004],
    "perfedavg.d-prime": [11181062258241699454, 8258961429800440383, 7069254857639945629, 6239487150088459969],
    "perfedavg.d-second": [13443677054498166681, 8714230169922419985, 16371827776595517441, 16845674940053663184],
    "perfedavg.adapt": [7020197235766493949, 16273556017961210091, 12066298668442800684, 9357020625979165708],
    "fedbabu.finetune": [7337974976481141653, 14199971093476547208, 2800160204898843088, 11376272994752144143],
    "fedrep.head": [12122802245696491865, 5023906277875933430, 9630840365611655877, 9862534663766180170],
    "fedmn.noise": [11321107909530949402, 16370638136346827706, 4013266931513099555, 8384957387617729433],
    "mh-pfedhn.global": [3352856542167254534, 5914165444097314023, 11576686669511201629, 15538120264571167893],
    "mh-pfedhn.newcomers": [14175361080623769558, 17870162417406707252, 4787890477203798569, 7263190299462161923],
    "pfedhn.newcomers": [13832627391100564899, 394823007134437740, 4636089548601890718, 15814286683446444375],
    "privacy.noise": [5840139953927641126, 10222189875555411032, 17143910833218456772, 15892246138585092962],
    "global": [12607489481690436057, 7831740860131431757, 16828934183058422220, 6709079702499214639],
    "model.init": [0, 3, 12345, 1],
    "fedmn.init": [0, 3, 12345, 1],
    "mh-pfedhn.init": [0, 3, 12345, 1],
    "pfedla.hypernet": [17, 23774, 97760072, 7936],
    "pfedhn.hypernet": [29, 23786, 97760084, 7948],
    "fedmn.dropout": [2097735872676173594, 7147266099492051898, 4013266931513099555, 8384957387617729433],
    "fedmn.adapt-dropout": [1009, 3004052, 12345037037, 1007065],
    "fedmn.router-samples": [0, 7963307290, 32769009469547, 2654435760],
}
# New names (sha256 of seed, name, round, client), and a plugin's own salt (the deprecated salt=0x1234).
OTHER = {
    "myalgo.noise": [9385390770243765552, 123123238133324478, 7512644162121325221, 14731467363465350235],
    "batches.x": [5393536804780202344, 12481052742821396068, 15388241496582385395, 5782094566320126943],
}
SALT_1234 = [2667906815104999758, 16367909051455716300, 8398627720687162007, 15025323632072535649]


def _declared_streams() -> dict[str, streams.Stream]:
    """Every Stream the engine and the built-in algorithms' modules declare (module level or class level)."""
    found = dict(streams.ENGINE)
    for info in pkgutil.iter_modules(pflbench.algorithms.__path__):
        module = importlib.import_module(f"pflbench.algorithms.{info.name}")
        owners = [
            module,
            *(v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__),
        ]
        for owner in owners:
            for value in vars(owner).values():
                for item in value if isinstance(value, tuple) else (value,):
                    if isinstance(item, streams.Stream) and item.entropy is not None:
                        assert found.setdefault(item.name, item) is item or found[item.name] == item, item.name
    return found


def _draws(stream, kind):
    if kind == "numpy":
        return [
            tuple(int(x) for x in streams.generator(s, stream, r, c, kind="numpy").integers(0, 2**63 - 1, 2))
            for s, r, c in WHERE
        ]
    return [streams.seed(s, stream, r, c) for s, r, c in WHERE]


def test_every_legacy_stream_draws_what_it_drew_before_it_moved():
    declared = _declared_streams()
    assert sorted(declared) == sorted(PINNED), "a legacy stream is missing or new: pin it here"
    for name, stream in declared.items():
        assert _draws(stream, stream.kind) == PINNED[name], name
    for name, seeds in OTHER.items():
        assert _draws(name, "torch") == seeds == _draws(streams.Stream(name), "torch"), name
    assert _draws(streams.salted_batches("batches.salt-0x1234", 0x1234), "torch") == SALT_1234


def test_the_engine_names_no_method_and_a_method_names_its_streams():
    """streams.py declares only the engine's streams; a method's are in its module, which draws them
    through the declared value (a string of a legacy stream's name would draw a new stream's numbers)."""
    declared = _declared_streams()
    methods = {name for name in declared if name not in streams.ENGINE}
    assert len(methods) == 22
    source = (ROOT / "pflbench/streams.py").read_text()
    assert not [m for m in methods if m.split(".")[0] in source], "pflbench/streams.py names a method"
    declaring = {"Stream", "salted_batches", "salted_round", "salted_cell"}
    for path in _sources():
        tokens = [
            t
            for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT)
        ]
        for k, token in enumerate(tokens):
            if token.type == tokenize.STRING and token.string.strip("'\"") in methods:
                declared_here = k >= 2 and tokens[k - 1].string == "(" and tokens[k - 2].string in declaring
                assert declared_here, (
                    f"{path.relative_to(ROOT)}:{token.start[0]}: the stream {token.string} "
                    f"as a string, not its Stream (it would draw a new stream's numbers)"
                )


def test_no_hand_picked_salts_outside_the_streams_module():
    salt = re.compile(r"\b[A-Z_]*SALTS?\b\s*=|salt=0x|\bseed\s*\*\s*\d")
    found = [
        f"{p.relative_to(ROOT).as_posix()}:{n}"
        for p in _sources()
        if p.name != "streams.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if salt.search(line.split("#", 1)[0])
    ]
    assert not found, found


def _sha_seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


@pytest.mark.parametrize("seed", [0, 3])
def test_the_legacy_names_draw_what_the_hand_seeded_code_drew(seed):
    """A few of the derivations published cells depend on, written out as the code had them."""

    def same_numpy(name, entropy, **where):
        assert np.array_equal(
            streams.generator(seed, name, kind="numpy", **where).random(5), np.random.default_rng(entropy).random(5)
        ), name

    def same_torch(name, value, **where):
        assert torch.equal(
            torch.randperm(50, generator=streams.generator(seed, name, **where)),
            torch.randperm(50, generator=torch.Generator().manual_seed(value)),
        ), name

    same_numpy("schedule", [seed, 0x5A3])
    same_numpy("newcomers", [seed, 0x0E3C])
    same_numpy("system", [seed, 0x5E7])
    same_numpy(EXPLORE, [seed, 4, 0xF0F0], round=4)
    same_numpy("partition.split", np.random.SeedSequence(seed).spawn(2)[1])
    same_torch("batches", _sha_seed(f"{seed}/4/7/0"), round=4, client=7)
    same_torch("batches.newcomer-fit", _sha_seed(f"{seed}/4/7/{0x0E3D}"), round=4, client=7)
    same_torch("privacy.noise", _sha_seed(f"{seed}/2/1/{0xD1F}"), round=2, client=1)
    same_torch(PFEDLA_HYPERNET, seed * 7919 + 17)
    assert streams.seed(seed, "global") == _sha_seed(f"{seed}/global-rng")
    assert streams.seed(seed, fedmn.ADAPT_DROPOUT_STREAM, 5, 2) == seed * 1_000_003 + 5 * 1009 + 2


def test_new_names_are_their_own_streams():
    draw = lambda *a, **k: torch.rand(4, generator=streams.generator(*a, **k))  # noqa: E731
    assert torch.equal(draw(0, "myalgo.noise", 1, 2), draw(0, "myalgo.noise", 1, 2))
    others = [
        draw(1, "myalgo.noise", 1, 2),
        draw(0, "myalgo.other", 1, 2),
        draw(0, "myalgo.noise", 2, 2),
        draw(0, "myalgo.noise", 1, 3),
        draw(0, "myalgo.noise"),
    ]
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
        return torch.randperm(100, generator=streams.generator(seed, fedmn.ROUTER_SAMPLES_STREAM, client=client))

    assert torch.equal(sample(0, 3), torch.randperm(100, generator=torch.Generator().manual_seed(3)))
    assert not torch.equal(sample(0, 3), sample(1, 3))
    assert not torch.equal(sample(1, 3), sample(1, 4))


def test_fedmn_routing_draws_its_samples_from_the_cell_seed(tmp_path, monkeypatch):
    from pflbench.algorithms.fedmn import FedMN

    hp = {"dims": [16, 8], "encoder_hidden": 16, "router_x_dim": 8, "router_y_dim": 4, "router_samples": 8}
    drawn = {}
    for seed in (0, 1):
        cell = small_cell(
            algorithm="fedmn",
            dataset="synthetic-images",
            dataset_options={"num_samples": 240},
            clients=3,
            seed=seed,
            hp=hp,
        )
        fed = federation(cell, tmp_path)
        alg = FedMN(fed, FedMN.parse_hyperparams(hp))
        alg.setup()
        seen = []
        original = FedMN._client_data

        def spy(self, fed, client, generator=None, seen=seen, original=original):
            seen.append(generator.get_state())
            return original(self, fed, client, generator)

        monkeypatch.setattr(FedMN, "_client_data", spy)
        alg._fixed_routing(fed, 0, alg.server_router)
        monkeypatch.undo()
        drawn[seed] = seen[0]
    assert not torch.equal(drawn[0], drawn[1])
