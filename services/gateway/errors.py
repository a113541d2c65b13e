"""Errors as OpenAI returns them: `{"error": {"message", "type", "param", "code"}}` with the
matching HTTP status, and how each engine error code maps onto one.

What went wrong inside (an engine's INTERNAL message, a Python exception, a traceback) is
logged with the request's id and never sent: the client gets a plain message that quotes
the id."""

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from proto import k25_pb2
from services.gateway.request_id import current_request_id

log = logging.getLogger(__name__)

# seconds a client is told to wait after a 503
RETRY_AFTER_S = 1


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type: str, code: str | None = None, param: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", code, param)


def overloaded(message: str) -> OpenAIError:
    return OpenAIError(503, message, "server_error", "overloaded", headers={"Retry-After": str(RETRY_AFTER_S)})


def rate_limited(message: str, limit: str, retry_after_s: int | None) -> OpenAIError:
    """429 as OpenAI sends it: type "requests" or "tokens", code rate_limit_exceeded. Without a
    wait (the request can never pass the limit) it says so to OpenAI's clients, which then do
    not retry."""
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else {"x-should-retry": "false"}
    return OpenAIError(429, message, limit, "rate_limit_exceeded", headers=headers)


def internal_error(status: int, what: str, code: str, request_id: str | None = None) -> OpenAIError:
    """An error whose cause stays in the log: `what` failed, quote the request id."""
    return OpenAIError(status, f"{what}; {_see_log(request_id or current_request_id())}", "server_error", code)


def _see_log(request_id: str) -> str:
    return f"the gateway's log has the details under request id {request_id}"


# engine error code -> (HTTP status, OpenAI type, OpenAI code)
_ENGINE_ERRORS = {
    k25_pb2.INVALID_ARGUMENT: (400, "invalid_request_error", "invalid_argument"),
    k25_pb2.CHUNK_SIZE_MISMATCH: (502, "server_error", "chunk_size_mismatch"),
    k25_pb2.RESOURCE_EXHAUSTED: (503, "server_error", "overloaded"),
    k25_pb2.ADAPTER_NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    k25_pb2.DEADLINE_EXCEEDED: (504, "server_error", "timeout"),
    k25_pb2.CANCELLED: (503, "server_error", "engine_shutting_down"),
    k25_pb2.INTERNAL: (500, "server_error", "engine_error"),
}

# refusals another engine may not repeat: the request is tried elsewhere before failing
RETRYABLE_ENGINE_ERRORS = {k25_pb2.RESOURCE_EXHAUSTED, k25_pb2.CHUNK_SIZE_MISMATCH, k25_pb2.CANCELLED}


# codes whose message the engine writes for the client
_CLIENT_FACING_ENGINE_ERRORS = {k25_pb2.INVALID_ARGUMENT, k25_pb2.RESOURCE_EXHAUSTED, k25_pb2.DEADLINE_EXCEEDED,
                                k25_pb2.CANCELLED}
# what the client is told instead for the others (their messages name files, hosts, exceptions)
_PLAIN_MESSAGES = {
    k25_pb2.ADAPTER_NOT_FOUND: "the engine chosen for this request does not hold its adapter version",
    k25_pb2.CHUNK_SIZE_MISMATCH: "the engine chosen for this request refused its padding",
}


def from_engine_error(error: k25_pb2.Error) -> OpenAIError:
    status, type_, code = _ENGINE_ERRORS.get(error.code, (500, "server_error", "engine_error"))
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    if error.code in _CLIENT_FACING_ENGINE_ERRORS:
        return OpenAIError(status, error.message or _code_name(error.code), type_, code, headers=headers)
    request_id = current_request_id()
    log.error("request %s: engine error %s on %s: %s", request_id, _code_name(error.code), error.request_id, error.message)
    what = _PLAIN_MESSAGES.get(error.code, "an engine failed on this request")
    return OpenAIError(status, f"{what}; {_see_log(request_id)}", type_, code, headers=headers)


def _code_name(code: int) -> str:
    return k25_pb2.ErrorCode.Name(code) if code in k25_pb2.ErrorCode.values() else str(code)


async def send_error(send, error: OpenAIError) -> None:
    """Answer with `error` from an ASGI middleware, outside FastAPI's exception handlers."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *((name.lower().encode(), value.encode()) for name, value in error.headers.items())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    param = ".".join(location) or None
    return (f"{param}: {message}" if param else message), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return JSONResponse(invalid_request(message, param).body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        error = OpenAIError(exc.status_code, str(exc.detail), type_, headers=getattr(exc, "headers", None))
        return JSONResponse(error.body(), status_code=exc.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        request_id = getattr(request.state, "request_id", None) or current_request_id()
        log.error("request %s (%s %s) failed", request_id, request.method, request.url.path, exc_info=exc)
        error = internal_error(500, "the gateway failed on this request", "internal_error", request_id)
        return JSONResponse(error.body(), status_code=500, headers={"x-request-id": request_id})
