"""Runs `p2p-diloco simulate` and reports: a progress bar on stderr, a table or one JSON object on stdout."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.sim.config import SimConfig
from p2p_diloco.core.data import load_corpus
from p2p_diloco.sim.simulator import Simulation


def run_simulation(sim: SimConfig, model: ModelConfig, train: TrainConfig, diloco: DiLoCoConfig, data: str | None,
                   as_json: bool, jobs: int = 1, vocab_size: int | None = None) -> dict:
    """Run every method of `sim`, `jobs` at a time; print a table, or one JSON object with `as_json`.

    `vocab_size` is the token shards' vocabulary when their header does not name it (`load_corpus`)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    corpus = load_corpus(data, vocab_size)
    err = Console(file=sys.stderr)
    results, started = {}, time.monotonic()
    with Progress(TextColumn("{task.description:>10}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=err,
                  disable=not err.is_terminal) as progress:
        tasks = {m: progress.add_task(m, total=1, loss="-") for m in sim.methods}

        def report(method, done, total, loss):
            if sim.time_budget is None:
                progress.update(tasks[method], completed=min(done, total), total=total,
                                loss=f"{loss:.3f}" if loss is not None else "-")

        train = Simulation(sim, model, train, diloco, corpus).train_cfg  # schedule length fitted to the budget
        jobs = max(1, min(jobs, len(sim.methods)))
        if jobs == 1:
            simulation = Simulation(sim, model, train, diloco, corpus, progress=report)
            for method in sim.methods:
                results[method] = simulation.run(method).as_dict()
                progress.update(tasks[method], completed=1, total=1)
        else:
            results = _run_parallel(sim, model, train, diloco, (data, vocab_size), jobs, report,
                                    lambda m: progress.update(tasks[m], completed=1, total=1))
    results = {m: results[m] for m in sim.methods}
    out = {"methods": results,
           "config": {"sim": _plain(sim), "model": {**_plain(model), **model.resolved()}, "train": _plain(train),
                      "diloco": _plain(diloco), "data": corpus.source, "jobs": jobs, "wall_seconds": round(time.monotonic() - started, 1)}}
    if as_json:
        print(json.dumps(out))
        return out
    table = Table(title=f"{sim.islands} islands, {corpus.source}, {'%.0f virtual s' % sim.time_budget if sim.time_budget else f'{sim.tokens:,} tokens'}")
    for col in ("method", "eval loss", "worst", "consensus", "tokens", "bytes/island", "virtual s", "utilization",
                "mixes/round"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r['eval_loss']:.4f}", f"{r['eval_loss_worst']:.4f}", f"{r['eval_loss_consensus']:.4f}",
                      f"{r['tokens']:,}", f"{r['bytes_sent_per_island']:,}", f"{r['virtual_seconds']:.1f}",
                      f"{r['utilization']:.3f}", "-" if r["mixes_per_round"] is None else f"{r['mixes_per_round']:.2f}")
    Console().print(table)
    return out


def _plain(cfg) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


def _method_worker(method: str, cfgs: tuple, data: tuple[str | None, int | None], queue) -> None:
    """One method in its own process with one torch thread (processes, not threads, share the cores)."""
    import torch

    torch.set_num_threads(1)
    last = [-1]

    def report(m, done, total, loss):
        pct = int(100 * done / max(total, 1))
        if pct != last[0]:
            last[0] = pct
            queue.put(("progress", m, done, total, loss))

    try:
        result = Simulation(*cfgs, load_corpus(*data), progress=report).run(method).as_dict()
        queue.put(("result", method, result))
    except BaseException as e:  # the parent reports it; a worker must not die silently
        queue.put(("error", method, f"{type(e).__name__}: {e}"))


def _run_parallel(sim, model, train, diloco, data, jobs, report, finished) -> dict:
    """Run each method in a separate process, at most `jobs` at a time; same results as in-process."""
    import multiprocessing as mp

    from p2p_diloco.errors import P2PDiLoCoError

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    pending, running, results = list(sim.methods), {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            m = pending.pop(0)
            running[m] = ctx.Process(target=_method_worker, args=(m, (sim, model, train, diloco), data, queue), daemon=True)
            running[m].start()
        kind, method, *rest = queue.get()
        if kind == "progress":
            report(method, *rest)
        elif kind == "result":
            results[method] = rest[0]
            running.pop(method).join()
            finished(method)
        else:
            for p in running.values():
                p.terminate()
            raise P2PDiLoCoError(f"simulating {method} failed: {rest[0]}")
    return results
