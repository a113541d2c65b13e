"""The connections open on the engine's ROUTER, counted from its socket monitor, so that a
stopping engine can let its peers hang up first.

Why the engine waits: a gateway's DEALER sets ZMQ_IMMEDIATE, and with it libzmq ends the
pipe of a connection that drops without waiting for its unread messages: an answer that has
reached the gateway's socket but that the gateway has not read yet is dropped when the engine
closes right after sending it (a drained engine's last Final, seen as an `engine_lost` stream).
A gateway closes its connection to an engine once the engine has left the registry and none
of its requests there is open, i.e. after it has read every answer; an engine that closes after
that loses nothing."""

import zmq
from zmq.utils.monitor import parse_monitor_message


class ConnectedPeers:
    def __init__(self, socket: zmq.Socket):
        self._socket = socket
        self.events = socket.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)  # poll it to wait for one
        self.count = 0

    def update(self) -> None:
        """Count the connections accepted and dropped since the last call (never blocks)."""
        while True:
            try:
                frames = self.events.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)["event"]
            self.count += 1 if event == zmq.EVENT_ACCEPTED else -1 if event == zmq.EVENT_DISCONNECTED else 0

    def close(self) -> None:
        """Before the socket closes."""
        self._socket.disable_monitor()
        self.events.close(linger=0)
