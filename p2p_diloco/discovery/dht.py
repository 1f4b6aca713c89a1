"""Membership over the hivemind DHT: signed, checked island records under one key per run.

With `dhtnode` (the node itself: starting it, joining through it), the only module of `p2p_diloco`
that imports hivemind. It follows hivemind's
`ProgressTracker`: every island stores its `IslandRecord` under `"{run_id}.islands"` with its RSA
owner key as subkey and an expiration `expiry` seconds ahead, re-stores it every `refresh` seconds
from a background thread, and stores `None` on a clean leave. Two validators guard the key on
every node that knows the run:

- `RSASignatureValidator`: a subkey that carries an owner key can only be written with that key's
  signature, so no peer can overwrite another's record;
- `IslandRecordValidator`: the run's key holds only owner-key subkeys with tombstones or records
  that `IslandRecord.from_dict` accepts (the record's one validator, shared with the ZeroMQ
  fallback), whose `peer_id` is the fingerprint of the subkey they sit under.

A bootstrap node does not know which runs will use it, so it checks signatures only; readers
re-validate whatever they fetch, and drop a node's copy that holds anything malformed.

With a swarm secret the value is `{"sealed": BLOB}` (`sealing`): nodes check its shape only, and
readers open it, then check it as above, dropping (and counting) one entry that does not open,
never a node's whole copy. hivemind's internals are reached only through `hivemind_compat`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.logging import use_hivemind_log_handler

from p2p_diloco import addresses
from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery import hivemind_compat as compat
from p2p_diloco.discovery.dhtnode import reconnect_with, start_dht, try_bootstrap
from p2p_diloco.discovery.membership import BackgroundMembership
from p2p_diloco.discovery.patience import Patiently
from p2p_diloco.discovery.records import IslandRecord, fingerprint
from p2p_diloco.discovery.sealing import HIDDEN, RecordSeal, SealRefused, check_sealed, is_sealed
from p2p_diloco.errors import DiscoveryError

logger = logging.getLogger(__name__)
use_hivemind_log_handler("nowhere")  # hivemind logs go to the root logger, so -v governs them too

MIN_STORE_GAP = 0.5
"""Seconds between two stores caused by `announce` (a burst of announces is coalesced)."""
GET_TIMEOUT = 15.0
"""A DHT read or store that has not finished after this long is given up."""
DHT_ALIVE_CHECK_S = 0.1
"""While waiting on the DHT process, check this often that it still runs."""
def islands_key(run_id: str) -> str:
    """The DHT key that holds one run's island records."""
    return f"{run_id}.islands"


class IslandRecordValidator(RecordValidatorBase):
    """hivemind's record check for one run's key, by the record's own validator.

    Under `islands_key(run_id)` a node accepts only dictionary entries whose subkey carries an
    owner key (so `RSASignatureValidator` applies) and whose value is a tombstone, a record that
    `IslandRecord.from_dict` accepts, with the `peer_id` that is the subkey's fingerprint, or a
    sealed record of bounded size (opened, and checked so, by readers that hold the secret). Other
    keys pass: a node of this run shares the DHT with other runs. Runs after the signature check
    (priority 0, below its 10), so it sees the value with the signature stripped.
    """

    def __init__(self, run_id: str) -> None:
        self._key = DHTID.generate(source=islands_key(run_id)).to_bytes()

    def validate(self, record: DHTRecord) -> bool:
        if record.key != self._key:
            return True
        if record.subkey in compat.reserved_subkeys():
            return False  # a plain value where the run keeps a dictionary of records
        try:
            subkey = compat.serializer().loads(record.subkey)
            value = compat.serializer().loads(record.value)
            if not (isinstance(subkey, bytes) and _OWNER_KEY_RE.search(subkey)):
                return False
            if is_sealed(value):
                check_sealed(value)  # a node need not hold the secret: the shape is all it can check
            else:
                owned_record(subkey, value)
            return True
        except (DiscoveryError, TypeError, ValueError) as e:
            logger.debug("refused a record under the run's key: %s", e)
            return False


