"""What the project claims about its set-up is what CI runs: the Python version and the README."""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_python_the_readme_and_pyproject_claim_is_the_one_ci_runs():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = map(int, re.fullmatch(r">=(\d+)\.(\d+)", declared).groups())
    assert f"Requires Python {major}.{minor}+" in (ROOT / "README.md").read_text()
    assert sys.version_info[:2] >= (major, minor)  # CI runs this suite on the oldest claimed or newer
