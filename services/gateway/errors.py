"""Errors as OpenAI returns them: `{"error": {"message", "type", "param", "code"}}` with the
matching HTTP status, and how each engine error code maps onto one."""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from proto import k25_pb2

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


def from_engine_error(error: k25_pb2.Error) -> OpenAIError:
    status, type_, code = _ENGINE_ERRORS.get(error.code, (500, "server_error", "engine_error"))
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return OpenAIError(status, error.message or k25_pb2.ErrorCode.Name(error.code), type_, code, headers=headers)


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
