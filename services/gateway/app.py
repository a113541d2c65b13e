"""The gateway's HTTP API: OpenAI-compatible completions, models, health and metrics."""

import contextlib
import time

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.gateway.admission import AdmissionMiddleware
from services.gateway.api_keys import ApiKeys, ApiKeysFile, Caller
from services.gateway.body_limit import BodySizeLimit
from services.gateway.disconnect import unless_client_leaves
from services.gateway.document_routes import install_document_routes
from services.gateway.errors import install_error_handlers
from services.gateway.graceful_stop import Drain, RefuseWhileDraining
from services.gateway.openai_schema import (
    ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, ErrorResponse, ModelList,
)
from services.gateway.request_id import RequestIdMiddleware
from services.gateway.service import Gateway
from services.gateway.structured_request import constraint_refused, plan_structured
from services.gateway.tracing_middleware import TracingMiddleware

STARTED_AT = int(time.time())

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 502, 503, 504)}


def create_app(gateway: Gateway, api_keys: ApiKeys | ApiKeysFile | None = None, drain: Drain | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await gateway.start()
        yield
        await gateway.stop()

    app = FastAPI(
        title="K25 gateway", version="0.1.0", lifespan=lifespan,
        description="OpenAI-compatible API in front of K25's engine pools.",
        # our own middleware traces requests: its span lasts until a stream's last event
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    install_error_handlers(app)
    s = gateway.settings
    app.add_middleware(BodySizeLimit, max_bytes=s.max_body_bytes, read_timeout_s=s.body_timeout_s,
                       max_bytes_in_flight=s.max_body_bytes_in_flight, gauge=gateway.metrics.body_bytes_in_flight)
    # before the body is read: the key, the in-flight limits (admission.py)
    app.add_middleware(AdmissionMiddleware, admission=gateway.admission, api_keys=api_keys)
    app.add_middleware(RefuseWhileDraining, drain=drain or Drain())  # before any work (graceful_stop.py)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(TracingMiddleware)  # added last: the outermost, so its span covers everything

    def caller(request: Request) -> Caller:
        return request.state.caller  # AdmissionMiddleware checked the key

    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses=_ERRORS)
    async def chat_completions(request: Request, body: ChatCompletionRequest, caller: Caller = Depends(caller)):
        ticket = request.state.ticket
        ticket.reserve(body.reserved_tokens(gateway.settings.default_max_tokens))  # before any tokenising
        plan = plan_structured(body, gateway.tokenizer.chat_template)
        if plan.constraint is not None:
            why = await gateway.grammars.check(plan.constraint)
            if why is not None:
                raise constraint_refused(plan.constraint_param, why)
        prompt_ids = await gateway.encoder.encode_chat(plan.messages, **plan.template_kwargs)
        job = gateway.make_job(body, prompt_ids, caller, "chatcmpl")
        if plan.constraint is not None:
            job.sampling.constraint.CopyFrom(plan.constraint)
        ticket.use(len(job.prompt_token_ids) + job.sampling.max_tokens)
        return await unless_client_leaves(request, gateway.complete(body, job, True, request.state.span, plan.tool_names))

    @app.post("/v1/completions", response_model=Completion, responses=_ERRORS)
    async def completions(request: Request, body: CompletionRequest, caller: Caller = Depends(caller)):
        ticket = request.state.ticket
        ticket.reserve(body.reserved_tokens(gateway.settings.default_max_tokens))  # before any tokenising
        prompt = body.prompt
        prompt_ids = await gateway.encoder.encode(prompt) if isinstance(prompt, str) else list(prompt)
        job = gateway.make_job(body, prompt_ids, caller, "cmpl")
        ticket.use(len(job.prompt_token_ids) + job.sampling.max_tokens)
        return await unless_client_leaves(request, gateway.complete(body, job, False, request.state.span))

    install_document_routes(app, gateway, caller)

    @app.get("/v1/models", response_model=ModelList, responses=_ERRORS)
    async def models(caller: Caller = Depends(caller)):
        names = [n for n in gateway.served_models() if n == gateway.settings.model_name or caller.may_use(n.partition("@")[0])]
        return ModelList(data=[{"id": name, "created": STARTED_AT} for name in names])

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        """Whether this gateway can serve: it answers, and its settings, tokenizer and engine
        connections are in place. Engines are not asked for: a request with none waits for one
        (a pool starting from zero), and a gateway left out of its Service could not receive
        the demand that starts them."""
        registry = gateway.registry
        routable = [e for e in registry.engines if e.routable]
        pools = {name: {"chunk_size": pool.chunk_size, "engines": sum(e.pool == name for e in routable)}
                 for name, pool in sorted(registry.pools.items())}
        body = {
            "ready": gateway.started,
            "engines": len(routable),
            "unroutable_engines": len(registry.engines) - len(routable),  # unhealthy or draining
            "pools": pools,
            "redis": {True: "ok", False: "unreachable: routing with the last-known registry", None: "not read yet"}[
                registry.redis_ok
            ],
        }
        return JSONResponse(body, status_code=200 if gateway.started else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app

