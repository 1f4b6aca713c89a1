"""`p2p-diloco prepare`: text or a Hugging Face dataset into token shards `join --data` reads
(`core.prepare`); and `p2p-diloco bench prepare`, how fast this CPU tokenizes (`bench.prepare`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from p2p_diloco.cli.options import user_errors


@click.command()
@click.argument("source", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Folder for the shards, tokenizer.json and dataset.json (join --data OUT).")
@click.option("--tokenizer", default=None, metavar="PATH|NAME",
              help="A tokenizer.json (or a folder holding one), or a pretrained tokenizer's name on the Hugging "
                   "Face Hub, e.g. gpt2 (needs the network).")
@click.option("--train-tokenizer", "train_vocab", type=int, default=None, metavar="VOCAB",
              help="Train a byte-level BPE of VOCAB tokens on the text itself (no network). "
                   "Without this or --tokenizer, the tokens are the text's bytes (vocabulary 256).")
@click.option("--eos", default=None, metavar="TOKEN",
              help="The --tokenizer's end-of-document token, put between documents (default: the first of "
                   "<|endoftext|>, <|end_of_text|>, </s>, <eos> it has).")
@click.option("--dataset", default=None, metavar="NAME|PATH",
              help="Read a Hugging Face dataset instead of SOURCE: a name on the Hub, a saved dataset folder, or "
                   "a .jsonl/.json/.parquet/.csv file (needs: pip install 'p2p-diloco[datasets]').")
@click.option("--dataset-config", default=None, help="The dataset's configuration (subset) name.")
@click.option("--split", default="train", show_default=True, help="The dataset's split to read.")
@click.option("--text-field", default="text", show_default=True, help="The dataset's column of text.")
@click.option("--val-fraction", type=float, default=0.01, show_default=True,
              help="Share of the tokens held out as the validation split (val_*.bin).")
@click.option("--shard-tokens", type=int, default=100_000_000, show_default=True, help="Tokens per shard file.")
@click.option("--max-mb", type=float, default=None, help="Stop after about this many million characters of text.")
@click.option("--force", is_flag=True, help="Replace the token data an output folder already holds.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar (there is none when stderr is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the dataset.json written, as one JSON object.")
def prepare(source, out_dir, tokenizer, train_vocab, eos, dataset, dataset_config, split, text_field, val_fraction,
            shard_tokens, max_mb, force, quiet, as_json) -> None:
    """Tokenize SOURCE (a text file or a folder of them) or --dataset into shards for `join --data OUT`.

    Writes OUT/train_000.bin ... and OUT/val_000.bin ... (llm.c shards: uint16 ids, uint32 for a vocabulary
    above 65,536), OUT/tokenizer.json and OUT/dataset.json, which names the vocabulary, the token width,
    the end-of-document id and the splits: `join --data OUT` needs no --vocab-size."""
    from p2p_diloco.core.prepare import PrepareConfig
    from p2p_diloco.core.prepare import prepare as run_prepare
    from p2p_diloco.core.textsource import TextInput
    from p2p_diloco.core.tokenizer import TokenizerSpec

    with user_errors():
        spec = TokenizerSpec(source=tokenizer, train_vocab=train_vocab, eos=eos)
        inp = TextInput(path=source, dataset=dataset, config=dataset_config, split=split, text_field=text_field)
        cfg = PrepareConfig(out_dir=out_dir, val_fraction=val_fraction, shard_tokens=shard_tokens,
                            max_chars=None if max_mb is None else int(max_mb * 1e6), force=force, progress=not quiet)
        result = run_prepare(inp, spec, cfg)
    s = result.sidecar
    if as_json:
        click.echo(json.dumps(json.loads(result.path.read_text())))
        return
    mb_s = result.chars / 1e6 / max(result.seconds, 1e-9)
    click.echo(f"{s.tokens.get('train', 0):,} train and {s.tokens.get('val', 0):,} val tokens ({s.dtype}, vocabulary "
               f"{s.vocab_size:,}) in {out_dir}: {result.chars / 1e6:.1f} M characters in {result.seconds:.1f} s "
               f"({mb_s:.1f} M/s). Train with: p2p-diloco join --data {out_dir}")


@click.command("prepare")
@click.option("--mb", type=click.FloatRange(0.1, 10_000), default=50.0, show_default=True,
              help="Million characters of text to tokenize (the standard library's sources, repeated as needed).")
@click.option("--vocab", type=click.IntRange(257, 1 << 20), default=32_768, show_default=True,
              help="The byte-level BPE's vocabulary.")
@click.option("--train-mb", type=click.FloatRange(0.1, 10_000), default=8.0, show_default=True,
              help="Million characters the BPE is trained on.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_prepare(mb, vocab, train_mb, as_json) -> None:
    """Tokenizing speed: a byte-level BPE trained here, then `prepare`'s encoding of the text into shards."""
    from p2p_diloco.bench.prepare import run

    with user_errors():
        out = run(int(mb * 1e6), vocab, int(train_mb * 1e6), log=lambda msg: click.echo(msg, err=True))
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"{out['chars'] / 1e6:.1f} M characters -> {out['tokens'] / 1e6:.2f} M tokens with a byte-level BPE of "
               f"{out['vocab']}: encode {out['encode_mb_s']:.1f} MB/s by {out['encoder']} ({out['encode_mb_per_cpu_s']:.1f} MB "
               f"per CPU-second; tokenizers alone {out['tokenizers_encode_mb_s']:.1f} MB/s), "
               f"prepare (encode + shards) {out['prepare_mb_s']:.1f} MB/s on {out['threads']} core(s) (load average "
               f"{out['load_avg']}); training on {out['train_chars'] / 1e6:.1f} M: {out['train_s']:.1f} s")
