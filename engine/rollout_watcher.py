"""Hot-loading adapters: the engine holds exactly the versions the rollout states in Redis
name (stable and canary), loading and unloading them while it serves.

A thread subscribes to the rollouts channel; each announcement names an adapter, whose
state is read and applied. After every (re)subscription it reconciles all adapters, so
an announcement missed while Redis was away is caught up. Loads and unloads run on the
serving thread between two engine steps (`EngineServer.call_between_steps`), so no
request is dropped: one admitted on a version that is unloaded finishes on it.
"""

import logging
import threading

import redis

from common.rollout_keys import RolloutState, RolloutStateError, read_all_rollouts, read_rollout, rollout_channel
from engine.base.errors import EngineError

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 60.0


def adapter_changes(state: RolloutState | None, held_versions: set[str]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """What to load ((version, source, sha256) each) and what to unload (versions) so that
    an adapter's held versions become those its rollout state names."""
    wanted = {}
    if state is not None:
        wanted[state.stable_version] = (state.stable_source, state.stable_sha256)
        if state.has_canary:
            wanted[state.canary_version] = (state.canary_source, state.canary_sha256)
    to_load = [(version, *wanted[version]) for version in sorted(wanted) if version not in held_versions]
    to_unload = sorted(held_versions - set(wanted))
    return to_load, to_unload


class RolloutWatcher:
    def __init__(self, client: redis.Redis, release: str, server, retry_s: float = 1.0):
        self.client = client
        self.release = release
        self.server = server
        self.retry_s = retry_s
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

    def sync(self, adapter: str, state: RolloutState | None) -> None:
        to_load, to_unload = adapter_changes(state, self._held().get(adapter, set()))
        engine = self.server.engine
        for version, source, sha256 in to_load:
            call = self.server.call_between_steps(lambda v=version, s=source, c=sha256: engine.load_adapter(adapter, v, s, c))
            try:
                call.result(timeout=LOAD_TIMEOUT_S)
                log.info("loaded adapter %s@%s from %s", adapter, version, source)
            except EngineError as exc:
                log.error("cannot load adapter %s@%s from %s: %s", adapter, version, source, exc.message)
        for version in to_unload:
            self.server.call_between_steps(lambda v=version: engine.unload_adapter(adapter, v)).result(timeout=LOAD_TIMEOUT_S)
            log.info("unloaded adapter %s@%s", adapter, version)

    def sync_all(self) -> None:
        states = read_all_rollouts(self.client, self.release)
        for adapter in sorted(set(states) | set(self._held())):
            self.sync(adapter, states.get(adapter))

    def _run(self) -> None:
        while not self._stop.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(rollout_channel(self.release))
                self.sync_all()  # after subscribing: nothing announced from now on is missed
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None:
                        continue
                    adapter = message["data"].decode() if isinstance(message["data"], bytes) else str(message["data"])
                    self.sync(adapter, read_rollout(self.client, self.release, adapter))
            except redis.RedisError as exc:
                log.warning("rollout watcher: Redis unreachable (%s); retrying in %.0f s", exc, self.retry_s)
                self._stop.wait(self.retry_s)
            except (RolloutStateError, ValueError) as exc:  # a bad state or name must not stop the watcher
                log.error("rollout watcher: unusable rollout state (%s); reconciling again in %.0f s", exc, self.retry_s)
                self._stop.wait(self.retry_s)
            finally:
                pubsub.close()
