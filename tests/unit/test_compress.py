"""Compressed updates (`core.compress`) and public states advanced by them (`sim.public`)."""

from __future__ import annotations

import pytest
import torch

from p2p_diloco.core import codecs, compress
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.sim.public import MESSAGE_OVERHEAD, PublicStates


def _x(n: int = 10_000, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) ** 3  # heavy tails, like updates


def test_topk_keeps_the_largest_values_of_each_block_in_4_bits():
    x = _x(2 * compress.TOPK_BLOCK + 100)
    u = compress.encode(x, "topk", k=16)
    d = compress.decoded(u)
    assert int((d != 0).sum()) <= 16 * 3  # 3 blocks, the last one padded
    block = x[: compress.TOPK_BLOCK]
    kept = d[: compress.TOPK_BLOCK].nonzero().flatten()
    assert set(kept.tolist()) == set(block.abs().topk(16).indices.tolist())
    assert (d[kept] - block[kept]).abs().max() <= block.abs().max() / compress.LEVELS / 2 * 1.01  # half a step
    assert u.nbytes == 3 * 16 // 2 + (3 * 16 * 12 + 7) // 8 + 2 * 3


def test_decoding_is_the_same_bits_on_every_side():
    x = _x()
    a, b = compress.decoded(compress.encode(x, "topk")), compress.decoded(compress.encode(x.clone(), "topk"))
    assert torch.equal(a, b)


def test_error_feedback_loses_nothing_over_time():
    anchor = _x(20_000)
    pub = PublicStates([torch.zeros(20_000)], kind="topk", k=64)
    gaps = []
    for _ in range(40):  # the anchor stays put: the public state must close in on it
        pub.publish(0, anchor)
        gaps.append(float((anchor - pub.senders[0].public).norm() / anchor.norm()))
    assert gaps[-1] < 0.05 * gaps[0] and gaps[-1] < 0.05


def test_low_rank_updates_carry_a_matrix_in_factors_and_lose_nothing_over_time():
    shapes = [torch.Size((96, 64)), torch.Size((64,))]
    g = torch.Generator().manual_seed(0)
    matrix = torch.randn(96, 3, generator=g) @ torch.randn(3, 64, generator=g) + 0.01 * torch.randn(96, 64, generator=g)
    anchor = torch.cat([matrix.reshape(-1), torch.randn(64, generator=g)])
    pub = PublicStates([torch.zeros(anchor.numel())], kind="lowrank", k=4, shapes=shapes)
    sizes, gaps = [], []
    for _ in range(20):  # the anchor stays put: the public state must close in on it
        sizes.append(pub.publish(0, anchor))
        gaps.append(float((anchor - pub.senders[0].public).norm() / anchor.norm()))
    assert gaps[0] < 0.2 and gaps[-1] < 0.02
    factors = 2 * 4 * (96 + 64)  # rank 4, fp16 factors
    assert sizes[0] == factors + codecs.encoded_nbytes(64, "int4") + MESSAGE_OVERHEAD  # the vector in int4
    assert factors < codecs.encoded_nbytes(96 * 64, "int4")


def test_a_fetch_costs_the_updates_the_receiver_lacks_or_the_whole_state():
    n = 5000
    pub = PublicStates([torch.zeros(n)] * 3, kind="topk", k=8, keep=2)
    sizes = [pub.publish(0, _x(n, seed)) for seed in range(3)]
    assert all(s > MESSAGE_OVERHEAD for s in sizes)
    assert pub.fetch(1, 0)[0] == 4 * n + MESSAGE_OVERHEAD  # 3 updates behind, only 2 kept: the whole state
    pub.publish(0, _x(n, 9))
    nbytes, theirs = pub.fetch(1, 0)
    assert nbytes == pub.senders[0].sizes[-1] and torch.equal(theirs, pub.senders[0].public)
    assert pub.fetch(2, 1)[0] == 0  # nothing published: the initial weights, held by everyone


@pytest.mark.parametrize("mixing", ["pub", "choco"])
def test_what_a_receiver_mixes(mixing):
    pub = PublicStates([torch.zeros(4), torch.zeros(4)], mixing=mixing, kind="int4")
    pub.senders[0].public, pub.senders[1].public = torch.ones(4), torch.full((4,), 3.0)
    anchor = torch.full((4,), 1.5)
    view = pub.view(0, pub.senders[1].public, anchor, PartnerState(phi=None, m=None, delta=None, version=2, tokens=5))
    assert torch.equal(view.phi, torch.full((4,), 3.0 if mixing == "pub" else 3.5)) and view.version == 2


def test_the_simulator_counts_the_updates_a_receiver_lacks():
    from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.sim.config import SimConfig
    from p2p_diloco.sim.simulator import Simulation

    corpus = load_corpus(max_bytes=1_000_000)

    def gossip(exchange="state", codec="topk", **sim):
        cfg = SimConfig(**{"tokens": 4 * 4 * 32 * 40, "eval_batches": 2, "methods": ("gossip",), **sim})
        return Simulation(cfg, ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                          TrainConfig(batch_size=4, warmup_steps=2),
                          DiLoCoConfig(local_steps=5, exchange=exchange, update_codec=codec, final_mix=False),
                          corpus).run("gossip")

    state = gossip()
    updates = gossip(exchange="updates", update_k=64)
    assert updates.bytes_sent_per_island < state.bytes_sent_per_island / 8
    assert updates.eval_loss < 5.0 and updates.as_dict() == gossip(exchange="updates", update_k=64).as_dict()
    signs = gossip(exchange="updates", codec="sign")  # the wire's own codec
    assert signs.bytes_sent_per_island < state.bytes_sent_per_island / 4 and signs.eval_loss < 5.0
    with pytest.raises(Exception, match="mix_delay 1"):
        gossip(exchange="updates", mix_delay=0)
