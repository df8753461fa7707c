"""`qtts serve`'s API as data, and its HTTP parsing: pydantic models of the speech request and of every JSON answer,
the OpenAPI document built from them (served at /openapi.json), the body read within its limit (`read_body`) and
checked into a `Speech` (`parse_speech`) or, for a voice upload, a `VoiceForm` (`parse_voice_form`; OpenAI's forms:
`parse_sample_form` for a voice, `parse_consent_form` for a consent recording), every refusal an OpenAI-style error
(`RequestError`). Introduced in 18.

The models check what a request means on its own (types, lengths, the format, the sampling ranges of
`pipeline.sampling.Sampling`); what depends on the loaded checkpoint (does this voice, language or model exist, can
it follow `instructions`) `parse_speech` checks after them against the `Served` checkpoint, known only at run time.
Validation is strict, as JSON is typed: `"5"` is not a number, `2.0` is not a whole number, `NaN` is no number.
Imported only when serving (pydantic is in the serve extra).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ...audio.encode import FORMATS
from ...audio.tempo import MAX_SPEED, MIN_SPEED
from ...audio.wav import SAMPLE_RATE
from ...errors import InputError
from ...pipeline.sampling import Sampling

MAX_BODY_BYTES = 64 * 1024
REF_AUDIO_FIELD = b'"ref_audio"'  # a speech body that names it among its first MAX_BODY_BYTES may be as large as an
#                                  upload (MAX_UPLOAD_BYTES): it carries a voice clip
BODY_TIMEOUT = 10.0      # seconds a request body may send nothing before it is dropped (408)
BODY_DEADLINE_TIMES = 12  # ... and the whole body must come within this many of them (a trickle is dropped too)
MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # a voice upload: a minute of 48 kHz stereo 16-bit wav fits (15 s are used)
MAX_INPUT_CHARS = 4096   # OpenAI's limit for `input`
MAX_INSTRUCTIONS_CHARS = 4096
VOICE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # a built-in speaker or a file stem in --voices, never a path
NEW_VOICE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # an uploaded voice's name: a safe file stem
MAX_LABEL_CHARS = 256  # a consent recording's label
LANGUAGE_TAG = r"^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*$"  # BCP 47, as a consent recording's language is given
MAX_LIST = 100           # OpenAI's list endpoints: `limit` from 1 to 100, 20 by default
SEED_HEADER = "X-Seed"   # every speech answer says the seed it sampled with
STREAM_FORMATS = ("audio", "sse")
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # what OpenAI clients send: all mean the loaded model
# OpenAI's built-in voices, as its SDK lists them (openai.types.audio.speech_create_params.Voice): each speaks a voice
# this server has (`--voice-alias NAME=VOICE`, else the default voice), unless a voice of that name exists
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
                 "marin", "cedar")
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "greedy")
ResponseFormat = Literal[tuple(FORMATS)]  # one list of formats: the encoder's


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must hold more than white space")
    return text


class VoiceRef(BaseModel):
    """OpenAI's form of a custom voice in a speech request: `{"id": ID}`, ID the voice's OpenAI id (`voice_...`, from
    `POST /v1/audio/voices`) or its name (the same voice as `"NAME"`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(pattern=VOICE_PATTERN, description="The voice's id from POST /v1/audio/voices, or its name.")


class SpeechRequest(BaseModel):
    """The body of `POST /v1/audio/speech`: OpenAI's fields, then the sampling parameters of `Sampling` (missing
    ones take the checkpoint's generation_config, so the server samples as the reference does)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    input: Annotated[str, AfterValidator(_not_blank)] = Field(
        min_length=1, max_length=MAX_INPUT_CHARS, description="The text to speak; a long one is spoken segment by "
                                                              "segment with short pauses.")
    voice: Annotated[str, Field(pattern=VOICE_PATTERN)] | VoiceRef | None = Field(
        None, description="A built-in speaker (CustomVoice checkpoints), the NAME of NAME.wav in --voices (Base "
                          "checkpoints), or `design` (VoiceDesign); also as OpenAI's object `{\"id\": ID}`, ID a "
                          "voice's id from POST /v1/audio/voices or its NAME; OpenAI's voice names (alloy, ...) speak "
                          "the voice --voice-alias gives them, else the default voice. GET /v1/audio/voices lists "
                          "them. Required unless `ref_audio` is given (which then speaks instead).")

    model: str | None = Field(None, description="The served checkpoint's name, or one of "
                                                f"{', '.join(OPENAI_MODELS)} (all mean it).")
    response_format: ResponseFormat = Field("mp3", description="mp3 (the default, as OpenAI's), opus (Ogg Opus), aac "
                                            "(ADTS), flac, wav (16-bit, length unknown) or pcm (16-bit "
                                            "little-endian); all 24 kHz mono, streamed as generated.")
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED, description="Tempo, at the same pitch (FFmpeg's atempo): "
                         "0.5 takes twice as long, 2.0 half; applied piece by piece as the audio streams.")
    language: str = Field("auto", max_length=64, description="A language of the checkpoint, or auto.")
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS,
                                     description="A style for a speaker (1.7B CustomVoice) or the voice itself "
                                                 "(VoiceDesign); other checkpoints refuse it with a 400.")
    stream_format: Literal[STREAM_FORMATS] = Field(
        "audio", description="audio: the bytes of `response_format`, chunked; sse: server-sent events, each "
                             "`speech.audio.delta` holding the next bytes of `response_format` in base64, then one "
                             "`speech.audio.done` with the usage (input text tokens, output audio frames).")
    temperature: float | None = Field(None, gt=0, description="Talker temperature.")
    top_k: int | None = Field(None, ge=0, description="Talker top-k (0: off).")
    top_p: float | None = Field(None, gt=0, le=1, description="Talker top-p.")
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = Field(None, ge=0, description="Seeds the sampling: equal seeds give equal audio, bit for "
                             "bit. Unset: a fresh seed for every request; the answer's X-Seed header says which, so "
                             "any take can be replayed.")
    greedy: bool | None = Field(None, description="Argmax decoding instead of sampling.")
    ref_audio: str | None = Field(None, min_length=1, description="A voice clip sent with the request (Base "
                                  "checkpoints): a wav, flac, ogg or mp3 file in base64, or a `data:` URI holding "
                                  "one; checked as an uploaded clip is (POST /v1/voices), its voice built once and "
                                  "kept in a small cache by the clip's hash. The body may then be as large as an "
                                  "upload.")
    ref_text: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS, description="What `ref_audio` says: the "
                                 "voice then clones in ICL mode (else from the x-vector alone).")

    @property
    def voice_name(self) -> str | None:
        """The voice asked for, given as a name or as `{"id": ...}` (a name, or an id `parse_speech` resolves)."""
        return self.voice if isinstance(self.voice, str) or self.voice is None else self.voice.id


REQUEST_FIELDS = tuple(SpeechRequest.model_fields)
HINTS = {"speed": f"speed is a number from {MIN_SPEED} to {MAX_SPEED} (1.0: as generated)",
         "voice": "voice is a voice's name (letters, digits, '.', '-' and '_'; GET /v1/voices lists them) or "
                  "OpenAI's object {\"id\": id or name}",
         "stream_format": f"stream_format is one of {', '.join(STREAM_FORMATS)}"}


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


class VoiceInfo(BaseModel):
    """One voice of `GET /v1/voices`."""
    name: str = Field(description="What a speech request's `voice` names.")
    builtin: bool = Field(description="The checkpoint's own (a CustomVoice speaker, VoiceDesign's `design`): it "
                                      "cannot be deleted.")
    mode: Literal["speaker", "design", "xvector", "icl"] = Field(
        description="speaker: built in; design: described by `instructions`; xvector or icl: cloned from a clip "
                    "(icl: with its transcript).")
    error: str | None = Field(None, description="Why a clip in the voices folder cannot be used (requests for it "
                                                "get this in a 400).")
    id: str | None = Field(None, description="Its OpenAI voice id (`voice_...`) when it was made through POST "
                                             "/v1/audio/voices: a speech request's `{\"id\": ...}`.")


class VoiceList(BaseModel):
    voices: list[VoiceInfo]


class VoiceCreated(VoiceInfo):
    """The answer to `POST /v1/voices` (201)."""
    seconds: float = Field(description="The clip's length as used (a long clip without a transcript is trimmed).")
    messages: list[str] = Field(description="What the clip checks said: notes (converted, trimmed), warnings "
                                            "(clipped).")


class VoiceDeleted(BaseModel):
    deleted: str


class AudioVoice(BaseModel):
    """OpenAI's `Voice`: the answer to `POST /v1/audio/voices`. Its `id` names it in a speech request
    (`{"id": ...}`), as its `name` does."""
    id: str
    object: Literal["audio.voice"] = "audio.voice"
    created_at: int = Field(description="Unix time, in seconds.")
    name: str
    type: Literal["audio_sample"] = "audio_sample"


class AudioVoiceDeleted(BaseModel):
    """The answer to `DELETE /v1/audio/voices/{voice_id}` (OpenAI's `VoiceDeleted`)."""
    id: str
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"
    deleted: bool = True


class ListedVoice(VoiceInfo):
    """One voice of `GET /v1/audio/voices`: `VoiceInfo`, and the names that speak it too."""
    id: str = Field(description="Its OpenAI voice id (`voice_...`) where it has one, else its name: either names it "
                                "in a speech request's `voice`.")
    object: Literal["audio.voice"] = "audio.voice"
    aliases: list[str] = Field(description="Other names a speech request may give for it: --voice-alias's, and "
                                           "OpenAI's voice names (alloy, ...) for the default voice.")
    default: bool = Field(description="Whether OpenAI's voice names speak it when no --voice-alias says otherwise.")


class ListedVoices(BaseModel):
    """The answer to `GET /v1/audio/voices`: every voice a speech request may name, as an OpenAI list."""
    object: Literal["list"] = "list"
    data: list[ListedVoice]


class VoiceConsent(BaseModel):
    """OpenAI's consent recording: what `POST /v1/audio/voices` names as its `consent`."""
    id: str
    object: Literal["audio.voice_consent"] = "audio.voice_consent"
    created_at: int = Field(description="Unix time, in seconds.")
    name: str = Field(description="The label it was given.")
    language: str = Field(description="The BCP 47 tag of the consent phrase's language.")


class VoiceConsentList(BaseModel):
    """A page of consent recordings, oldest first (OpenAI's cursor page: the next one starts `after` `last_id`)."""
    object: Literal["list"] = "list"
    data: list[VoiceConsent]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VoiceConsentDeleted(BaseModel):
    id: str
    object: Literal["audio.voice_consent"] = "audio.voice_consent"
    deleted: bool = True


class Usage(BaseModel):
    input_tokens: int = Field(description="The input's text tokens (the model's BPE).")
    output_tokens: int = Field(description="Audio frames generated (12.5 a second, 16 codes each).")
    total_tokens: int


class SpeechAudioDelta(BaseModel):
    """A server-sent event of a `stream_format: "sse"` answer (OpenAI's), as `data: {...}`."""
    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str = Field(description="The next bytes of the answer in `response_format`, base64; joined, the deltas "
                                   "are the body `stream_format: \"audio\"` sends.")


class SpeechAudioDone(BaseModel):
    """The last event of a `stream_format: "sse"` answer."""
    type: Literal["speech.audio.done"] = "speech.audio.done"
    usage: Usage


class Health(BaseModel):
    status: Literal["ok", "error"] = Field("ok", description="error: the engine stopped (answered 503)")
    error: str | None = Field(None, description="Why the engine stopped (its failure, or the watchdog's reason).")
    model: str
    busy: bool = Field(description="A request is being spoken.")
    speaking: int = Field(description="Requests the batch has admitted (at most max_batch), from their first segment "
                                      "to their last.")
    batch: int = Field(description="Utterances in the batch now.")
    max_batch: int
    largest_batch: int = Field(description="The widest batch seen.")
    waiting: int = Field(description="Requests that hold a place and wait for the batch to admit them (as "
                                     "qtts_queue_depth).")
    held: int = Field(0, description="Speaking requests whose text waits for their client to read its audio.")
    refused: int = Field(0, description="Requests answered 503 for want of a place, since the start.")
    streams: int = Field(0, description="Requests spoken at once: as many as keep real time (--admit realtime), or "
                                        "every place (--admit all).")
    served: int = Field(description="Requests spoken to the end.")
    auth: bool = Field(description="Whether /v1/ needs a bearer token (--api-key).")


class RequestError(Exception):
    """A request the server refuses: its HTTP status, an OpenAI-style error body and headers (Retry-After)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Served:
    """What a request is checked against: the served checkpoint (`server.Engine.served`)."""
    model_id: str
    kind: str
    size: str | None
    languages: list[str]
    speakers: list[str]
    follows_instructions: bool
    sampling: Sampling


@dataclass
class Speech:
    """A speech request, read and checked: what the engine speaks (its sampling resolved: the seed it will use is
    known before any work) and how the answer is encoded and sent. `voice` is None where the request brings its
    own clip, `ref_audio` (base64 or a `data:` URI, decoded by `refs.RefVoices`), with its transcript `ref_text`."""
    text: str
    format: str
    language: str
    voice: str | None
    sampling: Sampling
    instructions: str | None
    speed: float = 1.0
    stream_format: str = "audio"
    ref_audio: str | None = None
    ref_text: str | None = None


async def read_body(request, limit: int = MAX_BODY_BYTES, timeout: float = BODY_TIMEOUT,
                    clip: int | None = None) -> bytes:
    """The request's body, refused (413) past `limit` bytes before it is read: at once from its Content-Length,
    else as soon as the bytes read pass it. With `clip` (a speech request, which may carry `ref_audio`), a body that
    holds REF_AUDIO_FIELD within its first `limit` bytes may go on to `clip` bytes (an upload's limit); any other
    is refused as it passes `limit`. A body that sends nothing for `timeout` seconds, or has not all come
    after BODY_DEADLINE_TIMES of them, is dropped: a 408 that closes the connection (a stalled client holds no
    connection, and none of uvicorn's places, for longer)."""
    import asyncio

    most = max(limit, clip or 0)
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > most):
        raise RequestError(413, _over(limit, clip) if length.isdigit() else
                           "the Content-Length header is not a number")
    body = bytearray()
    chunks = request.stream().__aiter__()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout * BODY_DEADLINE_TIMES
    while True:
        wait = min(timeout, deadline - loop.time())
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), max(wait, 0.0))
        except StopAsyncIteration:
            break
        except TimeoutError:
            why = f"sent nothing for {timeout:g} s" if wait >= timeout else \
                f"did not all come within {timeout * BODY_DEADLINE_TIMES:g} s"
            raise RequestError(408, f"the request body {why}: dropped", code="body_timeout",
                               headers={"Connection": "close"}) from None
        body += chunk
        if len(body) > limit and not (clip and REF_AUDIO_FIELD in body[:limit] and len(body) <= clip):
            raise RequestError(413, _over(limit, clip))
    return bytes(body)


def _over(limit: int, clip: int | None) -> str:
    return f"request body over {limit} bytes" + (f" ({clip} with `ref_audio`, named among the first {limit})"
                                                 if clip else "")


def parse_speech(body: bytes, served: Served, voices: list[str], ids: dict[str, str] | None = None,
                 aliases: dict[str, str] | None = None) -> Speech:
    """The speech request in `body`, validated (`SpeechRequest`, then against the `served` checkpoint and its
    `voices`; `{"id": ...}` that names no voice is looked up in `ids`, {OpenAI voice id: name}, and a name of no
    voice in `aliases`, {name: voice}, `Voices.aliases`); a `RequestError` (4xx) for anything wrong. With
    `ref_audio` the request's `voice` is not looked up: the clip speaks (the SDK needs a `voice` all the same)."""
    try:
        obj = json.loads(body)
    except RecursionError:
        raise RequestError(400, "the body is nested too deeply to be a speech request") from None
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "the body is not JSON") from None
    if not isinstance(obj, dict):
        raise RequestError(400, "the body must be a JSON object")
    try:
        req = SpeechRequest.model_validate(obj)
    except ValidationError as e:
        raise RequestError(400, *first_error(e)) from None
    if req.model is not None and req.model not in (served.model_id, *OPENAI_MODELS):
        raise RequestError(404, f"the model {req.model!r} does not exist here; this server speaks "
                                f"{served.model_id!r} (also accepted: {', '.join(OPENAI_MODELS)})", "model",
                           code="model_not_found")
    instructions = (req.instructions or "").strip() or None
    if instructions and not served.follows_instructions:
        raise RequestError(400, f"this checkpoint ({served.kind}, {served.size}) cannot follow `instructions`: "
                                "Base checkpoints clone a voice and 0.6B CustomVoice ones ignore style prompts; the "
                                "1.7B CustomVoice and VoiceDesign checkpoints follow them", "instructions")
    if req.ref_audio is not None and served.kind != "base":
        raise RequestError(400, f"this checkpoint ({served.kind.replace('_', ' ')}) cannot clone `ref_audio`: it has "
                                "no speaker encoder (the part of a Base checkpoint that makes a voice from a clip); "
                                + ("it speaks the voice `instructions` describe" if served.kind == "voice_design"
                                   else "it speaks its built-in speakers (GET /v1/audio/voices)"), "ref_audio",
                           code="cannot_clone")
    if req.language.lower() not in served.languages:
        raise RequestError(400, f"unknown language {shown(req.language)}; valid: {', '.join(served.languages)}",
                           "language")
    voice = None if req.ref_audio is not None else _voice(req, served, voices, ids or {}, aliases or {})
    given = {k: getattr(req, k) for k in SAMPLING_FIELDS if getattr(req, k) is not None}
    try:
        sampling = served.sampling.replace(**given).resolve()  # no seed: this request's fresh one
    except InputError as e:
        raise RequestError(400, str(e), next(iter(given), None)) from None
    return Speech(req.input, req.response_format, req.language.lower(), voice, sampling, instructions,
                  float(req.speed), req.stream_format, req.ref_audio, (req.ref_text or "").strip() or None)


