"""`peers.admission`: one protocol for every check, verdicts folded in the configured order, one outcome.

The fold is checked with small checks of the protocol that return fixed verdicts on a small island
(`core.island.Island`); the real checks' own bounds are checked in test_influence, test_probe,
test_quiet_members and test_trust.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from p2p_diloco.admission import CHECKS, AdmissionConfig
from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler
from p2p_diloco.core.island import Island as SimIsland
from p2p_diloco.core.model import build_model
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.errors import ConfigError
from p2p_diloco.peers.admission.admission import Admission
from p2p_diloco.peers.admission.bounds import IdentityCheck
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Check, Island, Remembers, Verdict
from p2p_diloco.peers.admission.registry import REGISTRY, build_checks
from p2p_diloco.peers.identity import Identity

ROOT = Path(__file__).resolve().parents[2]


class Fixed:
    """A check that says the same of every state, and counts the states it saw."""

    def __init__(self, name: str, verdict: Verdict) -> None:
        self.name, self.verdict, self.seen = name, verdict, 0

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        self.seen += 1
        return self.verdict


class Chooser:
    """What the admission tells partner choice, recorded."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def __getattr__(self, what: str):
        return lambda peer, *rest: self.told.append((what, peer))


@pytest.fixture(scope="module")
def island() -> SimIsland:
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8))
    data = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    isl = SimIsland("a", model, TrainConfig(batch_size=2, warmup_steps=0), DiLoCoConfig(local_steps=2),
                    BatchSampler(data, 8, 2, seed=0))
    isl.state.tokens = 1000
    return isl


def _candidate(island: SimIsland, meta: dict | None = None) -> Candidate:
    s = island.state
    return Candidate("b", SimpleNamespace(meta=meta or {}, endpoint="tcp://b"),
                     PartnerState(s.phi.clone(), s.m.clone(), s.version, s.tokens))


def _admission(island: SimIsland, *checks: Check, chooser=None) -> Admission:
    return Admission([IdentityCheck(), *checks], Identity("a", "a", "model-a", "run-a"), island,
                     chooser or Chooser(), None, dict)


def test_every_registered_check_implements_the_one_protocol(island):
    assert tuple(REGISTRY) == CHECKS
    built = build_checks(AdmissionConfig(), island, probe_fn=lambda: 1.0)
    assert [c.name for c in built] == list(CHECKS)
    for check in built:
        assert isinstance(check, Check), check.name
    assert {c.name for c in built if isinstance(c, Remembers)} == {"claims", "drift"}
    # an island without a probe batch runs every check but the probe
    assert [c.name for c in build_checks(AdmissionConfig(), island)] == [c for c in CHECKS if c != "probe"]


def test_the_first_refusal_wins_and_the_checks_after_it_do_not_run(island):
    first, second = Fixed("a", Verdict(refused="first")), Fixed("b", Verdict(refused="second"))
    folded = _admission(island, Fixed("c", ADMIT), first, second).fold(_candidate(island))
    assert folded.refusal.refused == "first" and (first.seen, second.seen) == (1, 0)


def test_caps_take_the_smallest_factors_multiply_and_the_momentum_the_smallest_scale(island):
    checks = [Fixed("cap", Verdict(cap=0.3, momentum_scale=0.8)), Fixed("cap2", Verdict(cap=0.4, momentum_scale=0.5)),
              Fixed("probe", Verdict(factor=0.5, figures={"probe": 0.02}))]
    admission = _admission(island, *checks)
    folded = admission.fold(_candidate(island))
    assert folded.refusal is None and folded.base == pytest.approx(0.5)  # equal tokens, no lag
    assert folded.weight == pytest.approx(0.3 * 0.5) and folded.momentum_scale == 0.5
    assert folded.figures == {"probe": 0.02, "bounded": True} and admission.counts["bounded"] == 1


