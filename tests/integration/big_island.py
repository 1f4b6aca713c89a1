"""One island of the GPT-2-small shape (124M parameters at GPT-2's vocabulary) through the public API.

Run by `test_big_island.py` as a process: a few inner steps on a tiny batch (one of four fixed
random sequences) per round, so the state (124M fp32 values, 497 MB; 125 MB on the wire in int8)
is what is exercised, not the compute. The exchange is pinned to whole states (`auto` may fetch
public-state updates, and leave the whole state's path untested). Prints the island's summary as
one JSON line.
"""

import json
import sys
import zlib

import torch

import p2p_diloco
from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig, ModelConfig
from p2p_diloco.core.model import build_model

GPT2_VOCAB = 50257


def main(run_dir: str, rendezvous: str, name: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)  # every island starts from the same weights
    model = build_model(ModelConfig(size="gpt2-small"), GPT2_VOCAB)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)  # stateless: the exchange is under test, not the optimizer
    # a few sequences both islands learn, each in its own order: on pure noise their progress would
    # share no direction, and the plausibility check rightly refuses a partner that moved against it
    pool = torch.randint(0, GPT2_VOCAB, (4, 17), generator=torch.Generator().manual_seed(0))
    data = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    island_cfg = IslandConfig(run_dir=run_dir, name=name, max_rounds=3, wait_for=2, quiet=True, checkpoint_every=100)
    discovery = DiscoveryConfig(bootstrap=(rendezvous,), discovery="zmq", run_id="big")
    diloco = DiLoCoConfig(local_steps=3, exchange="state")
    with p2p_diloco.join(model, optimizer, discovery=discovery, island=island_cfg, diloco=diloco,
                         tokens_per_step=16) as island:
        while not island.done:
            x = pool[torch.randint(len(pool), (1,), generator=data)]
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            island.step(loss=loss)
    summary = island.close()
    summary["params"] = sum(p.numel() for p in model.parameters())
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
