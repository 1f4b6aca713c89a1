#!/usr/bin/env bash
# The first run on a GPU machine, in one shot: `p2p-diloco doctor`, then `p2p-diloco bench gpu`
# (a plain training loop, two gpt2-small islands in bf16 on one GPU for 20 rounds, two gpt2-1b
# islands for 3, then `bench round` on it).
#
#   scripts/gpu_check.sh [FILE]
#
# Prints one JSON object on stdout (BENCHMARKS.md, "GPU check", says what each figure is) and also
# writes it to FILE, else to $OUT/gpu_check.json when $OUT is set; progress and the doctor's report
# go to stderr. With $OUT set the islands' logs and the doctor's JSON land there too. Python: $PYTHON,
# else .venv/bin/python, else python3 (the project is installed into it, without dependencies, when
# it is not there yet). Bounded by GPU_CHECK_TIMEOUT seconds (default 480). Extra arguments after
# FILE go to `bench gpu` (e.g. `--rounds 6`, `--big-preset none`).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-}"
[ $# -gt 0 ] && shift
if [ -z "$out" ] && [ -n "${OUT:-}" ]; then out="$OUT/gpu_check.json"; fi
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c 'import p2p_diloco.peers' 2>/dev/null; then
  echo "gpu_check: installing this project into $PY (no dependencies)" >&2
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e . >&2
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/p2p-diloco-gpu-check.XXXXXX")"
finish() {
  code=$?
  if [ -n "${OUT:-}" ]; then  # the small files only: the checkpoints stay behind
    mkdir -p "$OUT/gpu_check_logs"
    (cd "$work" && find . \( -name '*.log' -o -name '*.json' -o -name metrics.jsonl \) \
      -exec cp --parents {} "$OUT/gpu_check_logs" \;) || true
  fi
  if [ "$code" != 0 ]; then
    for f in "$work"/run/swarm/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done
  fi
  rm -rf "$work"
  exit "$code"
}
trap finish EXIT

"$PY" -m p2p_diloco doctor >&2 || true
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; "$PY" -m p2p_diloco doctor --json > "$OUT/doctor.json" || true; fi
[ -n "$out" ] && mkdir -p "$(dirname "$out")"
timeout --kill-after=20 "${GPU_CHECK_TIMEOUT:-480}" \
  "$PY" -m p2p_diloco bench gpu --json --workdir "$work/run" ${out:+--output "$out"} "$@"
