"""What the project claims about its set-up is what CI runs: the Python version and the README."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_python_the_readme_and_pyproject_claim_is_the_one_ci_runs():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = map(int, re.fullmatch(r">=(\d+)\.(\d+)", declared).groups())
    assert f"Requires Python {major}.{minor}+" in (ROOT / "README.md").read_text()
    assert sys.version_info[:2] >= (major, minor)  # CI runs this suite on the oldest claimed or newer


def test_a_source_checkout_imports_without_installing():
    """`peers/`, `tui/` and `bootstrap/` install as `p2p_diloco.*`; from the tree alone they import too."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import p2p_diloco.peers, p2p_diloco.config;"
            "from p2p_diloco.tui.format import si; print(p2p_diloco.peers.__file__)")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(ROOT / "peers" / "__init__.py")
