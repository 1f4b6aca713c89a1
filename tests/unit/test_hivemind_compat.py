"""hivemind's internals that discovery uses are still there (`discovery.hivemind_compat`).

If a hivemind upgrade renames one of them, this fails loudly, naming it, instead of bootstrap
reconnects or the bootstrap's peer log quietly turning off at run time.
"""

from __future__ import annotations

import asyncio
import logging
import re
import types
from pathlib import Path

import pytest
from hivemind.dht.routing import RoutingTable
from hivemind.p2p import P2P
from hivemind.p2p.p2p_daemon_bindings.p2pclient import Client

from p2p_diloco.discovery import hivemind_compat

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_hivemind_has_every_internal_we_use():
    assert hivemind_compat._missing() == []
    hivemind_compat.check()


def test_a_missing_internal_is_named(monkeypatch):
    monkeypatch.delattr(Client, "connect")
    original = P2P.__init__

    def without_client(self):
        original(self)
        del self._client

    monkeypatch.setattr(P2P, "__init__", without_client)
    original_table = RoutingTable.__init__

    def renamed(self, *args, **kwargs):
        original_table(self, *args, **kwargs)
        self.uid_to_peer = self.__dict__.pop("uid_to_peer_id")

    monkeypatch.setattr(RoutingTable, "__init__", renamed)
    with pytest.raises(hivemind_compat.HivemindIncompatible) as e:
        hivemind_compat.check.__wrapped__()
    for name in ("Client.connect", "P2P._client", "RoutingTable.uid_to_peer_id"):
        assert name in str(e.value)
    assert "constraints.txt" in str(e.value)


def test_a_failing_internal_call_warns_once(caplog):
    """A call that breaks at run time (the attribute is gone) logs a WARNING, not a debug line."""
    node = types.SimpleNamespace(protocol=types.SimpleNamespace(p2p=types.SimpleNamespace()))  # no _client
    hivemind_compat._warned.clear()
    with caplog.at_level(logging.WARNING, logger="p2p_diloco.discovery.hivemind_compat"):
        assert asyncio.run(hivemind_compat.dial(node, "peer", [])) is False
        assert asyncio.run(hivemind_compat.dial(node, "peer", [])) is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "P2P._client.connect" in warnings[0].message
    with pytest.raises(hivemind_compat.HivemindIncompatible):
        hivemind_compat.routing_table_peers(types.SimpleNamespace(protocol=types.SimpleNamespace()))


def test_an_unreachable_peer_is_not_an_api_change(caplog):
    async def refuse(peer_id, maddrs):
        raise ConnectionRefusedError("nobody there")

    node = types.SimpleNamespace(protocol=types.SimpleNamespace(p2p=types.SimpleNamespace(
        _client=types.SimpleNamespace(connect=refuse))))
    with caplog.at_level(logging.DEBUG, logger="p2p_diloco.discovery.hivemind_compat"):
        assert asyncio.run(hivemind_compat.dial(node, "peer", [])) is False
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("path", ["p2p_diloco/discovery/dht.py", "bootstrap/node.py"])
def test_hivemind_internals_are_reached_only_through_the_adapter(path):
    source = re.sub(r"\bcompat\.\w+", "", (ROOT / path).read_text())  # the adapter's own functions
    used = re.findall(r"\._client\b|uid_to_peer_id|routing_table|call_ping|RESERVED_SUBKEYS|\.serializer\b|"
                      r"PUBLIC_KEY_REGEX|\bnode\.(?:p2p|protocol)\b", source)
    assert used == [], f"{path} reaches into hivemind directly: {used}"