def test_claims_counted_by_a_check_set_the_base_weight_of_the_checks_after_it(island):
    v = island.state.version
    seen = []

    class Reads:
        name = "reads"

        def judge(self, candidate: Candidate, island: Island) -> Verdict:
            seen.append((candidate.state.version, candidate.state.tokens, candidate.weight))
            return ADMIT

    admission = _admission(island, Fixed("claims", Verdict(counted=(v, 3000))), Reads())
    folded = admission.fold(_candidate(island))
    assert seen == [(v, 3000, pytest.approx(0.75))]  # three times the island's tokens: the most a claim gets
    assert folded.weight == pytest.approx(0.75)


def test_a_state_of_another_run_is_refused_by_identity_first_and_its_sender_never_chosen_again(island):
    chooser = Chooser()
    later = Fixed("later", ADMIT)
    admission = _admission(island, later, chooser=chooser)
    result = SimpleNamespace(peer_id="b", seconds=0.1, waited_s=0.0, nbytes=10, cancelled=False, error=None,
                             bad_state=False, pushed=False, measured=None, public=None,
                             snapshot=SimpleNamespace(meta={"model": "model-a", "run": "run-b"}, endpoint="tcp://b"))
    outcome = admission.admit(result)
    assert outcome.reason.startswith("snapshot from tcp://b is for another run") and outcome.foreign == "run"
    assert outcome.figures["foreign"] == "run" and outcome.figures["refused"] == outcome.reason
    assert later.seen == 0 and ("exclude", "b") in chooser.told and ("refused", "b") in chooser.told
    assert admission.refused == 1 and admission.ledger["b"].refused == 1


def test_the_admission_config_names_known_checks_once_identity_first():
    assert AdmissionConfig().checks == CHECKS
    assert AdmissionConfig(checks=["identity", "gate"]).checks == ("identity", "gate")
    for checks, said in ((("identity", "gat"),  "unknown check 'gat'"), (("gate", "identity"), "must start with 'identity'"),
                         (("identity", "gate", "gate"), "names a check twice")):
        with pytest.raises(ConfigError, match=said):
            AdmissionConfig(checks=checks)


def test_no_round_decides_by_looking_for_a_key_in_the_exchange_s_figures():
    """The round mixes or reports the admission's typed outcome; it never asks its figures what happened."""
    for path in (ROOT / "peers").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r'"(refused|cancelled|fetch_error|foreign)" (not )?in info', text), path
        assert not re.search(r'info\.get\("(refused|cancelled)"\)', text), path


def test_the_config_file_s_admission_table_sets_the_order_and_each_check_s_settings():
    config = AdmissionConfig.from_table({"checks": ["identity", "gate", "clip"], "trust": {"slack": 0.4},
                                         "drift": {"rounds": 3.0, "decay": 0.8}})
    assert config.checks == ("identity", "gate", "clip") and config.trust.slack == 0.4
    assert (config.drift.rounds, config.drift.decay) == (3.0, 0.8) and config.gate == AdmissionConfig().gate
    for table, said in (({"trust": {"slak": 1}}, r"\[admission.trust\] takes behind, slack"), ({"trst": {}}, "has no 'trst'"),
                        ({"drift": {"decay": 1.5}}, r"admission.drift.decay must be in \[0, 1\)"),
                        ({"checks": "identity"}, "must be a list of check names")):
        with pytest.raises(ConfigError, match=said):
            AdmissionConfig.from_table(table)


def test_a_misspelt_admission_setting_in_a_config_file_is_one_clear_error(tmp_path):
    from click.testing import CliRunner

    from p2p_diloco.cli import main

    path = tmp_path / "swarm.toml"
    path.write_text('[admission]\nchecks = ["identity", "clip"]\n\n[admission.clip]\nradius = 1\n')
    out = CliRunner().invoke(main, ["--config", str(path), "join", "--help"])
    assert out.exit_code == 2 and "[admission] has no 'clip'" in out.output
