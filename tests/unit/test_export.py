"""Checkpoints that describe their model, `p2p-diloco export` and `p2p-diloco generate`.

An export of the project's GPT (as GPT-2) and of a Llama preset (with its tokenizer) loads with
`AutoModelForCausalLM.from_pretrained` and gives our logits; `generate` writes text from a run directory
and from an export; a checkpoint from before specs resumes but is not exported; what cannot be done is a
one-line error with exit code 2. Checkpoints are written as an island writes them (`checkpoint.pack` with
the spec in the meta), and once by a real island (`run_island`, one lone round).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from p2p_diloco.cli import main
from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig, ModelConfig, NetworkConfig, TrainConfig
from p2p_diloco.core.inner import InnerLoop
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.model import from_spec
from p2p_diloco.core.params import fingerprint
from p2p_diloco.core.spec import ModelSpec, model_spec
from p2p_diloco.peers.state import checkpoint
from p2p_diloco.peers.state.modelfiles import TOKENIZER_NAME, keep_tokenizer
from p2p_diloco.peers.state.saving import ModelExtras

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytestmark = pytest.mark.timeout(90)

TEXT = "def hello(world):\n    return world * 2\n\nclass Island:\n    pass\n"
GPT_SMALL = ModelConfig(n_layer=2, n_embd=32, n_head=4, block_size=32)


def make_tokenizer(folder: Path) -> Path:
    """A byte-level BPE of a few hundred tokens, trained here (nothing downloaded), `<|endoftext|>` id 0."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / TOKENIZER_NAME))
    return folder / TOKENIZER_NAME


