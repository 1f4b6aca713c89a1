"""BENCHMARKS.md's first table is generated from docs/results (`bench.reference`): it matches them,
and the results keep where they came from; DESIGN.md's tables are generated from the code (`bench.design`)."""

from __future__ import annotations

import json

import pytest

from p2p_diloco.admission import CHECKS, AdmissionConfig
from p2p_diloco.bench import design
from p2p_diloco.bench.reference import CLAIMS, ReferenceError, Result, keep, render, rows
from p2p_diloco.cli.config_file import SECTIONS
from p2p_diloco.cli.reference import BENCHMARKS, DESIGN, RESULTS
from p2p_diloco.config import IslandConfig


def test_benchmarks_table_is_what_the_stored_results_give():
    now, want = render(BENCHMARKS, RESULTS)
    assert now == want, "BENCHMARKS.md's table differs from docs/results: run `p2p-diloco bench reference`"


def test_every_stored_result_is_read_by_a_claim_and_says_where_it_comes_from():
    stored = {p.stem for p in RESULTS.glob("*.json")}
    assert stored <= {c.result for c in CLAIMS}, stored - {c.result for c in CLAIMS}
    for stem in stored:
        r = Result.load(RESULTS / f"{stem}.json")
        assert r.command.startswith("p2p-diloco ") and r.commit and r.date and r.machine and r.runtime_s > 0, stem


def test_keep_stores_an_output_with_its_provenance_and_a_broken_one_is_one_error(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text('progress on stderr\n{"prepare_mb_s": 6.5, "load_avg": 1.0}\n')
    path = keep("prepare", out, "p2p-diloco bench prepare --json", 20.0, tmp_path / "results")
    r = Result.load(path)
    assert r.output == {"prepare_mb_s": 6.5, "load_avg": 1.0} and r.command == "p2p-diloco bench prepare --json"
    assert r.runtime_s == 20.0 and r.date.count("-") == 2 and "CPU cores" in r.machine
    table = rows(tmp_path / "results")
    assert len(table) == len(CLAIMS)
    assert any("6.50 MB/s" in row and "| yes |" in row for row in table)
    assert sum("not stored yet" in row for row in table) == len(CLAIMS) - 1
    (tmp_path / "results" / "swarm.json").write_text(json.dumps({"command": "x"}))
    with pytest.raises(ReferenceError, match="swarm.json is not a stored result"):
        rows(tmp_path / "results")
    out.write_text("no json here\n")
    with pytest.raises(ReferenceError, match="no bench output"):
        keep("prepare", out, "p2p-diloco bench prepare --json", 1.0, tmp_path / "results")


def test_design_tables_are_what_the_code_gives():
    now, want = design.render(DESIGN, SECTIONS)
    assert now == want, "docs/DESIGN.md's generated tables differ from the code: run `p2p-diloco bench reference`"


def test_every_check_and_section_has_its_row_with_its_settings():
    checks = design.checks_table().splitlines()[2:]
    assert [row.split("|")[1].strip(" `") for row in checks] == list(CHECKS)
    trust = next(row for row in checks if row.startswith("| `trust`"))
    assert "`[admission.trust]` behind=0.5, slack=0.25, memory=0.7, step=0.1, agree=1.0" in trust
    assert "`peers/admission/trust.py`" in trust and all(row.count("|") == 6 for row in checks)
    sections = design.sections_table({"island": IslandConfig, "admission": AdmissionConfig}).splitlines()[2:]
    assert sections[0].startswith("| `[island]` | `IslandConfig` (`p2p_diloco/config.py`) | run_dir='runs/island', ")
    assert [row.split("|")[1].strip(" `") for row in sections[1:]] == \
        ["[admission]"] + [f"[admission.{s}]" for s in ("claims", "bounds", "gate", "trust", "drift", "probe")]


def test_a_document_without_its_markers_is_one_error(tmp_path):
    doc = tmp_path / "DESIGN.md"
    doc.write_text("# no tables here\n")
    with pytest.raises(ReferenceError, match="has no generated table"):
        design.render(doc, SECTIONS)
