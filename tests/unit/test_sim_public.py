"""The simulator's public states advanced by updates in the wire's codecs (`sim.public`)."""

from __future__ import annotations

import pytest
import torch

from p2p_diloco.core.outer import PartnerState
from p2p_diloco.core.public import PublicCopy, worth_keeping
from p2p_diloco.exchange.cost import public_fetch_wire_bytes
from p2p_diloco.sim.public import PublicStates


def _x(n: int = 10_000, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) ** 3  # heavy tails, like updates


@pytest.mark.parametrize("codec", ["sign", "int4"])
def test_error_feedback_loses_nothing_over_time(codec):
    anchor = torch.randn(20_000, generator=torch.Generator().manual_seed(0))
    pub = PublicStates([torch.zeros(20_000)], codec)
    gaps = []
    for _ in range(100):  # the anchor stays put: the public state must close in on it (sign: slowly)
        pub.publish(0, anchor)
        gaps.append(float((anchor - pub.senders[0].state.pub).norm() / anchor.norm()))
    assert gaps[-1] < 0.05 * gaps[0] and gaps[-1] < 0.03


def test_a_fetch_costs_the_updates_the_receiver_lacks_or_the_whole_state():
    n = 5000
    pub = PublicStates([torch.zeros(n)] * 3, "sign", keep=2)
    for seed in range(3):
        pub.publish(0, _x(n, seed))
    whole, _ = pub.fetch(1, 0)  # 3 updates behind, only 2 kept: the whole state, in fp32
    assert whole == public_fetch_wire_bytes(n, "sign", None, 3, ("init", 0)) and whole > 4 * n
    pub.publish(0, _x(n, 9))
    one, theirs = pub.fetch(1, 0)  # one update behind
    assert one < whole / 10 and torch.equal(theirs.pub, pub.senders[0].state.pub)
    nothing, _ = pub.fetch(2, 1)  # nothing published: the initial weights, held by everyone
    assert nothing < one
    lone = PublicStates([torch.zeros(n)], "int4")  # an island's own bound: the fp32 public state's bytes
    for seed in range(worth_keeping(n, "int4") + 1):
        lone.publish(0, _x(n, seed))
    assert len(lone.senders[0].state.updates) == worth_keeping(n, "int4")


def test_a_receiver_moves_by_the_difference_of_the_public_states():
    pub = PublicStates([torch.zeros(4), torch.zeros(4)], "int4")
    pub.senders[0].state.pub[:] = 1.0
    theirs = PublicCopy("c", 1, torch.full((4,), 3.0))
    anchor = torch.full((4,), 1.5)
    view = pub.view(0, theirs, anchor, PartnerState(phi=None, m=None, version=2, tokens=5))
    assert torch.equal(view.phi, torch.full((4,), 3.5)) and view.version == 2 and view.m is None
    theirs.parts = 4  # updates in 4 fragments: each span refreshed every 4 rounds, a quarter mixed per round
    view = pub.view(0, theirs, anchor, PartnerState(phi=None, m=None, version=2, tokens=5))
    assert torch.equal(view.phi, torch.full((4,), 2.0))


def test_fragments_take_turns_and_cost_a_share_of_a_whole_update():
    n = 8000
    pub = PublicStates([torch.zeros(n)] * 2, "sign")
    anchor = _x(n)
    for _ in range(4):
        pub.publish(0, anchor, parts=4)
    state = pub.senders[0].state
    assert [u.at for u in state.updates] == [0, 2000, 4000, 6000]  # island 0 starts at fragment 0
    assert all(u.values.numel() == 2000 for u in state.updates)
    assert (state.pub != 0).all()  # every span moved once
    four, theirs = pub.fetch(1, 0)
    assert torch.equal(theirs.pub, state.pub) and theirs.parts == 4
    whole = PublicStates([torch.zeros(n)] * 2, "sign")
    whole.publish(0, anchor)
    one, _ = whole.fetch(1, 0)
    assert one < four < 1.5 * one  # four fragments cost about one whole update (their headers more)
    pub.publish(1, anchor, parts=4)
    assert pub.senders[1].state.updates[0].at == 2000  # island 1's turns start one fragment further


def test_the_simulator_counts_the_updates_a_receiver_lacks():
    from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.sim.config import SimConfig
    from p2p_diloco.sim.simulator import Simulation

    corpus = load_corpus(max_bytes=1_000_000)

    def gossip(exchange="state", codec="sign", **sim):
        cfg = SimConfig(**{"tokens": 4 * 4 * 32 * 40, "eval_batches": 2, "methods": ("gossip",), **sim})
        return Simulation(cfg, ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                          TrainConfig(batch_size=4, warmup_steps=2),
                          DiLoCoConfig(local_steps=5, exchange=exchange, update_codec=codec, final_mix=False),
                          corpus).run("gossip")

    state = gossip()
    signs = gossip(exchange="updates")
    assert signs.bytes_sent_per_island < state.bytes_sent_per_island / 4 and signs.eval_loss < 5.0
    assert signs.as_dict() == gossip(exchange="updates").as_dict()
    int4 = gossip(exchange="updates", codec="int4")
    assert signs.bytes_sent_per_island < int4.bytes_sent_per_island < state.bytes_sent_per_island
    with pytest.raises(Exception, match="mix_delay 1"):
        gossip(exchange="updates", mix_delay=0)
