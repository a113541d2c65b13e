"""Refuse request bodies over a size limit with 413, before any of it is parsed.

A declared Content-Length over the limit is refused at once; a body sent without one is
read up to the limit and then handed on, so a client cannot get past the limit by
leaving the header out.
"""

from services.gateway.errors import OpenAIError, send_error


class BodySizeLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.max_bytes:
                return await self._refuse(send)
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self._refuse(send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send):
        await send_error(send, OpenAIError(413, f"request body is larger than this gateway's limit of {self.max_bytes} bytes",
                                           "invalid_request_error", "request_too_large"))