def _voice(req: SpeechRequest, served: Served, voices: list[str], ids: dict[str, str],
           aliases: dict[str, str]) -> str:
    """The voice a request without `ref_audio` names: by name, by OpenAI id, or through an alias; a 400 for none."""
    asked = voice = req.voice_name
    if req.ref_text is not None:
        raise RequestError(400, "`ref_text` is the transcript of `ref_audio`, which the request does not give",
                           "ref_text")
    if voice is None:
        raise RequestError(400, "`voice` is required (or a clip in `ref_audio`)", "voice")
    if isinstance(req.voice, VoiceRef) and voice not in voices:
        voice = ids.get(voice, voice)
    if voice not in voices and voice.lower() not in served.speakers:
        voice = aliases.get(voice, voice)
    if voice not in voices and voice.lower() not in served.speakers:
        speaks = f" (what {asked!r} speaks: --voice-alias, --default-voice)" if voice != asked else ""
        raise RequestError(400, f"unknown voice {shown(voice)}{speaks}; valid: "
                                f"{', '.join(voices) or '(none: pass --voices DIR)'}", "voice")
    return voice



def shown(v) -> str:
    """A value for an error message, short and printable whatever it is."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def first_error(e: ValidationError) -> tuple[str, str]:
    """(message, param) for a request pydantic refused: unknown fields all named, else the first problem."""
    errors = e.errors(include_url=False)
    unknown = sorted(str(x["loc"][0]) for x in errors if x["type"] == "extra_forbidden" and len(x["loc"]) == 1)
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
