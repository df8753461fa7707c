"""`qtts serve`'s upload forms: a voice (`parse_voice_form`; OpenAI's `parse_sample_form`), a consent recording
(`parse_consent_form`), a consent's new label (`parse_consent_update`) and a list's cursor (`parse_list_query`),
each read from its multipart body and checked, every refusal a `schema.RequestError`. Introduced in 18.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .schema import (
    LANGUAGE_TAG,
    MAX_INSTRUCTIONS_CHARS,
    MAX_LABEL_CHARS,
    MAX_LIST,
    NEW_VOICE_PATTERN,
    RequestError,
    shown,
)


@dataclass
class VoiceForm:
    """A voice upload, read and checked as a form (`parse_voice_form`): its name, the clip file's bytes and the
    optional transcript (ICL)."""
    name: str
    audio: bytes
    filename: str | None
    text: str | None


@dataclass
class SampleForm:
    """OpenAI's voice from an audio sample, read and checked as a form (`parse_sample_form`): its name, the clip
    file's bytes and the consent recording's id."""
    name: str
    audio: bytes
    filename: str | None
    consent: str


@dataclass
class ConsentForm:
    """OpenAI's consent recording, read and checked as a form (`parse_consent_form`)."""
    name: str
    language: str
    recording: bytes
    filename: str | None


VOICE_FORM_FIELDS = ("name", "audio", "text")
SAMPLE_FORM_FIELDS = ("name", "audio_sample", "consent", "type")
CONSENT_FORM_FIELDS = ("name", "language", "recording")
PROMPT_REFUSAL = ("this server cannot create a voice from a prompt (type \"prompt\"): it clones a voice from an "
                  "audio sample (type \"audio_sample\", with a consent recording's id)")


async def parse_voice_form(body: bytes, headers) -> VoiceForm:
    """The fields of a `POST /v1/voices` body (multipart/form-data: `name`, the file `audio`, optional `text`), or
    a `RequestError` (400) saying what is wrong. A blank `text` is no transcript."""
    form = await _read_form(body, headers, 2, "a voice upload is a multipart/form-data form with the fields name, "
                                              "audio (the clip file) and text (its transcript, optional)")
    try:
        _only(form, VOICE_FORM_FIELDS)
        name, text = _voice_name(form), form.get("text")
        audio, filename = await _file(form, "audio", "the voice clip")
        if text is not None and not isinstance(text, str):
            raise RequestError(400, "`text` is the clip's transcript, a plain field, not a file", "text")
        if text is not None and len(text) > MAX_INSTRUCTIONS_CHARS:
            raise RequestError(400, f"`text` is over {MAX_INSTRUCTIONS_CHARS} characters", "text")
        return VoiceForm(name, audio, filename, text.strip() if text and text.strip() else None)
    finally:
        await form.close()


async def parse_sample_form(body: bytes, headers) -> SampleForm:
    """The fields of a `POST /v1/audio/voices` body (OpenAI's: multipart/form-data with `name`, the file
    `audio_sample`, `consent` and optional `type`), or a `RequestError` (400). A prompt-designed voice (`type:
    "prompt"`, as a form or as JSON) is refused: this server clones samples only."""
    if headers.get("content-type", "").lower().startswith("application/json"):
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            obj = None
        if isinstance(obj, dict) and obj.get("type") == "prompt":
            raise RequestError(400, PROMPT_REFUSAL, "type", code="prompt_voice_unsupported")
    form = await _read_form(body, headers, 8, "a voice from an audio sample is a multipart/form-data form with the "
                                              "fields name, audio_sample (the clip file), consent (a consent "
                                              "recording's id) and type (audio_sample, optional)")
    try:  # room for a prompt form's fields above: it is refused for what it is
        kind = form.get("type", "audio_sample")
        if kind == "prompt":
            raise RequestError(400, PROMPT_REFUSAL, "type", code="prompt_voice_unsupported")
        if kind != "audio_sample":
            raise RequestError(400, f"`type` {shown(kind)} is not a way to create a voice: audio_sample (the only "
                                    "one this server has) or prompt", "type")
        _only(form, SAMPLE_FORM_FIELDS)
        name, consent = _voice_name(form), form.get("consent")
        if not isinstance(consent, str) or not consent:
            raise RequestError(400, "`consent` is required: the id of a consent recording (POST "
                                    "/v1/audio/voice_consents gives one)", "consent")
        audio, filename = await _file(form, "audio_sample", "the voice clip")
        return SampleForm(name, audio, filename, consent)
    finally:
        await form.close()


