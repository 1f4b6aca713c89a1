"""Admission: every check a partner's state gets before it is mixed, behind one protocol.

`protocol` (the `Check` interface, its `Verdict`, the `Outcome` the round mixes or reports),
`admission` (runs the checks in order and folds their verdicts), `registry` (the checks by name),
`ledger` (what the island remembers of each partner), and the checks: `bounds` (identity,
momentum, size, behind, influence), `claims`, `plausibility` (the gate, and the measure taken of a
state as it arrives), `drift`, `probe`.
"""
