"""Hot-loading adapters: the engine holds exactly the versions the rollout states in Redis
name (stable and canary), loading and unloading them while it serves.

A thread subscribes to the rollouts channel; each announcement names an adapter, whose
state is read and applied. After every (re)subscription it reconciles all adapters, so
an announcement missed while Redis was away is caught up.

Only an announcement followed by no state is a deletion (common/rollout_keys.py): a
reconcile that finds no state for an adapter it holds leaves that adapter loaded, since a
Redis that restarted empty, or lost its keys, is no order to unload every adapter. (A
deletion missed while Redis was away is therefore caught up only by that adapter's next
announcement or a restart; no gateway splits traffic onto an adapter without a rollout.)

An adapter whose name or state in Redis breaks the contract (a malformed member of the rollout
index, found by a reconcile or announced) is skipped: logged when it first is, counted in
`k25_engine_unusable_rollout_states`, and it keeps the versions it holds; every other adapter
loads as its state says.

A version's files are read, hashed and parsed on this thread; only registering the result
runs on the serving thread, between two engine steps (`EngineServer.call_between_steps`), so
no request is dropped and no step waits for a disk: one admitted on a version that is
unloaded finishes on it. A load that fails is tried again by a reconcile, and anything
unexpected (logged with its traceback) restarts the subscription; both wait a delay that
doubles from `retry_s` up to `max_retry_s` while the trouble lasts.
"""

import logging
import threading
import time
from concurrent.futures import CancelledError

import redis

from common.rollout_keys import RolloutState, RolloutStateError, read_each_rollout, read_rollout, rollout_channel
from engine.base.errors import EngineError

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 60.0


def adapter_changes(state: RolloutState | None, held_versions: set[str]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """What to load ((version, source, sha256) each) and what to unload (versions) so that
    an adapter's held versions become those its rollout state names (None: it was deleted)."""
    wanted = {}
    if state is not None:
        wanted[state.stable_version] = (state.stable_source, state.stable_sha256)
        if state.has_canary:
            wanted[state.canary_version] = (state.canary_source, state.canary_sha256)
    to_load = [(version, *wanted[version]) for version in sorted(wanted) if version not in held_versions]
    to_unload = sorted(held_versions - set(wanted))
    return to_load, to_unload


class RolloutWatcher:
    def __init__(self, client: redis.Redis, release: str, server, retry_s: float = 1.0, max_retry_s: float = 30.0):
        self.client = client
        self.release = release
        self.server = server
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self._delay = retry_s  # the wait before the next retry: doubles while trouble lasts
        self.unusable: dict[str, str] = {}  # adapter (index member) -> why its rollout state is unusable
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _held(self) -> dict[str, set[str]]:
        held: dict[str, set[str]] = {}
        for key in self.server.engine.adapter_keys:
            name, _, version = key.partition("@")
            held.setdefault(name, set()).add(version)
        return held

    def sync(self, adapter: str, state: RolloutState | None, deleted: bool = False) -> bool:
        """Make the adapter's held versions those `state` names; without a state, unload them only
        when the rollout was `deleted` (announced, then gone). False if a version failed to load."""
        held = self._held().get(adapter, set())
        if state is None and not deleted:
            if held:
                log.warning("rollout watcher: Redis holds no rollout state for adapter %s; keeping %s loaded until "
                            "a deletion is announced", adapter, ", ".join(sorted(held)))
            return True
        to_load, to_unload = adapter_changes(state, held)
        engine = self.server.engine
        loaded_all = True
        for version, source, sha256 in to_load:
            try:
                read = engine.read_adapter(adapter, version, source, sha256)
                self.server.call_between_steps(lambda r=read: engine.install_adapter(r)).result(timeout=LOAD_TIMEOUT_S)
                log.info("loaded adapter %s@%s from %s", adapter, version, source)
            except EngineError as exc:
                log.error("cannot load adapter %s@%s from %s: %s", adapter, version, source, exc.message)
                loaded_all = False
        for version in to_unload:
            self.server.call_between_steps(lambda v=version: engine.unload_adapter(adapter, v)).result(timeout=LOAD_TIMEOUT_S)
            log.info("unloaded adapter %s@%s", adapter, version)
        return loaded_all

    def sync_all(self) -> bool:
        """Reconcile every adapter with its state; False if a version failed to load. A malformed
        member of the rollout index costs only its own adapter, which keeps what it holds."""
        states, broken = read_each_rollout(self.client, self.release)
        self._set_unusable(broken)
        held = set(self._held()) - set(broken)
        results = [self.sync(adapter, states.get(adapter)) for adapter in sorted(set(states) | held)]
        return all(results)

    def sync_announced(self, data) -> bool:
        """Apply one announcement (the adapter's name); False if a version failed to load. An
        announced name or state that breaks the contract is skipped like a malformed index member:
        logged, counted, and the adapter keeps what it holds until a good state is announced."""
        try:
            adapter = data.decode() if isinstance(data, bytes) else str(data)
            state = read_rollout(self.client, self.release, adapter)
        except (UnicodeDecodeError, RolloutStateError) as exc:
            name = repr(data) if isinstance(exc, UnicodeDecodeError) else adapter
            self._set_unusable({**self.unusable, name: str(exc)})
            return True
        self._set_unusable({name: why for name, why in self.unusable.items() if name != adapter})
        return self.sync(adapter, state, deleted=True)

    def _set_unusable(self, unusable: dict[str, str]) -> None:
        """Log each adapter whose rollout state is unusable when it first is, and count them in the
        engine's metrics."""
        for member, why in unusable.items():
            if member not in self.unusable:
                log.error("rollout watcher: skipping adapter %r, its rollout state is unusable: %s", member, why)
        self.unusable = unusable
        self.server.metrics.unusable_rollout_states.set(len(unusable))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except redis.RedisError as exc:
                log.warning("rollout watcher: Redis unreachable (%s); retrying in %g s", exc, self._delay)
            except CancelledError:  # the server closed while a load or unload waited for it: the engine is stopping
                return
            except Exception:
                log.exception("rollout watcher: unexpected error; it goes on, subscribing again in %g s", self._delay)
            if self._stop.wait(self._delay):
                return
            self._delay = min(self._delay * 2, self.max_retry_s)

    def _watch(self) -> None:
        """Subscribe, reconcile, then apply announcements until stopped; raises on trouble."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(rollout_channel(self.release))
            reconcile_at: float | None = 0.0  # now, after subscribing: nothing announced from now on is missed
            load_delay = self.retry_s
            while not self._stop.is_set():
                if reconcile_at is not None and time.monotonic() >= reconcile_at:
                    if self.sync_all():
                        reconcile_at, load_delay, self._delay = None, self.retry_s, self.retry_s
                    else:
                        log.info("rollout watcher: trying the failed loads again in %g s", load_delay)
                        reconcile_at = time.monotonic() + load_delay
                        load_delay = min(load_delay * 2, self.max_retry_s)
                message = pubsub.get_message(timeout=0.5)
                if message is None:
                    continue
                if not self.sync_announced(message["data"]) and reconcile_at is None:
                    reconcile_at = time.monotonic() + load_delay
        finally:
            pubsub.close()