async def parse_consent_form(body: bytes, headers) -> ConsentForm:
    """The fields of a `POST /v1/audio/voice_consents` body (OpenAI's: multipart/form-data with `name`, a label,
    `language`, a BCP 47 tag, and the file `recording`), or a `RequestError` (400)."""
    form = await _read_form(body, headers, 2, "a consent recording is a multipart/form-data form with the fields "
                                              "name (a label), language (a BCP 47 tag) and recording (the file)")
    try:
        _only(form, CONSENT_FORM_FIELDS)
        name, language = _label(form.get("name")), form.get("language")
        if not isinstance(language, str) or not re.match(LANGUAGE_TAG, language):
            raise RequestError(400, f"`language` is required: a BCP 47 tag such as en-US (got {shown(language)})",
                               "language")
        recording, filename = await _file(form, "recording", "the consent recording")
        return ConsentForm(name, language, recording, filename)
    finally:
        await form.close()


def parse_consent_update(body: bytes) -> str:
    """The new label in a `POST /v1/audio/voice_consents/{id}` body (OpenAI's: JSON `{"name": ...}`), or a
    `RequestError` (400)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise RequestError(400, "the body is not JSON: a consent recording's update is {\"name\": label}") from None
    if not isinstance(obj, dict) or set(obj) != {"name"}:
        raise RequestError(400, "a consent recording's update is the JSON object {\"name\": label}, nothing else",
                           "name")
    return _label(obj["name"])


def parse_list_query(query) -> tuple[str | None, int]:
    """(after, limit) of a list request's query (OpenAI's cursor: `after` an id, `limit` 1 to MAX_LIST, 20 by
    default), or a `RequestError` (400)."""
    unknown = sorted(set(query) - {"after", "limit"})
    if unknown:
        raise RequestError(400, f"unrecognized query parameter(s): {', '.join(map(repr, unknown))}; valid: after, "
                                "limit", unknown[0])
    limit = query.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= MAX_LIST:
        raise RequestError(400, f"`limit` is a whole number from 1 to {MAX_LIST} (got {shown(limit)})", "limit")
    return query.get("after") or None, int(limit)


async def _read_form(body: bytes, headers, max_fields: int, usage: str):
    """`body` as a multipart form (one file at most, `max_fields` other fields; the caller closes it), or a 400 that
    says what the form holds (`usage`)."""
    from starlette.formparsers import MultiPartException, MultiPartParser

    if not headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise RequestError(400, usage)

    async def stream():
        yield body
        yield b""

    try:
        return await MultiPartParser(headers, stream(), max_files=1, max_fields=max_fields,
                                     max_part_size=MAX_INSTRUCTIONS_CHARS * 4).parse()
    except MultiPartException as e:
        raise RequestError(400, f"the form cannot be read: {e}") from None


def _only(form, fields: tuple[str, ...]) -> None:
    unknown = sorted(set(form) - set(fields))
    if unknown:
        raise RequestError(400, f"unrecognized form field(s): {', '.join(map(repr, unknown))}; valid: "
                                f"{', '.join(fields)}", unknown[0])


def _voice_name(form) -> str:
    """The form's `name`, a new voice's: a safe file stem."""
    name = form.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError(400, "`name` is required: the voice's name (letters, digits, - and _)", "name")
    if not re.match(NEW_VOICE_PATTERN, name):
        raise RequestError(400, f"`name` {shown(name)} is not a voice name: 1 to 64 letters, digits, - and _ "
                                "(starting with a letter or digit)", "name")
    return name


def _label(name) -> str:
    """A consent recording's label: any text that is not blank, MAX_LABEL_CHARS at most."""
    if not isinstance(name, str) or not name.strip():
        raise RequestError(400, "`name` is required: the consent recording's label (text)", "name")
    if len(name) > MAX_LABEL_CHARS:
        raise RequestError(400, f"`name` is over {MAX_LABEL_CHARS} characters", "name")
    return name.strip()


async def _file(form, field: str, what: str) -> tuple[bytes, str | None]:
    """The bytes and file name of the form's file `field` (`what` it holds, for the message), or a 400."""
    from starlette.datastructures import UploadFile

    upload = form.get(field)
    if not isinstance(upload, UploadFile):
        raise RequestError(400, f"`{field}` is required: {what}, sent as a file (wav, flac, ogg or mp3)", field)
    data = await upload.read()
    if not data:
        raise RequestError(400, f"`{field}` is an empty file", field)
    return data, upload.filename
