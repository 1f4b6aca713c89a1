"""The architecture in docs/DESIGN.md, checked: no import cycle, imports one way, light packages stay light.

That the dashboard loads neither torch nor the training core is checked where it runs: in a fresh
interpreter with a running app (tests/tui/test_tui_parts.py) and watching a DHT run
(tests/tui/test_tui_live.py).

The import graph is read from the source (every import of the project's own modules, lazy ones
inside functions included, except under `if TYPE_CHECKING:`); what a package loads is measured in
a fresh interpreter (`sys.modules`).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"p2p_diloco": "p2p_diloco", "p2p_diloco.peers": "peers", "p2p_diloco.tui": "tui",
           "p2p_diloco.bootstrap": "bootstrap"}
"""Installed package name -> folder (pyproject.toml maps the last three)."""
LAYERS = [
    {"p2p_diloco", "p2p_diloco.errors", "p2p_diloco.config", "p2p_diloco.addresses", "p2p_diloco.terminal"},
    {"p2p_diloco.core"},
    {"p2p_diloco.exchange", "p2p_diloco.discovery"},
    {"p2p_diloco.sim", "p2p_diloco.peers", "p2p_diloco.tui", "p2p_diloco.bootstrap"},
    {"p2p_diloco.bench"},
    {"p2p_diloco.cli"},
    {"p2p_diloco.__main__"},
]
"""Each group may import its own and the groups before it (docs/DESIGN.md, "Architecture")."""
SIDEWAYS = {("p2p_diloco.peers", "p2p_diloco.sim"), ("p2p_diloco.peers", "p2p_diloco.tui")}
"""The allowed imports within a layer: the demo (peers/launch/demo.py) runs the simulator's data-parallel
baseline and shows the dashboard."""


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            name = ".".join([package, *parts])
            out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for sub in node.body for n in ast.walk(sub)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    g = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    # a package's __init__ may import its own modules (the factory, the click root)
    return {m: {t for t in deps if not (t.startswith(m + ".") and mods[m].name == "__init__.py")} for m, deps in g.items()}


GRAPH = graph()
"""The project's import graph, read once for the tests below."""


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                on.discard(w)
                comp.append(w)
            on.discard(v)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> tuple[int, str]:
    """(layer number, package) of a module: the longest layer entry it falls under."""
    best = (-1, "")
    for i, entries in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > len(best[1]):
                best = (i, entry)
    assert best[0] >= 0, f"{module} is in no layer of docs/DESIGN.md"
    return best


def test_the_graph_sees_every_package_and_import():
    g = GRAPH
    assert {"p2p_diloco.core.island", "p2p_diloco.peers.launch.runner", "p2p_diloco.tui.app", "p2p_diloco.bootstrap.node",
            "p2p_diloco.discovery", "p2p_diloco.cli"} <= set(g)
    assert "p2p_diloco.core.outer" in g["p2p_diloco.core.island"]
    assert "p2p_diloco.peers.state.checkpoint" in g["p2p_diloco.peers.state.saving"]  # `from p2p_diloco.peers.state import checkpoint`
    assert "p2p_diloco.peers.launch.process" in g["p2p_diloco.cli.join"]  # a lazy import inside a function counts


def test_no_import_cycle():
    assert cycles(GRAPH) == []


