"""The steps of a CURVE key rotation, as changes to the transport Secret's data.

A release's transport Secret holds the key every part serves with and presents
(`curve-secret-key`) and, during a rotation, one more that every part also admits and tries
as a server's (common/zmq_curve.py):

    step          the Secret holds afterwards            then
    add-next      current A, next B (new)                roll every pod
    promote       current B, previous A                  roll every pod
    remove-old    current B                              roll every pod

Pods of two adjacent steps always talk (a server admits both keys of its own step, and a client
whose server holds the other key dials it again with that one), so a rolling update never
splits the fleet; a step taken before the previous roll finished could (a pod of step 0 and one
of step 2 share no key), hence each step refuses a Secret that is not where it starts from."""

from common.zmq_curve import checked_secret_key
from operators.config import CURVE_NEXT_KEY_KEY, CURVE_PREVIOUS_KEY_KEY, CURVE_SECRET_KEY_KEY

STEPS = ("add-next", "promote", "remove-old")


class RotationError(ValueError):
    """The Secret is not where the step starts from."""


def rotation_step(data: dict[str, str], step: str, new_key: str) -> dict[str, str]:
    """The Secret's data after `step` (`new_key`: the next key, used by add-next only); keys of
    the Secret that are not the CURVE keys stay as they are."""
    current, next_key, previous = (data.get(key) for key in (CURVE_SECRET_KEY_KEY, CURVE_NEXT_KEY_KEY,
                                                              CURVE_PREVIOUS_KEY_KEY))
    if not current:
        raise RotationError(f"the Secret has no {CURVE_SECRET_KEY_KEY}: there is no key to rotate")
    rest = {key: value for key, value in data.items()
            if key not in (CURVE_SECRET_KEY_KEY, CURVE_NEXT_KEY_KEY, CURVE_PREVIOUS_KEY_KEY)}
    if step == "add-next":
        if next_key or previous:
            raise RotationError(f"a rotation is under way (the Secret holds {_second(next_key)}): finish it first")
        checked_secret_key(new_key, CURVE_NEXT_KEY_KEY)
        return {**rest, CURVE_SECRET_KEY_KEY: current, CURVE_NEXT_KEY_KEY: new_key}
    if step == "promote":
        if not next_key:
            raise RotationError(f"nothing to promote: the Secret has no {CURVE_NEXT_KEY_KEY} (run add-next, "
                                "and roll every pod, first)")
        return {**rest, CURVE_SECRET_KEY_KEY: next_key, CURVE_PREVIOUS_KEY_KEY: current}
    if step == "remove-old":
        if not previous:
            raise RotationError(f"nothing to remove: the Secret has no {CURVE_PREVIOUS_KEY_KEY} (run promote, and "
                                "roll every pod, first)")
        return {**rest, CURVE_SECRET_KEY_KEY: current}
    raise RotationError(f"unknown step {step!r}: one of {', '.join(STEPS)}")


def _second(next_key: str | None) -> str:
    return CURVE_NEXT_KEY_KEY if next_key else CURVE_PREVIOUS_KEY_KEY
