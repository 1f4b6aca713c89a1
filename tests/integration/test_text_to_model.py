"""Issue 47 end to end, offline, in one temp folder: text -> `p2p-diloco prepare --train-tokenizer` -> a
bootstrap and two `join --model llama-tiny --log-to tensorboard,wandb` islands that train a few rounds and
mix each other's states -> `p2p-diloco export` -> transformers loads the folder with no custom code,
computes our logits and generates what `p2p-diloco generate` writes; the rounds' loss is in each
island's TensorBoard event files and offline W&B run.

The text is this Python's standard-library sources (no network). `prepare`, `export` and `generate` run
in this process through the CLI (`CliRunner`): torch and transformers are imported once for all three
and for the checks. The checks' imports (seconds of CPU: transformers' Llama, TensorBoard's reader, W&B's
records) wait until the islands are built, and take place while discovery settles (`DISCOVERY_SETTLE_S`):
two cores are not shared three ways while the islands import torch and transformers themselves.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from swarm_harness import IslandProc, run_until_mixed, start_bootstrap
from tracker_files import tensorboard_scalars, wandb_history, wandb_records

from p2p_diloco.cli import main
from p2p_diloco.core.shards import open_shard
from p2p_diloco.core.sidecar import read_sidecar
from p2p_diloco.peers.state import checkpoint

EXTRAS = ("transformers", "tokenizers", "tensorboard", "wandb")
MISSING = [name for name in EXTRAS if importlib.util.find_spec(name) is None]  # (not imported: see the docstring)
pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} (the hf, tokenize, "
                                                       "tensorboard and wandb extras)")]

TEXT_CHARS = 300_000
"""A few hundred KB of text: ~130k tokens of a BPE of `VOCAB`, more than the islands read."""
VOCAB = 512
ROUNDS = 3
"""Each island trains at least this many rounds, of `H` inner steps of 8 sequences of `BLOCK` tokens, and until
it has mixed its partner's state in; then SIGTERM stops it: it ends the round, writes a checkpoint and leaves."""
H = 5
BLOCK = 64
PROMPT = "def "
NEW_TOKENS = 12


def write_text(folder: Path) -> int:
    """The standard library's top-level modules of under 40k characters, in name order, up to `TEXT_CHARS`:
    code, docstrings and comments of a few dozen modules."""
    folder.mkdir()
    chars = 0
    for src in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = src.read_text(encoding="utf-8", errors="replace")
        if len(text) < 40_000 and chars < TEXT_CHARS:
            (folder / src.name).write_text(text, encoding="utf-8")
            chars += len(text)
    return chars


def cli(*args) -> str:
    out = CliRunner().invoke(main, [str(a) for a in args])
    assert out.exit_code == 0, (out.output, out.exception)
    return out.output


def test_text_becomes_a_llama_that_two_islands_train_and_transformers_loads(procs, tmp_path, monkeypatch):
    # W&B as on a machine with no route to it: no WANDB_MODE (the sink's default is offline), its folders here
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    with ThreadPoolExecutor(1) as pool:  # the bootstrap starts (it imports hivemind: seconds) as the text is prepared
        bootstrap = pool.submit(start_bootstrap, procs, tmp_path)  # (the ZeroMQ rendezvous: no libp2p daemon)
        assert write_text(tmp_path / "text") >= TEXT_CHARS
        data = tmp_path / "data"
        cli("prepare", tmp_path / "text", "-o", data, "--train-tokenizer", VOCAB, "-q")
        _, entry = bootstrap.result()
    sidecar = read_sidecar(data)
    assert sidecar.vocab_size == VOCAB and sidecar.tokenizer.is_file() and sidecar.eos_id is not None
    assert sidecar.tokens["train"] > ROUNDS * H * 8 * BLOCK, sidecar.tokens

    islands = [IslandProc(procs, tmp_path, f"i{k}", entry, "--model", "llama-tiny", "--data", str(data),
                          "-H", str(H), "--max-rounds", "1000", "--wait-for", "2", "--quiet",
                          "--log-to", "tensorboard,wandb",
                          run_id="text-to-model", every=100,
                          settings={"model": {"block_size": BLOCK}, "log": {"wandb_project": "issue-47"}})
               for k in range(2)]
    for isl in islands:
        isl.peer_id  # (its island.json: built, trackers started, discovery settling; see the module docstring)
    for module in ("transformers.models.llama.modeling_llama", "tensorboard.backend.event_processing.event_accumulator",
                   "wandb.proto.wandb_internal_pb2"):
        importlib.import_module(module)
    # (a fixed round count is a race: rounds take a fifth of a second on an idle machine, and a record of the
    # partner's first round may reach the island only after a second; `run_until_mixed` waits for the mix)
    summaries = run_until_mixed(islands, ROUNDS, 150)

    ids = {s["peer_id"] for s in summaries}
    for isl, s in zip(islands, summaries):
        rows = isl.rounds()
        assert [r["round"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= ROUNDS, isl.tail()
        assert s["rounds"] == len(rows) and s["mixes"] >= 1, s
        latest = checkpoint.latest(isl.run_dir / "checkpoints")  # written as it left
        assert latest is not None and json.loads((latest / "meta.json").read_text())["round"] == len(rows), isl.tail()
        assert isl.mixed_partners() == ids - {s["peer_id"]}, [  # each mixed the other's state in
            {k: r.get(k) for k in ("round", "partner", "weight", "refused", "fetch_error")} for r in rows]
        assert s["eval_loss"] < s["initial_loss"], s  # (ln 512 = 6.2 at the start)

        # each round's loss, as metrics.jsonl has it, in TensorBoard and in the offline W&B run
        loss = tensorboard_scalars(isl.run_dir)["loss/train"]
        assert [e.step for e in loss] == [r["round"] for r in rows]
        assert [e.value for e in loss] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
        records = wandb_records(isl.run_dir)
        [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert (run.display_name, run.project, run.run_group) == (isl.name, "issue-47", "text-to-model")
        history = wandb_history(records)
        assert [h["_step"] for h in history] == [r["round"] for r in rows]
        assert [h["loss/train"] for h in history] == pytest.approx([r["loss"] for r in rows])

    import transformers

    from p2p_diloco.peers.state.export import load_run_model

    run_dir, out = islands[0].run_dir, tmp_path / "export"
    assert "LlamaForCausalLM" in cli("export", run_dir, out)
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files, files
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()  # (no trust_remote_code)
    assert type(theirs).__name__ == "LlamaForCausalLM" and theirs.config.vocab_size == VOCAB
    ours = load_run_model(run_dir).model
    val = np.asarray(open_shard(data / sidecar.splits["val"][0])[0][: 4 * BLOCK], dtype=np.int64)
    batch = torch.from_numpy(val).view(4, BLOCK)  # held-out tokens of the text
    with torch.no_grad():
        assert float((ours(batch)[0] - theirs(input_ids=batch).logits).abs().max()) < 1e-4

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompt = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():  # (greedy, and past the end-of-document token as `generate` goes)
        generated = theirs.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                    pad_token_id=tokenizer.eos_token_id)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + NEW_TOKENS
    hf_text = tokenizer.decode(generated[0])
    assert hf_text.startswith(PROMPT) and len(hf_text) > len(PROMPT), hf_text
    for source in (run_dir, out):  # `generate`, greedy, from the run directory and from the export
        text = cli("generate", source, "--prompt", PROMPT, "--max-new-tokens", NEW_TOKENS, "--temperature", 0)
        assert text == hf_text + "\n", (source, text, hf_text)