def test_a_cycle_is_found():
    """The check itself: a lazy import that closes a loop is a cycle."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_run_one_way():
    wrong = []
    for module, deps in GRAPH.items():
        (lm, pm) = layer(module)
        for dep in deps:
            (ld, pd) = layer(dep)
            if ld > lm or (ld == lm and pd != pm and (pm, pd) not in SIDEWAYS and lm > 0):
                wrong.append(f"{module} -> {dep}")
    assert wrong == [], "imports against the layers of docs/DESIGN.md"


def test_core_imports_only_the_settings_and_errors_from_the_project():
    outside = {dep for module, deps in GRAPH.items() if module.startswith("p2p_diloco.core")
               for dep in deps if not dep.startswith("p2p_diloco.core")}
    assert outside <= {"p2p_diloco.config", "p2p_diloco.admission", "p2p_diloco.errors", "p2p_diloco.addresses"}, outside


BOTTOM = ("p2p_diloco", "p2p_diloco.errors", "p2p_diloco.config", "p2p_diloco.admission", "p2p_diloco.choices",
          "p2p_diloco.addresses", "p2p_diloco.terminal", "p2p_diloco.model_config", "p2p_diloco.tracking")
MIDDLE = {
    "p2p_diloco.sim": ("p2p_diloco.sim", "p2p_diloco.core", "p2p_diloco.exchange.cost"),
    "p2p_diloco.tui": ("p2p_diloco.tui", "p2p_diloco.discovery"),
}
"""What each package of the middle layer may use besides the bottom one (docs/DESIGN.md, "Architecture")."""


def test_the_middle_layer_uses_what_docs_design_says():
    wrong = []
    for module, deps in GRAPH.items():
        allowed = next((a for p, a in MIDDLE.items() if module == p or module.startswith(p + ".")), None)
        if allowed is not None:
            wrong += [f"{module} -> {d}" for d in deps
                      if d not in BOTTOM and not any(d == a or d.startswith(a + ".") for a in allowed)]
        if module.startswith("p2p_diloco.peers.") and module != "p2p_diloco.peers.launch.demo":
            wrong += [f"{module} -> {d}" for d in deps if d.startswith(("p2p_diloco.tui", "p2p_diloco.sim"))]
    assert wrong == [], "the middle layer's rules in docs/DESIGN.md"


PEERS = [{"identity", "torchrun"}, {"gossip"}, {"admission"}, {"state"}, {"rounds"}, {"reports"},
         {"parts", "opening", "island", "api"}, {"launch"}]
"""The folders (and root modules) of `peers`, by concern, each using only its own and those before it
(docs/DESIGN.md, "Architecture"): the partner's state travels (gossip), is admitted (admission), the
island's own state is kept (state), its rounds run (rounds) and are reported (reports); the facade
(island, api, parts, opening) builds them, and launch runs it as the CLI's process."""
PEERS_ROOT_FILES = 6


def test_peers_is_in_folders_by_concern_each_importing_only_those_before_it():
    def part(module: str) -> int | None:
        name = module.removeprefix("p2p_diloco.peers.").split(".")[0]
        return next((i for i, group in enumerate(PEERS) if name in group), None)

    peers = {m: deps for m, deps in GRAPH.items() if m.startswith("p2p_diloco.peers.")}
    assert all(part(m) is not None for m in peers), [m for m in peers if part(m) is None]
    wrong = [f"{m} -> {d}" for m, deps in peers.items() for d in deps
             if d.startswith("p2p_diloco.peers.") and part(d) > part(m)]
    assert wrong == [], "imports against the order of peers' folders"
    root = [p.name for p in (ROOT / "peers").glob("*.py")]
    assert len(root) <= PEERS_ROOT_FILES, root


def loaded_by(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running `code`."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.timeout(120)
def test_config_does_not_load_torch():
    loaded = loaded_by("from p2p_diloco.config import DiscoveryConfig, ModelConfig, NetworkConfig\n"
                       "from p2p_diloco.sim.config import SimConfig\n"
                       "NetworkConfig(); ModelConfig(size='small').resolved(); SimConfig()\n"
                       "DiscoveryConfig(bootstrap=('tcp://127.0.0.1:7001',))")
    assert "torch" not in loaded and "hivemind" not in loaded


@pytest.mark.timeout(120)
def test_help_loads_neither_torch_nor_zmq():
    loaded = loaded_by("from click.testing import CliRunner\nfrom p2p_diloco.cli import main\n"
                       "assert CliRunner().invoke(main, ['join', '--help']).exit_code == 0")
    assert not {"torch", "zmq", "hivemind", "textual"} & loaded
