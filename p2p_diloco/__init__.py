"""p2p-diloco: peer-to-peer DiLoCo training with gossip over ZeroMQ and discovery over a DHT.

The Python API: `p2p_diloco.join(model, optimizer, ...)` makes a model and its inner optimizer an
island of a swarm (`p2p_diloco.peers.api`); the config sections are `p2p_diloco.DiLoCoConfig`,
`NetworkConfig`, `DiscoveryConfig` and `IslandConfig`.

Kept import-light on purpose: `p2p-diloco --help` and the dashboard must not pay for torch, so the
API is loaded on first use.

Three packages live beside this one in the source tree and install under its name (`pyproject.toml`,
`package-dir`): `peers/`, `tui/` and `bootstrap/`. Run from a source checkout without installing
(`PYTHONPATH=.`), `_SourceTree` finds them there, after any installed copy.
"""

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"
_TOP_LEVEL = {"p2p_diloco.peers": "peers", "p2p_diloco.tui": "tui", "p2p_diloco.bootstrap": "bootstrap"}
_ROOT = Path(__file__).resolve().parent.parent


class _SourceTree(importlib.abc.MetaPathFinder):
    """Finds `p2p_diloco.peers`, `.tui` and `.bootstrap` in a source checkout (the last finder asked)."""

    def find_spec(self, fullname, path=None, target=None):
        folder = _TOP_LEVEL.get(fullname)
        if folder is None or not (_ROOT / folder / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, _ROOT / folder / "__init__.py",
                                                      submodule_search_locations=[str(_ROOT / folder)])


if (_ROOT / "pyproject.toml").is_file() and not any(isinstance(f, _SourceTree) for f in sys.meta_path):
    sys.meta_path.append(_SourceTree())

_LAZY = {"join": "p2p_diloco.peers.api", "SwarmIsland": "p2p_diloco.peers.island",
         "DiLoCoConfig": "p2p_diloco.config", "NetworkConfig": "p2p_diloco.config",
         "DiscoveryConfig": "p2p_diloco.config", "IslandConfig": "p2p_diloco.config", "LogConfig": "p2p_diloco.tracking"}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'p2p_diloco' has no attribute {name!r}")
