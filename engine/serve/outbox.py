"""Frames waiting to leave a ROUTER socket, one FIFO per peer.

The ROUTER runs with ROUTER_MANDATORY, so a send never drops silently: a peer whose queue
is at its high-water mark raises EAGAIN (its frames wait here, the others go on) and a
peer that has disconnected raises EHOSTUNREACH (its frames are dropped and the caller
learns it is gone).

The engine server sends one frame per peer per step, each an EngineBatch of any number of
messages, so `pending` counts the messages the waiting frames carry (the caller says how
many each holds), not the frames: a bound on it bounds memory and work held back whatever
the batching, as it did when every message was a frame of its own."""

from collections import deque

import zmq


class Outbox:
    def __init__(self, socket: zmq.Socket):
        self.socket = socket
        self._queues: dict[bytes, deque[tuple[bytes, int]]] = {}
        self.pending = 0  # messages carried by the frames queued here, over all peers
        self.pending_frames = 0

    def put(self, identity: bytes, payload: bytes, messages: int = 1) -> None:
        """Queue one frame for `identity`; `messages` is how many messages it carries."""
        self._queues.setdefault(identity, deque()).append((payload, messages))
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
                    self.pending -= sum(n for _, n in queue)
                    self.pending_frames -= len(queue)
                    queue.clear()
                    break
                queue.popleft()
                self.pending -= messages
                self.pending_frames -= 1
            if not queue:
                del self._queues[identity]
        return gone