def write_checkpoint(run_dir: Path, spec: ModelSpec | None, base: ModelSpec | None = None) -> torch.nn.Module:
    """A checkpoint of a model of `spec` trained a few steps, as an island writes it (`spec` None: as one did
    before checkpoints described their model); returns the model with the checkpoint's weights."""
    torch.manual_seed(0)
    model = from_spec(spec or base)
    loop = InnerLoop(model, TrainConfig(batch_size=2, lr=1e-2, warmup_steps=1, compile="off"))
    x = torch.randint(0, (spec or base).vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        loop.train_step(x[:, :-1], x[:, 1:])
    outer = OuterLoop("x", model, DiLoCoConfig())  # its anchor: the weights now
    meta = {"round": 1, "model": fingerprint(model)}
    if spec is not None:
        meta["spec"] = keep_tokenizer(run_dir, spec).to_json()
    tensors, meta = checkpoint.pack(outer, {"model": ModelExtras(model)}, meta)
    checkpoint.save(run_dir / "checkpoints", tensors, meta)
    return model.eval()


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(out, code: int = 2) -> str:
    assert out.exit_code == code, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out.output
    return lines[0]


def same_logits(ours: torch.nn.Module, theirs: torch.nn.Module, vocab: int) -> float:
    idx = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return float((ours(idx)[0] - theirs(input_ids=idx).logits).abs().max())


def test_the_projects_gpt_exports_as_a_gpt2_with_the_same_logits_and_generates(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    ours = write_checkpoint(run, model_spec(GPT_SMALL, 256))
    done = cli("export", run, out)
    assert done.exit_code == 0, done.output
    assert "GPT2LMHeadModel" in done.output and {"config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs).__name__ == "GPT2LMHeadModel" and theirs.config.activation_function == "gelu"
    assert same_logits(ours, theirs, 256) < 1e-4
    for source in (run, out):  # from the run directory, and from the export
        text = cli("generate", source, "--prompt", "def ", "--max-new-tokens", "12", "--seed", "3")
        assert text.exit_code == 0, text.output
        assert text.output.startswith("def ") and len(text.output.encode()) >= len("def ") + 1, text.output


def test_a_llama_exports_as_itself_with_its_tokenizer_and_generates(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    tok_file = make_tokenizer(tmp_path / "data")
    vocab = tokenizers.Tokenizer.from_file(str(tok_file)).get_vocab_size()
    spec = model_spec(ModelConfig(size="llama-tiny", block_size=32), vocab, tokenizer=tok_file, eos_id=0)
    ours = write_checkpoint(run, spec)
    assert (run / TOKENIZER_NAME).read_bytes() == tok_file.read_bytes()  # the run directory holds its tokenizer
    done = cli("export", run, out)
    assert done.exit_code == 0, done.output
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs).__name__ == "LlamaForCausalLM" and theirs.config.vocab_size == vocab
    assert same_logits(ours, theirs, vocab) < 1e-4
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.eos_token == "<|endoftext|>"
    assert hf_tok("def hello")["input_ids"] == tokenizers.Tokenizer.from_file(str(tok_file)).encode("def hello").ids
    for source in (run, out):
        text = cli("generate", source, "--prompt", "def hello", "--max-new-tokens", "8", "--temperature", "0")
        assert text.exit_code == 0, text.output
        assert text.output.startswith("def hello"), text.output


def test_out_must_be_empty_unless_forced(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    write_checkpoint(run, model_spec(GPT_SMALL, 256))
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert "is not empty" in one_line_error(cli("export", run, out))
    assert cli("export", run, out, "--force").exit_code == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()
    (tmp_path / "file").write_text("x")
    assert "is not a folder" in one_line_error(cli("export", run, tmp_path / "file"))


def test_what_cannot_be_exported_or_sampled_is_one_line(tmp_path):
    assert "holds no checkpoint" in one_line_error(cli("export", tmp_path, tmp_path / "out"))
    assert "does not exist" in one_line_error(cli("generate", tmp_path / "nowhere", "--prompt", "x"))
    old = tmp_path / "old"
    write_checkpoint(old, None, base=model_spec(GPT_SMALL, 256))  # written before checkpoints described their model
    assert "does not say which model it holds" in one_line_error(cli("export", old, tmp_path / "out"))
    assert "does not say which model it holds" in one_line_error(cli("generate", old, "--prompt", "x"))
    ids = tmp_path / "ids"
    write_checkpoint(ids, model_spec(GPT_SMALL, 300))  # token ids without a tokenizer: no text to read or write
    assert "has no tokenizer and a vocabulary of 300" in one_line_error(cli("generate", ids, "--prompt", "x"))
    assert cli("export", ids, tmp_path / "ids-out").exit_code == 0  # ... but the model exports


def test_a_real_island_describes_its_model_and_an_old_checkpoint_still_resumes(tmp_path):
    """`run_island` (one lone round of llama-tiny on token shards with a tokenizer): the run directory gets
    the tokenizer and its checkpoint the spec; with the spec taken out (a checkpoint from before), it resumes."""
    import numpy as np

    from p2p_diloco.core.shards import write_shard
    from p2p_diloco.core.sidecar import DataSidecar, write_sidecar
    from p2p_diloco.peers.launch.process import run_island

    data = tmp_path / "data"
    tok_file = make_tokenizer(data)
    tok = tokenizers.Tokenizer.from_file(str(tok_file))
    ids = np.array(tok.encode(TEXT * 60).ids, dtype=np.uint16)
    write_shard(data / "train_000.bin", ids, tok.get_vocab_size())
    write_shard(data / "val_000.bin", ids[: len(ids) // 4], tok.get_vocab_size())
    write_sidecar(data, DataSidecar(vocab_size=tok.get_vocab_size(), dtype="uint16", tokenizer=tok_file, eos_id=0,
                                    splits={"train": ["train_000.bin"], "val": ["val_000.bin"]},
                                    tokens={"train": len(ids), "val": len(ids) // 4}, source="test"))
    run = tmp_path / "run"

    def one_round(resume: bool) -> int:
        island = IslandConfig(run_dir=run, max_rounds=1, quiet=True, eval_batches=1, reach="direct", resume=resume)
        code, _ = run_island(island, ModelConfig(size="llama-tiny", block_size=16),
                             TrainConfig(batch_size=2, warmup_steps=1, compile="off"), DiLoCoConfig(local_steps=2),
                             NetworkConfig(), DiscoveryConfig(discovery="zmq", host="127.0.0.1"), str(data))
        return code

    assert one_round(resume=False) == 0
    assert (run / TOKENIZER_NAME).read_bytes() == tok_file.read_bytes()
    latest = checkpoint.latest(run / "checkpoints")
    meta = json.loads((latest / "meta.json").read_text())
    spec = ModelSpec.from_json(meta["spec"])
    assert spec.preset == "llama-tiny" and spec.tokenizer == TOKENIZER_NAME and spec.eos_id == 0
    assert spec.vocab_size == tok.get_vocab_size() and spec.hf_config["model_type"] == "llama"
    assert cli("export", run, tmp_path / "out").exit_code == 0

    del meta["spec"]  # as a checkpoint written before checkpoints described their model
    (latest / "meta.json").write_text(json.dumps(meta))
    assert "does not say which model it holds" in one_line_error(cli("export", run, tmp_path / "out2"))
    assert one_round(resume=True) == 0  # it resumes, and the new checkpoint describes the model again
    assert "spec" in json.loads((checkpoint.latest(run / "checkpoints") / "meta.json").read_text())
