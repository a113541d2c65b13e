"""The ROUTER socket every K25 service listens on, with its high-water marks and linger."""

import zmq


def bind_router(context: zmq.Context, host: str, port: int, sndhwm: int, rcvhwm: int, linger_ms: int,
                options: dict[int, int] | None = None) -> tuple[zmq.Socket, int]:
    """A ROUTER bound to tcp://host:port (port 0: any free one); returns it and its port.
    A failed bind closes the socket and the context before it raises."""
    socket = context.socket(zmq.ROUTER)
    for option, value in {zmq.SNDHWM: sndhwm, zmq.RCVHWM: rcvhwm, zmq.LINGER: linger_ms, **(options or {})}.items():
        socket.setsockopt(option, value)
    try:
        socket.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError:
        socket.close(linger=0)
        context.term()
        raise
    return socket, int(socket.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
