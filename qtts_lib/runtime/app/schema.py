"""`qtts serve`'s API as data: pydantic models of the speech request and of every JSON answer, the OpenAPI document
built from them (served at /openapi.json), and pydantic's validation errors turned into OpenAI-style 400s.
Introduced in 14.

The models check what a request means on its own (types, lengths, the format, the sampling ranges of
`pipeline.sampling.Sampling`); what depends on the loaded checkpoint (does this voice, language or model exist, can
it follow `instructions`) `server.Engine.parse` checks after them, since the checkpoint is only known at run time.
Validation is strict, as JSON is typed: `"5"` is not a number, `2.0` is not a whole number, `NaN` is no number.
Imported only when serving (pydantic is in the serve extra).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ..audio.encode import FORMATS
from ..audio.wav import SAMPLE_RATE

MAX_INPUT_CHARS = 4096   # OpenAI's limit for `input`
MAX_INSTRUCTIONS_CHARS = 4096
VOICE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # a built-in speaker or a file stem in --voices, never a path
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # what OpenAI clients send: all mean the loaded model
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "greedy")
ResponseFormat = Literal[tuple(FORMATS)]  # one list of formats: the encoder's


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must hold more than white space")
    return text


class SpeechRequest(BaseModel):
    """The body of `POST /v1/audio/speech`: OpenAI's fields, then the sampling parameters of `Sampling` (missing
    ones take the checkpoint's generation_config, so the server samples as the reference does)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    input: Annotated[str, AfterValidator(_not_blank)] = Field(
        min_length=1, max_length=MAX_INPUT_CHARS, description="The text to speak; a long one is spoken segment by "
                                                              "segment with short pauses.")
    voice: str = Field(pattern=VOICE_PATTERN, description="A built-in speaker (CustomVoice checkpoints), the NAME of "
                       "NAME.wav in --voices (Base checkpoints), or `design` (VoiceDesign). GET /v1/models lists them.")
    model: str | None = Field(None, description="The served checkpoint's name, or one of "
                                                f"{', '.join(OPENAI_MODELS)} (all mean it).")
    response_format: ResponseFormat = Field("wav", description="mp3, opus (Ogg Opus), aac (ADTS), flac, wav (16-bit, "
                                            "length unknown) or pcm (16-bit little-endian); all 24 kHz mono, "
                                            "streamed as generated.")
    speed: float = Field(1.0, ge=1.0, le=1.0, description="Only 1.0.")
    language: str = Field("auto", max_length=64, description="A language of the checkpoint, or auto.")
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS,
                                     description="A style for a speaker (1.7B CustomVoice) or the voice itself "
                                                 "(VoiceDesign); other checkpoints refuse it with a 400.")
    stream_format: Literal["audio"] = Field("audio", description="Only audio (no server-sent events).")
    temperature: float | None = Field(None, gt=0, description="Talker temperature.")
    top_k: int | None = Field(None, ge=0, description="Talker top-k (0: off).")
    top_p: float | None = Field(None, gt=0, le=1, description="Talker top-p.")
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = Field(None, ge=0, description="Seeds the sampling: equal seeds give equal audio.")
    greedy: bool | None = Field(None, description="Argmax decoding instead of sampling.")


