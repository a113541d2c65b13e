"""A random id for every HTTP request: sent back in the `x-request-id` header, written in the
gateway's log lines about the request, and quoted in error messages so that a client's report
can be matched with the log. It is also how an anonymous request is placed in a canary split.
"""

import contextvars
import uuid

_current: contextvars.ContextVar[str] = contextvars.ContextVar("k25_request_id", default="")

HEADER = b"x-request-id"


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex


def current_request_id() -> str:
    """The id of the HTTP request being served; outside one, a fresh id."""
    return _current.get() or new_request_id()


class RequestIdMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = new_request_id()
        # each HTTP request runs in its own task (a context of its own): no reset needed, and the
        # id stays readable by the outermost error handler after an exception
        _current.set(request_id)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (HEADER, request_id.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)