def owned_record(subkey: Any, value: Any) -> IslandRecord | None:
    """The record stored under an owner subkey (None for a tombstone); `DiscoveryError` when it is
    malformed or its `peer_id` is not the fingerprint of the subkey. Nodes check records with it
    before they store them, readers again after they fetch them."""
    if value is None:
        return None
    record = IslandRecord.from_dict(value)
    if not isinstance(subkey, bytes) or record.peer_id != fingerprint(subkey):
        raise DiscoveryError(f"record peer_id {record.peer_id!r} is not the fingerprint of its owner key")
    return record


_OWNER_KEY_RE = re.compile(compat.owner_key_pattern())


def make_validators(run_id: str, private_key: RSAPrivateKey | None = None) -> list:
    """The record check of the run's key plus RSA signatures (with `private_key` for own records)."""
    return [IslandRecordValidator(run_id), RSASignatureValidator(private_key)]


class DhtMembership(BackgroundMembership):
    """The membership of one run kept in a hivemind DHT (see the module docstring).

    The background thread never waits on the DHT: stores, reads and bootstrap pings are issued as
    futures on their own schedules, so a slow or dead peer delays none of the others. The view
    merges what each read returns, newest entry per subkey; an entry leaves the view when its
    expiration passes or a newer tombstone arrives, never because one read missed it.
    """

    kind = "dht"

    def __init__(self, config: DiscoveryConfig, *, observer: bool = False, patiently: Patiently | None = None) -> None:
        """`patiently`: how an island keeps trying its bootstrap nodes (`patience.keep_trying`); with it
        the DHT node starts once, alone, and every try goes through it. Without it (an observer), one
        try of `connect_timeout` s, as the node starts."""
        compat.check()
        super().__init__(config, observer)
        self._key = islands_key(config.run_id)
        self._seal = RecordSeal(config.secret, config.run_id, self.kind, observer)
        private_key = RSAPrivateKey()
        validators = make_validators(config.run_id, private_key)
        self._subkey = validators[1].local_public_key
        self._peer_id = fingerprint(self._subkey)
        self._maddrs = addresses.dht_multiaddrs(config.bootstrap)
        if observer and not self._maddrs:
            raise DiscoveryError("watching a run needs at least one bootstrap multiaddr")
        joins_later = patiently is not None and bool(self._maddrs)
        self.dht = start_dht(initial_peers=[] if joins_later else self._maddrs, host=config.host, port=config.port,
                             timeout=config.connect_timeout, announce_host=config.announce_host, validators=validators,
                             client_mode=observer or config.outbound_only)  # outbound-only: serves no DHT requests
        if joins_later:
            try:
                patiently(partial(try_bootstrap, self.dht, self._maddrs, config.connect_timeout))
            except BaseException:
                self.dht.shutdown()
                raise
        self.libp2p_peer_id = str(self.dht.peer_id)
        """The DHT node's libp2p id (not the island's peer id, which is the fingerprint of its record key)."""
        # asked now, because from here on only the background thread talks to the DHT process
        self._visible_maddrs = [str(m) for m in self.dht.get_visible_maddrs()]
        self._wake = threading.Event()
        self._full_requested = False
        self._entries: dict[bytes, tuple[Any, float]] = {}
        """subkey -> (record, None for a tombstone or `HIDDEN` for a sealed record we cannot open,
        expiration), the newest seen."""
        self._start("dht-membership")
        logger.info("joined run %r over the DHT as %s (observer=%s)", config.run_id, self._peer_id, observer)

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def visible_maddrs(self) -> list[str]:
        """This island's own DHT multiaddrs (another island may bootstrap from them)."""
        return list(self._visible_maddrs)

    def _live_records(self) -> dict[str, IslandRecord]:
        now = get_dht_time()
        return {rec.peer_id: rec for rec, exp in self._entries.values() if isinstance(rec, IslandRecord) and exp > now}

    def sealed_hidden(self) -> int:
        now = get_dht_time()
        with self._lock:
            return sum(1 for rec, exp in self._entries.values() if rec is HIDDEN and exp > now)

    def refused_records(self) -> int:
        return self._seal.refused

    def _kick(self) -> None:
        self._wake.set()

    def _request_poll(self) -> int:
        self._full_requested = True
        return 1 + (self._pending_get is not None)  # a read already in flight may predate the request

    def _after_stop(self) -> None:
        self.dht.shutdown()

    # -- background thread -------------------------------------------------------------------

    _pending_get: Any = None

    def _issue(self, future: Any) -> Any:
        future.add_done_callback(lambda _f: self._wake.set())
        return future

    def _store(self, value: Any) -> Any:
        exp = get_dht_time() + self.config.expiry
        return self._issue(self.dht.store(self._key, value, exp, subkey=self._subkey, return_future=True))

    def _merge(self, found: Any) -> None:
        """Fold one read into the view: the newest entry per subkey wins; then drop what expired."""
        fresh: dict[bytes, tuple[Any, float]] = {}
        if found is not None and isinstance(found.value, dict):
            for subkey, item in found.value.items():
                try:
                    value = self._seal.unwrap(item.value)
                    fresh[subkey] = (value if value is HIDDEN else owned_record(subkey, value), item.expiration_time)
                except SealRefused:
                    continue  # counted and logged (now and then) by the seal
                except (DiscoveryError, TypeError) as e:
                    logger.info("ignoring an island record: %s", e)
        now = get_dht_time()
        with self._lock:
            for subkey, (record, exp) in fresh.items():
                if subkey not in self._entries or exp >= self._entries[subkey][1]:
                    self._entries[subkey] = (record, exp)
            self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
            self._polls += 1
            self._poll_done.notify_all()
        self._log_view()

    def _run(self) -> None:
        cfg = self.config
        last_store = last_poll = last_full = last_reconnect = float("-inf")
        store = reconnect = None
        while not self._stop.is_set():
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                record, dirty, leave = self._record, self._dirty, self._leave_requested
            if store is not None and store.done():
                if store.exception() is not None or not store.result():
                    logger.info("storing the own record reached no DHT node; retrying at the next refresh")
                store = None
            if leave:
                ok = self._wait(self._store(None), "storing the tombstone")
                with self._lock:
                    self._left, self._leave_requested = True, False
                self._left_event.set()
                logger.info("left run %r (tombstone stored: %s)", cfg.run_id, bool(ok))
            elif record is not None and not self._left and store is None and (
                    (dirty and now - last_store >= MIN_STORE_GAP) or now - last_store >= cfg.refresh):
                with self._lock:
                    self._dirty = False
                store, last_store = self._store(self._seal.wrap(record.to_dict())), now
            if self._maddrs and now - last_reconnect >= cfg.refresh and (reconnect is None or reconnect.done()):
                reconnect = self._issue(self.dht.run_coroutine(reconnect_with(self._maddrs), return_future=True))
                last_reconnect = now
            get = self._pending_get
            if get is not None and get[0].done():
                self._pending_get = None
                if get[0].exception() is not None:
                    logger.info("a DHT read failed: %s", get[0].exception())
                self._merge(None if get[0].exception() is not None else get[0].result())
            elif get is not None and now - get[1] > GET_TIMEOUT:
                logger.info("a DHT read took over %.0f s; starting a new one", GET_TIMEOUT)
                self._pending_get = None
            if self._pending_get is None and (self._full_requested or now - last_poll >= cfg.poll):
                full = self._full_requested or now - last_full >= cfg.refresh
                self._full_requested = False
                self._pending_get = (self._issue(self.dht.get(self._key, latest=full, return_future=True)), now)
                last_poll, last_full = now, now if full else last_full
            # sleep until the next thing is due; a finishing future wakes the thread early
            due = [last_poll + cfg.poll if self._pending_get is None else self._pending_get[1] + GET_TIMEOUT]
            if record is not None and store is None:
                due.append(last_store + (MIN_STORE_GAP if self._dirty else cfg.refresh))
            if self._maddrs and (reconnect is None or reconnect.done()):
                due.append(last_reconnect + cfg.refresh)
            self._wake.wait(timeout=max(0.01, min(due) - time.monotonic()))

    def _wait(self, future: Any, what: str) -> Any:
        """The future's result, or None when it fails, times out, or the DHT process is gone (a
        signal to the whole process group stops it too: waiting on it would only hold up the exit)."""
        deadline = time.monotonic() + GET_TIMEOUT
        while True:
            try:
                return future.result(timeout=DHT_ALIVE_CHECK_S)
            except FutureTimeout:
                if not self.dht.is_alive():
                    logger.info("%s: the DHT process has stopped", what)
                    return None
                if time.monotonic() >= deadline:
                    logger.info("%s: no answer within %.0f s", what, GET_TIMEOUT)
                    return None
            except Exception as e:
                logger.info("%s failed: %s: %s", what, type(e).__name__, e)
                return None
