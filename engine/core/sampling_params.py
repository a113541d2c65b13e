"""Per-request sampling parameters and their validation."""

from dataclasses import dataclass

from engine.base.errors import EngineError, ErrorCode

MAX_LOGPROBS = 20
MAX_LOGIT_BIAS_TOKENS = 300  # OpenAI's limit

CONSTRAINT_KINDS = ("json_schema", "regex", "lark")


@dataclass(frozen=True)
class Constraint:
    """What a constrained answer must match (engine/structured/ compiles it): a JSON Schema as
    JSON text, a regex, or a Lark grammar in llguidance's dialect."""

    kind: str
    text: str


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None = none; N >= 0: chosen token plus the top N
    constraint: Constraint | None = None  # None: free text
    presence_penalty: float = 0.0  # OpenAI's, on the answer's tokens
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off; on the prompt's and the answer's tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)

    @property
    def penalised(self) -> bool:
        """Whether logits change before sampling (penalties or biases)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0 or self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int) -> None:
        problems = []
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            problems.append(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (0.0 <= self.temperature <= 100.0) or self.temperature != self.temperature:
            problems.append(f"temperature must be in [0, 100], got {self.temperature!r}")
        if self.top_k < 0:
            problems.append(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not (0 <= self.seed < 2**63):
            problems.append(f"seed must be in [0, 2**63), got {self.seed}")
        bad_ids = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad_ids:
            problems.append(f"stop_token_ids outside the vocabulary [0, {vocab_size}): {bad_ids}")
        if any(not s for s in self.stop):
            problems.append("stop strings must not be empty")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            problems.append(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                problems.append(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            problems.append(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            problems.append(f"logit_bias holds {len(self.logit_bias)} tokens; at most {MAX_LOGIT_BIAS_TOKENS}")
        if any(not 0 <= t < vocab_size or not -100.0 <= b <= 100.0 for t, b in self.logit_bias):
            problems.append(f"logit_bias needs token ids in [0, {vocab_size}) and biases in [-100, 100]")
        if self.constraint is not None and self.constraint.kind not in CONSTRAINT_KINDS:
            problems.append(f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.constraint.kind!r}")
        if problems:
            raise EngineError(ErrorCode.INVALID_ARGUMENT, "; ".join(problems))


@dataclass(frozen=True)
class SampledToken:
    """One token a step sampled for a request, with its logprobs when they were asked for."""

    token_id: int
    logprob: float | None = None  # of the chosen token, when logprobs were asked for
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first
    error: EngineError | None = None  # no token: the request fails (e.g. its constraint does not compile)
