"""Pure conversions between the chunker's protobuf messages and its own types.

proto keeps its names: ChunkRequest.chunk_size is a passage's token budget
(`ChunkParams.passage_tokens`), and each `Chunk` message is one `Passage`."""

from google.protobuf.message import DecodeError

from proto import k25_pb2
from services.chunker.boundaries import ChunkParams, Passage
from services.chunker.chunker import SplitDocument
from services.chunker.errors import ChunkerError, invalid_argument


def decode_request(payload: bytes) -> k25_pb2.ChunkRequest:
    request = k25_pb2.ChunkRequest()
    try:
        request.ParseFromString(payload)
    except (DecodeError, ValueError) as exc:
        raise invalid_argument(f"frame is not a k25.v1.ChunkRequest: {exc}") from None
    if not request.request_id:
        raise invalid_argument("ChunkRequest.request_id is empty")
    return request


def params_of(request: k25_pb2.ChunkRequest, defaults: ChunkParams) -> ChunkParams:
    """The request's parameters; 0 or unset fields take the chunker's defaults."""
    try:
        return ChunkParams(
            passage_tokens=request.chunk_size or defaults.passage_tokens,
            overlap_ratio=request.overlap_ratio if request.HasField("overlap_ratio") else defaults.overlap_ratio,
            semantic_threshold=(
                request.semantic_threshold if request.HasField("semantic_threshold") else defaults.semantic_threshold
            ),
        )
    except ValueError as exc:
        raise invalid_argument(str(exc)) from None


def build_request(
    request_id: str, text: str, passage_tokens: int = 0, overlap_ratio: float | None = None,
    semantic_threshold: float | None = None, traceparent: str = "", tracestate: str = "",
) -> k25_pb2.ChunkRequest:
    """A ChunkRequest; passage_tokens goes in its chunk_size field (0: the chunker's default)."""
    return k25_pb2.ChunkRequest(
        request_id=request_id, text=text, chunk_size=passage_tokens, overlap_ratio=overlap_ratio,
        semantic_threshold=semantic_threshold,
        trace=k25_pb2.TraceContext(traceparent=traceparent, tracestate=tracestate),
    )


def response_of(request_id: str, document: SplitDocument) -> k25_pb2.ChunkResponse:
    return k25_pb2.ChunkResponse(
        request_id=request_id,
        chunks=[k25_pb2.Chunk(**passage.as_dict()) for passage in document.passages],
        total_tokens=document.total_tokens,
    )


def error_response(request_id: str, error: ChunkerError) -> k25_pb2.ChunkResponse:
    code = k25_pb2.ErrorCode.Value(error.code)
    return k25_pb2.ChunkResponse(
        request_id=request_id, error=k25_pb2.Error(request_id=request_id, code=code, message=error.message)
    )


def document_of(response: k25_pb2.ChunkResponse) -> SplitDocument:
    """The passages a response carries; ChunkerError if it carries an error instead."""
    if response.HasField("error"):
        raise ChunkerError(k25_pb2.ErrorCode.Name(response.error.code), response.error.message)
    passages = [Passage(c.start_char, c.end_char, c.start_token, c.end_token, c.anchor) for c in response.chunks]
    return SplitDocument(passages, response.total_tokens)
