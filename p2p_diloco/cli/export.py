"""`p2p-diloco export` (a run directory's model as a Hugging Face model folder) and `p2p-diloco generate`
(text sampled from it): the library is `peers/state/export.py` and `peers/state/generate.py`."""

from __future__ import annotations

from pathlib import Path

import click

from p2p_diloco.choices import DEVICES_HELP
from p2p_diloco.cli.options import user_errors

CHECKPOINT_HELP = "A checkpoint folder (RUN_DIR/checkpoints/ckpt-...) instead of the latest (checkpoints/latest)."


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--checkpoint", "given", type=click.Path(path_type=Path), default=None, help=CHECKPOINT_HELP)
@click.option("--force", is_flag=True, help="Write into OUT even when it is not empty (an earlier export's files go).")
def export(run_dir: Path, out: Path, given: Path | None, force: bool) -> None:
    """Write the model of RUN_DIR's latest checkpoint to OUT as a Hugging Face model folder.

    OUT gets config.json and model.safetensors, and the tokenizer's files when the data had a tokenizer:
    `transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads it with no custom code. The project's
    GPT is written as the GPT2LMHeadModel that computes the same logits; a Llama preset or a config.json's
    model as itself. Needs transformers (pip install 'p2p-diloco[hf]')."""
    from p2p_diloco.peers.state.export import export_run

    with user_errors():
        done = export_run(run_dir, out, given, force)
    click.echo(f"wrote {done.architecture} from {done.checkpoint} to {done.out}: {', '.join(done.files)}")


@click.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--prompt", required=True, help="The text the model goes on from.")
@click.option("--max-new-tokens", type=click.IntRange(min=0), default=200, show_default=True,
              help="Tokens (bytes for a byte-level model) to write after the prompt.")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.8, show_default=True,
              help="Sampling temperature (0: the likeliest token each time).")
@click.option("--top-k", type=click.IntRange(min=0), default=40, show_default=True,
              help="Sample among the K likeliest tokens (0: among all).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sampling.")
@click.option("--checkpoint", "given", type=click.Path(path_type=Path), default=None, help=CHECKPOINT_HELP)
@click.option("--device", default="cpu", show_default=True, help=f"Where the model runs: {DEVICES_HELP}.")
def generate(source: Path, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int,
             given: Path | None, device: str) -> None:
    """Print the prompt and what the model of SOURCE writes after it.

    SOURCE is a run directory of `join` (its latest checkpoint) or a folder `export` wrote. Text is read
    with the model's tokenizer, or as bytes where the data had none."""
    from p2p_diloco.peers.state.generate import SampleSettings, generate_text

    with user_errors():
        settings = SampleSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k or None, seed=seed)
        text = generate_text(source, prompt, settings, given, device)
    click.echo(text)