REQUEST_FIELDS = tuple(SpeechRequest.model_fields)
HINTS = {"speed": "only speed 1.0 is supported", "stream_format": "only stream_format 'audio' is supported"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: every 4xx and 5xx answer has this shape, so OpenAI's SDKs raise their own errors."""

    error: ErrorDetail


class ModelCapabilities(BaseModel):
    kind: Literal["base", "custom_voice", "voice_design"]
    clone: bool = Field(description="Base checkpoints clone the voices in --voices.")
    speakers: list[str]
    languages: list[str]
    voices: list[str]
    instructions: bool = Field(description="Whether `instructions` is followed.")
    formats: list[str]
    aliases: list[str]
    sample_rate: int = SAMPLE_RATE


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "qtts"
    qtts: ModelCapabilities


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    busy: bool = Field(description="A request is being spoken.")
    speaking: int = Field(description="Requests in progress.")
    batch: int = Field(description="Utterances in the batch now.")
    max_batch: int
    largest_batch: int = Field(description="The widest batch seen.")
    waiting: int = Field(description="Requests queued beside the batch.")
    served: int = Field(description="Requests spoken to the end.")
    auth: bool = Field(description="Whether /v1/ needs a bearer token (--api-key).")


def first_error(e: ValidationError) -> tuple[str, str]:
    """(message, param) for a request pydantic refused: unknown fields all named, else the first problem."""
    errors = e.errors(include_url=False)
    unknown = sorted(str(x["loc"][0]) for x in errors if x["type"] == "extra_forbidden")
    if unknown:
        return (f"unrecognized request argument(s): {', '.join(map(repr, unknown))}; valid: "
                f"{', '.join(REQUEST_FIELDS)}", unknown[0])
    x = errors[0]
    field = str(x["loc"][0]) if x["loc"] else None
    if x["type"] == "missing":
        return f"`{field}` is required", field
    if x["type"] == "string_unicode":
        return f"`{field}` is not valid Unicode text (it holds a lone surrogate)", field
    msg = x["msg"].removeprefix("Value error, ")
    got = repr(x["input"])
    got = got if len(got) <= 60 else got[:57] + "..."
    return f"{HINTS.get(field, f'`{field}`: {msg}')} (got {got})", field


def openapi(model_id: str, voices: list[str], languages: list[str], auth: bool) -> dict:
    """The OpenAPI 3.1 document of this server (its schemas from the models above; this server's voices and
    languages as examples)."""
    from pydantic.json_schema import models_json_schema

    models = [SpeechRequest, ErrorResponse, ModelList, Health]
    _, defs = models_json_schema([(m, "validation" if m is SpeechRequest else "serialization") for m in models],
                                 ref_template="#/components/schemas/{model}")
    schemas = defs["$defs"]
    schemas["SpeechRequest"]["properties"]["voice"]["examples"] = voices
    schemas["SpeechRequest"]["properties"]["language"]["examples"] = languages
    ref = lambda name: {"$ref": f"#/components/schemas/{name}"}  # noqa: E731
    error = lambda why: {"description": why, "content": {"application/json": {"schema": ref("ErrorResponse")}}}  # noqa: E731
    audio = {f.content_type: {"schema": {"type": "string", "format": "binary"}} for f in FORMATS.values()}
    secured = {"security": [{"bearer": []}]} if auth else {}
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "qtts serve", "version": "1", "description": f"Qwen3-TTS on ncnn, serving {model_id}: "
                 "OpenAI's speech API, streamed."},
        "paths": {
            "/v1/audio/speech": {"post": {
                "operationId": "createSpeech", "summary": "Speak text, streamed as it is generated",
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref("SpeechRequest")}}},
                "responses": {"200": {"description": "The audio, chunked (header X-Sample-Rate: 24000)",
                                      "content": audio},
                              "400": error("Invalid request"), "401": error("Missing or wrong API key"),
                              "404": error("Unknown model"), "413": error("Body too large"),
                              "503": error("Batch and queue full: retry later")}, **secured}},
            "/v1/models": {"get": {"operationId": "listModels", "summary": "The served checkpoint and what it can do",
                                   "responses": {"200": {"description": "One model", "content": {
                                       "application/json": {"schema": ref("ModelList")}}},
                                       "401": error("Missing or wrong API key")}, **secured}},
            "/health": {"get": {"operationId": "health", "summary": "Liveness and the batch in flight",
                                "responses": {"200": {"description": "Healthy", "content": {
                                    "application/json": {"schema": ref("Health")}}}}}},
            "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics (text format)",
                                 "responses": {"200": {"description": "Metrics", "content": {
                                     "text/plain": {"schema": {"type": "string"}}}}}, **secured}},
            "/": {"get": {"operationId": "page", "summary": "A page to try the voices",
                          "responses": {"200": {"description": "HTML", "content": {
                              "text/html": {"schema": {"type": "string"}}}}}}},
        },
        "components": {"schemas": schemas},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
