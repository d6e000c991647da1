"""OpenAI's request bodies (the subset a ReDrafter engine can honour) and its error body.

Fields a client may send but this server cannot honour are accepted only at their neutral value, so a
request never silently gets something other than what it asked for (``n > 1``: greedy ReDrafter
verification yields one sequence; log probabilities are not returned by the entry model). Unknown
fields are ignored, as OpenAI's API does for fields it does not know. ``min_tokens`` is an extension
(vLLM's name for it): benchmarks use it to make every request generate exactly ``max_tokens``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator


class ApiError(Exception):
    """An error reported in OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error(exc: ValidationError) -> ApiError:
    """The first problem of a pydantic error, named by its JSON path (OpenAI reports one ``param``)."""
    err = exc.errors()[0]
    param = ".".join(str(p) for p in err["loc"]) or None
    message = err["msg"].removeprefix("Value error, ")
    return ApiError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    user: str | None = None
    min_tokens: int | None = Field(default=None, ge=0)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported: ReDrafter's greedy verification produces one sequence")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, v: Any, info: ValidationInfo) -> Any:
        if v is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return v

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens


def _neutral(name: str, value: Any, neutral: tuple[Any, ...]) -> Any:
    if value not in neutral:
        raise ValueError(f"{name} is not supported by this server")
    return value


class CompletionRequest(_Request):
    """POST /v1/completions."""

    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request (a batch of prompts is not supported)")
            v = v[0]
        if not v:
            raise ValueError("prompt must not be empty")
        return v

    @field_validator("echo", "logprobs", "best_of", "suffix")
    @classmethod
    def _unsupported(cls, v: Any, info: ValidationInfo) -> Any:
        return _neutral(str(info.field_name), v, (None, False, 1) if info.field_name == "best_of" else (None, False))

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id... reach the template as given

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it: content as one string."""
        out = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            out["content"] = "".join(p.text for p in self.content)
        elif self.content is None:
            out["content"] = ""
        return out


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[Any, Any]] | None = None
    response_format: dict[Any, Any] | None = None

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _unsupported(cls, v: Any, info: ValidationInfo) -> Any:
        return _neutral(str(info.field_name), v, (None, False))

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: Any) -> Any:
        if v:
            raise ValueError("tools are not supported by this server")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if v and v.get("type") != "text":
            raise ValueError("only response_format type 'text' is supported")
        return v

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
