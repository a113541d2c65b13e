"""Frames waiting to leave a ROUTER socket, one FIFO per peer.

The ROUTER runs with ROUTER_MANDATORY, so a send never drops silently: a peer whose queue
is at its high-water mark raises EAGAIN (its frames wait here, the others go on) and a
peer that has disconnected raises EHOSTUNREACH (its frames are dropped and the caller
learns it is gone).

The engine server sends one frame per peer per step, each an EngineBatch of any number of
messages, so `pending` counts the messages the waiting frames carry (the caller says how
many each holds), not the frames: a bound on it bounds memory and work held back whatever
the batching, as it did when every message was a frame of its own. A peer whose own waiting
frames carry a bound's worth is dropped as one that stopped reading (`drop_stalled`): one hung
gateway cannot hold the engine's steps back for every other."""

from collections import deque

import zmq


class Outbox:
    def __init__(self, socket: zmq.Socket):
        self.socket = socket
        self._queues: dict[bytes, deque[tuple[bytes, int]]] = {}
        self._pending_by_peer: dict[bytes, int] = {}
        self.pending = 0  # messages carried by the frames queued here, over all peers
        self.pending_frames = 0

    def put(self, identity: bytes, payload: bytes, messages: int = 1) -> None:
        """Queue one frame for `identity`; `messages` is how many messages it carries."""
        self._queues.setdefault(identity, deque()).append((payload, messages))
        self._pending_by_peer[identity] = self._pending_by_peer.get(identity, 0) + messages
        self.pending += messages
        self.pending_frames += 1

    def flush(self) -> list[bytes]:
        """Send what each peer can take now, without blocking; returns the peers that are gone."""
        gone = []
        for identity in list(self._queues):
            queue = self._queues[identity]
            while queue:
                payload, messages = queue[0]
                try:
                    self.socket.send_multipart([identity, payload], zmq.NOBLOCK)
                except zmq.Again:
                    break  # this peer is not reading fast enough; try again later
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    gone.append(identity)
                    self._drop(identity)
                    break
                queue.popleft()
                self._pending_by_peer[identity] -= messages
                self.pending -= messages
                self.pending_frames -= 1
            if identity in self._queues and not queue:
                del self._queues[identity]
                del self._pending_by_peer[identity]
        return gone

    def drop_stalled(self, limit: int) -> list[bytes]:
        """Drop the frames of every peer whose waiting frames carry `limit` messages or more; returns them."""
        stalled = [identity for identity, pending in self._pending_by_peer.items() if pending >= limit]
        for identity in stalled:
            self._drop(identity)
        return stalled

    def _drop(self, identity: bytes) -> None:
        queue = self._queues.pop(identity)
        self.pending -= self._pending_by_peer.pop(identity)
        self.pending_frames -= len(queue)
