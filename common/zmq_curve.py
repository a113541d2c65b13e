"""CURVE authentication and encryption for the ZMQ sockets between K25's parts.

A release holds one secret key (40 Z85 characters, from a Kubernetes Secret or made by
`k25 up`). Engines and the chunker are CURVE servers with it and admit only clients that
prove they hold it too: a ZAP handler compares the client's public key with the one
derived from the shared secret. The gateway is the client. A pod without the Secret
cannot send an engine a single request, and everything on the wire is encrypted.

One key for both ends, not a server pair and a client pair, because every holder is a
part of the same release that the others trust anyway: the gateway sees all traffic in
clear already, and an engine gains nothing by posing as a gateway to another engine.

During a rotation a process holds a second key (`CurveKeys.others`, from `NEXT_ENV` or
`PREVIOUS_ENV`): a server admits the holders of either and serves with its current key;
a client presents its current key and, when a server's handshake fails, dials it again
with the other key as the server's (`ServerKeyChoice`). So pods of two adjacent steps of
the rotation (docs/operations/security.md) always talk, whichever key each calls current.

The keys never travel as command-line arguments (those show in `ps` and in pod specs):
processes read them from the environment variables named by `ENV`, `NEXT_ENV` and
`PREVIOUS_ENV`."""

import os
from dataclasses import dataclass

import zmq
from zmq.auth.thread import ThreadAuthenticator

ENV = "K25_CURVE_SECRET_KEY"
# the second key of a rotation: the one coming (before the promotion) or the one going (after it)
NEXT_ENV = "K25_CURVE_SECRET_KEY_NEXT"
PREVIOUS_ENV = "K25_CURVE_SECRET_KEY_PREVIOUS"
KEY_CHARS = 40
Z85_ALPHABET = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")
# a client's handshake failed in a way a server holding another key causes (it cannot open the hello)
_WRONG_SERVER_KEY_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


class CurveKeyError(ValueError):
    pass


@dataclass(frozen=True)
class CurveKeys:
    """The key a process serves with and presents (`current`), and the keys of a rotation it
    also admits and tries as a server's (`others`)."""

    current: bytes
    others: tuple[bytes, ...] = ()

    @property
    def public_keys(self) -> tuple[bytes, ...]:
        """The public keys of every key held, the current one first (no repeats)."""
        return tuple(dict.fromkeys(zmq.curve_public(key) for key in (self.current, *self.others)))


def as_keys(keys: "CurveKeys | bytes") -> CurveKeys:
    return keys if isinstance(keys, CurveKeys) else CurveKeys(keys)


def new_secret_key() -> str:
    return zmq.curve_keypair()[1].decode("ascii")


def secret_key_from_env(environ=os.environ) -> bytes | None:
    """The release's secret key, or None when CURVE is off (the variable unset or empty)."""
    value = environ.get(ENV, "").strip()
    return checked_secret_key(value) if value else None


def keys_from_env(environ=os.environ) -> CurveKeys | None:
    """The process's keys: `ENV`'s, and a rotation's second key from `NEXT_ENV` or
    `PREVIOUS_ENV` when set; None when CURVE is off. A second key without a current one is
    refused: it would switch CURVE off for a pod that was meant to rotate."""
    current = secret_key_from_env(environ)
    others = tuple(checked_secret_key(environ[name].strip(), name) for name in (NEXT_ENV, PREVIOUS_ENV)
                   if environ.get(name, "").strip())
    if current is None:
        if others:
            raise CurveKeyError(f"{NEXT_ENV} or {PREVIOUS_ENV} is set but {ENV} is not: a rotation's second key "
                                "needs the current one")
        return None
    return CurveKeys(current, others)


def checked_secret_key(value: str, name: str = ENV) -> bytes:
    if len(value) == KEY_CHARS and set(value) <= Z85_ALPHABET:
        try:
            zmq.curve_public(value.encode("ascii"))
            return value.encode("ascii")
        except (ValueError, zmq.ZMQError):
            pass  # a group of five characters above 2**32
    raise CurveKeyError(f"{name} must be {KEY_CHARS} Z85 characters (a CURVE secret key); "
                        f"got {len(value)} characters that are not one")


class _KeyHolders:
    """ZAP credentials: a client is admitted when its public key is one of the release's."""

    def __init__(self, public_keys: tuple[bytes, ...]):
        self.public_keys = frozenset(public_keys)

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.public_keys


def admit_key_holders(context: zmq.Context, keys: CurveKeys | bytes) -> ThreadAuthenticator:
    """Start the context's ZAP handler; call before a server socket binds, stop it after
    the socket closed. Without a handler a CURVE server would admit any client."""
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback("*", credentials_provider=_KeyHolders(as_keys(keys).public_keys))
    return authenticator


def make_server(socket: zmq.Socket, keys: CurveKeys | bytes) -> None:
    current = as_keys(keys).current
    socket.curve_secretkey = current
    socket.curve_publickey = zmq.curve_public(current)
    socket.curve_server = True


def make_client(socket: zmq.Socket, keys: CurveKeys | bytes, server_public_key: bytes | None = None) -> None:
    """Present the current key; expect the server to hold `server_public_key` (default: the
    current key's)."""
    current = as_keys(keys).current
    public_key = zmq.curve_public(current)
    socket.curve_secretkey = current
    socket.curve_publickey = public_key
    socket.curve_serverkey = server_public_key or public_key


class ServerKeyChoice:
    """Which of its keys a client expects a server to hold: the current one first, and after a
    handshake that failed as a server with another key makes it fail, the next one, in turn.
    Watch the socket's monitor for `EVENTS` and hand each event to `switch`."""

    EVENTS = _WRONG_SERVER_KEY_EVENTS

    def __init__(self, keys: CurveKeys | bytes):
        self.keys = as_keys(keys)
        self.candidates = self.keys.public_keys
        self.index = 0

    @property
    def server_public_key(self) -> bytes:
        return self.candidates[self.index]

    def next_key(self, event: int) -> bytes | None:
        """The server key to dial with after this monitor event; None: keep the one in use."""
        if not event & _WRONG_SERVER_KEY_EVENTS or len(self.candidates) < 2:
            return None
        self.index = (self.index + 1) % len(self.candidates)
        return self.server_public_key

    def switch(self, socket: zmq.Socket, endpoint: str, event: int) -> bool:
        """Dial `endpoint` again expecting the next key when `event` calls for it (True)."""
        key = self.next_key(event)
        if key is None:
            return False
        socket.disconnect(endpoint)
        make_client(socket, self.keys, key)
        socket.connect(endpoint)
        return True
