"""CURVE authentication and encryption for the ZMQ sockets between K25's parts.

A release holds one secret key (40 Z85 characters, from a Kubernetes Secret or made by
`k25 up`). Engines and the chunker are CURVE servers with it and admit only clients that
prove they hold it too: a ZAP handler compares the client's public key with the one
derived from the shared secret. The gateway is the client. A pod without the Secret
cannot send an engine a single request, and everything on the wire is encrypted.

One key for both ends, not a server pair and a client pair, because every holder is a
part of the same release that the others trust anyway: the gateway sees all traffic in
clear already, and an engine gains nothing by posing as a gateway to another engine.

The key never travels as a command-line argument (those show in `ps` and in pod specs):
processes read it from the environment variable named by `ENV`."""

import os

import zmq
from zmq.auth.thread import ThreadAuthenticator

ENV = "K25_CURVE_SECRET_KEY"
KEY_CHARS = 40
Z85_ALPHABET = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


class CurveKeyError(ValueError):
    pass


def new_secret_key() -> str:
    return zmq.curve_keypair()[1].decode("ascii")


def secret_key_from_env(environ=os.environ) -> bytes | None:
    """The release's secret key, or None when CURVE is off (the variable unset or empty)."""
    value = environ.get(ENV, "").strip()
    return checked_secret_key(value) if value else None


def checked_secret_key(value: str) -> bytes:
    if len(value) == KEY_CHARS and set(value) <= Z85_ALPHABET:
        try:
            zmq.curve_public(value.encode("ascii"))
            return value.encode("ascii")
        except (ValueError, zmq.ZMQError):
            pass  # a group of five characters above 2**32
    raise CurveKeyError(f"{ENV} must be {KEY_CHARS} Z85 characters (a CURVE secret key); "
                        f"got {len(value)} characters that are not one")


class _KeyHolders:
    """ZAP credentials: a client is admitted when its public key is the shared one."""

    def __init__(self, public_key: bytes):
        self.public_key = public_key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public_key


def admit_key_holders(context: zmq.Context, secret_key: bytes) -> ThreadAuthenticator:
    """Start the context's ZAP handler; call before a server socket binds, stop it after
    the socket closed. Without a handler a CURVE server would admit any client."""
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback("*", credentials_provider=_KeyHolders(zmq.curve_public(secret_key)))
    return authenticator


def make_server(socket: zmq.Socket, secret_key: bytes) -> None:
    socket.curve_secretkey = secret_key
    socket.curve_publickey = zmq.curve_public(secret_key)
    socket.curve_server = True


def make_client(socket: zmq.Socket, secret_key: bytes) -> None:
    public_key = zmq.curve_public(secret_key)
    socket.curve_secretkey = secret_key
    socket.curve_publickey = public_key
    socket.curve_serverkey = public_key
