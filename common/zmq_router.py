"""The ROUTER socket every K25 service listens on, with its high-water marks, linger and,
when the release has a CURVE key, authentication."""

import zmq
from zmq.auth.thread import ThreadAuthenticator

from common.zmq_curve import CurveKeys, admit_key_holders, make_server

# the longest frame a K25 server takes by default: a long-document prompt is a few MiB of token ids
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024


def tcp_endpoint(host: str, port: int) -> str:
    """tcp://host:port, with an IPv6 address in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def bind_router(context: zmq.Context, host: str, port: int, sndhwm: int, rcvhwm: int, linger_ms: int,
                options: dict[int, int] | None = None, curve_secret_key: CurveKeys | bytes | None = None,
                ) -> tuple[zmq.Socket, int, ThreadAuthenticator | None]:
    """A ROUTER bound to tcp://host:port (port 0: any free one; host an IPv4 or IPv6 address, or
    * for every IPv4 interface); returns it, its port and, with a CURVE key, the ZAP handler
    that admits only the holders of its keys (stop it after closing the socket, before terminating
    the context). A failed bind closes all three before it raises."""
    authenticator = admit_key_holders(context, curve_secret_key) if curve_secret_key else None
    socket = context.socket(zmq.ROUTER)
    defaults = {zmq.SNDHWM: sndhwm, zmq.RCVHWM: rcvhwm, zmq.LINGER: linger_ms, zmq.IPV6: int(":" in host)}
    for option, value in {**defaults, **(options or {})}.items():
        socket.setsockopt(option, value)
    if curve_secret_key:
        make_server(socket, curve_secret_key)
    try:
        socket.bind(tcp_endpoint(host, port))
    except zmq.ZMQError:
        socket.close(linger=0)
        if authenticator:
            authenticator.stop()
        context.term()
        raise
    return socket, int(socket.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1]), authenticator
