"""Messages waiting to leave a ROUTER socket, one FIFO per peer.

The ROUTER runs with ROUTER_MANDATORY, so a send never drops silently: a peer whose queue
is at its high-water mark raises EAGAIN (its messages wait here, the others go on) and a
peer that has disconnected raises EHOSTUNREACH (its messages are dropped and the caller
learns it is gone)."""

from collections import deque

import zmq


class Outbox:
    def __init__(self, socket: zmq.Socket):
        self.socket = socket
        self._queues: dict[bytes, deque[bytes]] = {}
        self.pending = 0  # messages queued here, over all peers

    def put(self, identity: bytes, payload: bytes) -> None:
        self._queues.setdefault(identity, deque()).append(payload)
        self.pending += 1

    def flush(self) -> list[bytes]:
        """Send what each peer can take now, without blocking; returns the peers that are gone."""
        gone = []
        for identity in list(self._queues):
            queue = self._queues[identity]
            while queue:
                try:
                    self.socket.send_multipart([identity, queue[0]], zmq.NOBLOCK)
                except zmq.Again:
                    break  # this peer is not reading fast enough; try again later
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    gone.append(identity)
                    self.pending -= len(queue)
                    queue.clear()
                    break
                queue.popleft()
                self.pending -= 1
            if not queue:
                del self._queues[identity]
        return gone
