"""The public API around a user's own model, optimizer and loop (`p2p_diloco.join`), in one process.

A lone island (ZeroMQ discovery, no bootstrap) is enough for what does not need a partner: the
round schedule, checkpoint and resume of the whole island, refusals of models that cannot take
part. Partners, mixing and fingerprints across processes are in tests/integration.
"""

import dataclasses
import time

import pytest
import torch

import p2p_diloco
from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig, NetworkConfig
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core import codecs
from p2p_diloco.core.codecs import EncodedVector
from p2p_diloco.core.outer import OuterState, PartnerState, mix
from p2p_diloco.core.params import ParamSlices, fingerprint
from p2p_diloco.errors import CheckpointError, ModelError, TransportError
from p2p_diloco.exchange.client import fetch
from p2p_diloco.peers.gossip.worker import partner_state

pytestmark = pytest.mark.timeout(60)


class Tiny(torch.nn.Module):
    """A user's model: a frozen embedding, a trainable head, an integer buffer and a float buffer."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, width)
        self.embed.weight.requires_grad_(False)
        self.head = torch.nn.Linear(width, 16)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.numel()
        return self.head(self.embed(x)) * self.scale


def loss_of(model: Tiny, gen: torch.Generator) -> torch.Tensor:
    x = torch.randint(0, 16, (4, 3), generator=gen)
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())


def lone_island(tmp_path, model, optimizer, scheduler=None, **island):
    cfg = IslandConfig(run_dir=tmp_path, quiet=True, join_timeout_s=0.2, **island)
    return p2p_diloco.join(model, optimizer, scheduler, discovery=DiscoveryConfig(discovery="zmq"), island=cfg,
                           diloco=DiLoCoConfig(local_steps=3), tokens_per_step=12)


def train(island, model, optimizer, scheduler, gen) -> int:
    steps = 0
    while not island.done:
        loss = loss_of(model, gen)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        island.step(loss=loss)
        steps += 1
    return steps


def test_a_users_loop_runs_rounds_and_resumes_the_whole_island(tmp_path):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    with lone_island(tmp_path, model, opt, sched, max_rounds=2, max_stretch=0.0) as island:
        steps = train(island, model, opt, sched, torch.Generator().manual_seed(1))
        figures = island.figures()
    assert steps == 6 and figures["round"] == 2 and figures["version"] == 2 and figures["tokens"] == 72
    assert island.close()["rounds"] == 2  # closing twice is harmless
    anchor, seen = island.outer.state.phi.clone(), int(model.seen)

    torch.manual_seed(1)  # other initial weights: everything must come from the checkpoint
    model2 = Tiny()
    opt2 = torch.optim.SGD([p for p in model2.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    with lone_island(tmp_path, model2, opt2, sched2, max_rounds=3, resume=True) as resumed:
        assert (resumed.round, resumed.version, resumed.own_tokens) == (2, 2, 72)
        assert torch.equal(resumed.outer.state.phi, anchor) and int(model2.seen) == seen
        assert sched2.state_dict() == sched.state_dict()
        buf = next(iter(opt2.state.values()))["momentum_buffer"]
        assert torch.equal(buf, next(iter(opt.state.values()))["momentum_buffer"])
        assert torch.equal(model2.embed.weight, model.embed.weight)  # frozen weights are checkpointed too


@dataclasses.dataclass
class Output:
    """What a Hugging Face model returns, as far as `step()` reads it: an object with a `.loss`."""

    loss: torch.Tensor | None
    logits: torch.Tensor


def test_step_reads_a_loss_from_a_float_a_tensor_or_a_models_output_and_names_anything_else(tmp_path):
    model = Tiny()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    with lone_island(tmp_path, model, opt) as island:
        for given, read in ((2.5, 2.5), (torch.tensor(1.25), 1.25), (torch.tensor([0.5]), 0.5),
                            (Output(loss=torch.tensor(0.75, requires_grad=True), logits=torch.zeros(2, 3)), 0.75)):
            island.step(loss=given)
            assert island.figures()["loss"] == read
        for given, named in ((torch.ones(3), r"got a tensor of shape \(3,\)"), ("0.5", "got str"),
                             (Output(loss=None, logits=torch.zeros(2)), r"got a Output whose \.loss is None")):
            with pytest.raises(TypeError, match=r"step\(loss=...\) .*" + named):
                island.step(loss=given)
        assert island.figures()["loss"] == 0.75  # a refused loss changes nothing


def test_a_time_budget_ends_the_round_at_the_first_step_past_it(tmp_path):
    """`max_seconds` stops the island within about one inner step, in the middle of a long round."""
    model = Tiny()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    step_s, budget = 0.05, 0.6
    cfg = IslandConfig(run_dir=tmp_path, quiet=True, join_timeout_s=0.2, max_seconds=budget)
    with p2p_diloco.join(model, opt, discovery=DiscoveryConfig(discovery="zmq"), island=cfg,
                         diloco=DiLoCoConfig(local_steps=1000, final_mix=False)) as island:
        t0, steps = time.monotonic(), 0
        while not island.done:
            time.sleep(step_s)  # an inner step
            island.step(loss=1.0)
            steps += 1
        elapsed = time.monotonic() - t0
    assert island.round == 1 and steps <= budget / step_s + 1  # the step that passed the budget is the last
    assert budget <= elapsed <= budget + 0.5, elapsed  # (the round's end: publish, announce, metrics)


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    model = Tiny()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    with lone_island(tmp_path, model, opt, max_rounds=1) as island:
        while not island.done:
            island.step()
    other = Tiny(width=4)
    with pytest.raises(CheckpointError, match="another model"):
        lone_island(tmp_path, other, torch.optim.SGD(other.head.parameters(), lr=0.1), resume=True).start()


def test_models_that_cannot_take_part_are_clear_errors(tmp_path):
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ModelError, match="no trainable parameters"):
        p2p_diloco.join(frozen, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
                        discovery=DiscoveryConfig(discovery="zmq"), island=IslandConfig(run_dir=tmp_path))


def test_only_trainable_float_parameters_travel_and_tied_weights_once():
    model = Tiny()
    slices = ParamSlices(model)
    assert slices.numel == sum(p.numel() for p in model.head.parameters())  # no frozen weight, no buffer
    tied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    assert ParamSlices(tied).numel == 40
    outer = OuterLoop("a", model, DiLoCoConfig(token_weighting=False))
    partner = PartnerState(phi=outer.state.phi + 1, m=None, version=0, tokens=0)
    seen, scale = model.seen.clone(), model.scale.clone()
    outer.mix_arrived(partner)
    outer.end_round([partner])
    assert torch.equal(model.seen, seen) and torch.equal(model.scale, scale)  # buffers are never averaged


def test_fingerprints_tell_models_apart_but_not_their_wrappers():
    a, b = Tiny(), Tiny(width=4)
    assert fingerprint(a) != fingerprint(b) and len(fingerprint(a)) == 16
    wrapped = torch.nn.Module()
    wrapped.module = Tiny()
    assert fingerprint(wrapped) == fingerprint(a)  # DDP's `module.` prefix


class Snap:
    def __init__(self, tensors, model):
        self.tensors, self.meta, self.endpoint = tensors, {"peer_id": "p", "model": model}, "tcp://x:1"
        self.version, self.tokens = 1, 10


def test_a_partner_state_for_another_model_is_refused_before_mixing():
    n = 10
    assert partner_state(Snap({"phi": torch.zeros(n)}, "a" * 16), n, "a" * 16).phi.numel() == n
    with pytest.raises(TransportError, match="another model"):
        partner_state(Snap({"phi": torch.zeros(n)}, "b" * 16), n, "a" * 16)
    with pytest.raises(TransportError, match="'m' holds 9 values"):
        partner_state(Snap({"phi": torch.zeros(n), "m": torch.zeros(9)}, "a" * 16), n, "a" * 16)


def test_a_joiner_adopts_an_encoded_state_into_its_anchor_and_weights():
    from p2p_diloco.core import codecs

    model = Tiny()
    outer = OuterLoop("joiner", model, DiLoCoConfig())
    theirs = torch.randn(outer.state.phi.numel())
    m = torch.randn_like(theirs)
    enc = {k: codecs.EncodedVector(codecs.encode(v, "int8"), "int8", v.numel()) for k, v in (("phi", theirs), ("m", m))}
    outer.adopt(PartnerState(phi=enc["phi"], m=enc["m"], version=7, tokens=99))
    assert torch.equal(outer.state.phi, codecs.roundtrip(theirs, "int8"))
    assert torch.equal(outer.state.m, codecs.roundtrip(m, "int8"))
    assert torch.equal(outer.params_vector(), outer.state.phi) and (outer.state.version, outer.state.tokens) == (7, 99)


def test_an_island_publishes_its_momentum_in_four_bits_and_a_partner_mixes_it_rescaled(tmp_path):
    """`momentum="rescaled-int4"` (the default): the anchor travels in int8, the momentum in int4
    with its own scales; a fetcher keeps both encoded, and mixing keeps the interpolated norm."""
    torch.manual_seed(0)
    model = Tiny(width=300)
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    with lone_island(tmp_path, model, opt, max_rounds=2, max_stretch=0.0) as island:
        gen = torch.Generator().manual_seed(1)
        while not island.done:
            loss_of(model, gen).backward()
            opt.step()
            opt.zero_grad()
            island.step()
        snap = fetch(island.server.endpoint, decode=False)
        m = island.outer.state.m.clone()
    assert island.diloco.momentum == "rescaled-int4" and m.norm() > 0
    assert {t.name: t.codec for t in snap.manifest.tensors} == {"phi": "int8", "m": "int4"}
    theirs = partner_state(snap, m.numel(), island.identity.model, island.identity.run)
    assert isinstance(theirs.m, EncodedVector) and torch.equal(theirs.m.float(), codecs.roundtrip(m, "int4"))
    ours = OuterState(phi=theirs.phi.float(), m=-m.clone())  # the opposite direction
    mix(ours, theirs, 0.5, island.diloco, island.outer.momentum)
    assert ours.m.norm() == pytest.approx(0.5 * m.norm() + 0.5 * theirs.m.float().norm(), rel=1e-5)


def test_an_island_catching_up_trains_on_while_it_downloads_and_then_adopts(tmp_path, monkeypatch):
    """A catch-up (an island found far behind the swarm) downloads on a thread: a slow member's state
    never stalls the inner steps; the state is adopted between two of them once it is all there."""
    torch.manual_seed(0)
    ahead_model = Tiny(width=4096)  # 65,552 trainable values: about 0.6 s at 1 Mbit/s in int8
    opt = torch.optim.SGD(ahead_model.head.parameters(), lr=0.1)
    ahead = p2p_diloco.join(ahead_model, opt, discovery=DiscoveryConfig(discovery="zmq"),
                            network=NetworkConfig(max_upload_mbps=1.0),
                            island=IslandConfig(run_dir=tmp_path / "ahead", quiet=True, join_timeout_s=0.2,
                                                max_rounds=4, max_stretch=0.0),
                            diloco=DiLoCoConfig(local_steps=2))
    torch.manual_seed(0)
    model = Tiny(width=4096)
    behind = lone_island(tmp_path / "behind", model, torch.optim.SGD(model.head.parameters(), lr=0.1))
    with ahead, behind:
        while not ahead.done:
            loss_of(ahead_model, torch.Generator().manual_seed(2)).backward()
            opt.step()
            opt.zero_grad()
            ahead.step()
        record = ahead.record()
        monkeypatch.setattr(behind.membership, "members", lambda: {record.peer_id: record})
        behind.catching_up.start(record.peer_id, record.version)
        steps, t0 = 0, time.monotonic()
        while behind.catching_up.running is not None:
            behind.step()
            steps += 1
            assert time.monotonic() - t0 < 30
        assert steps > 10  # it trained on while the state arrived (a step here is far under 0.1 s)
        assert behind.version == record.version
        assert torch.allclose(behind.outer.state.phi, ahead.outer.state.phi, atol=0.05)


def DummyLR(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def test_a_resumed_island_the_swarm_left_behind_adopts_its_state_before_its_first_round(tmp_path, monkeypatch):
    """A checkpoint 3 or more versions behind the freshest member: the resumed island joins from the
    swarm's state as a newcomer does (training on from its checkpoint, every partner's state would
    be refused as too far), and keeps its own inner optimizer and round count."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
    with lone_island(tmp_path / "behind", model, opt, max_rounds=1, max_stretch=0.0) as island:
        train(island, model, opt, DummyLR(opt), torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    ahead_model = Tiny()
    ahead_opt = torch.optim.SGD(ahead_model.head.parameters(), lr=0.1)
    with lone_island(tmp_path / "ahead", ahead_model, ahead_opt, max_rounds=5, max_stretch=0.0) as ahead:
        train(ahead, ahead_model, ahead_opt, DummyLR(ahead_opt), torch.Generator().manual_seed(2))
        record = ahead.record()
        resumed = lone_island(tmp_path / "behind", model, opt, max_rounds=3, resume=True)
        monkeypatch.setattr(resumed.membership, "members", lambda: {record.peer_id: record})
        with resumed:
            assert (resumed.round, resumed.version) == (1, 5)  # its own round count, the swarm's version
            assert torch.allclose(resumed.outer.state.phi, ahead.outer.state.phi, atol=0.01)  # (int8 on the wire)
            assert "momentum_buffer" in next(iter(opt.state.values()))  # its inner optimizer came back
