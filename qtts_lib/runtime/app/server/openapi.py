"""`qtts serve`'s OpenAPI 3.1 document (served at /openapi.json), built from `schema`'s pydantic models.
Introduced in 18.
"""
from __future__ import annotations

from ...audio.encode import FORMATS
from .schema import (
    LANGUAGE_TAG,
    MAX_INSTRUCTIONS_CHARS,
    MAX_LABEL_CHARS,
    MAX_LIST,
    NEW_VOICE_PATTERN,
    SEED_HEADER,
    AudioVoice,
    AudioVoiceDeleted,
    ErrorResponse,
    Health,
    ListedVoices,
    ModelList,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
    VoiceConsent,
    VoiceConsentDeleted,
    VoiceConsentList,
    VoiceCreated,
    VoiceDeleted,
    VoiceList,
)


def openapi(model_id: str, voices: list[str], languages: list[str], auth: bool) -> dict:
    """The OpenAPI 3.1 document of this server (its schemas from the models above; this server's voices and
    languages as examples)."""
    from pydantic.json_schema import models_json_schema

    models = [SpeechRequest, ErrorResponse, ModelList, Health, VoiceList, VoiceCreated, VoiceDeleted, SpeechAudioDelta,
              SpeechAudioDone, AudioVoice, AudioVoiceDeleted, VoiceConsent, VoiceConsentList, VoiceConsentDeleted,
              ListedVoices]
    _, defs = models_json_schema([(m, "validation" if m is SpeechRequest else "serialization") for m in models],
                                 ref_template="#/components/schemas/{model}")
    schemas = defs["$defs"]
    schemas["SpeechRequest"]["properties"]["voice"]["examples"] = voices
    schemas["SpeechRequest"]["properties"]["language"]["examples"] = languages
    ref = lambda name: {"$ref": f"#/components/schemas/{name}"}  # noqa: E731
    error = lambda why: {"description": why, "content": {"application/json": {"schema": ref("ErrorResponse")}}}  # noqa: E731
    audio = {f.content_type: {"schema": {"type": "string", "format": "binary"}} for f in FORMATS.values()}
    audio["text/event-stream"] = {"schema": {"description": "stream_format sse: one `data: {json}` line per event, "
                                             "each event ended by a blank line", "oneOf": [
                                                 ref("SpeechAudioDelta"), ref("SpeechAudioDone")]}}
    headers = {SEED_HEADER: {"description": "The seed the request sampled with (drawn afresh when it gave none): send "
                                            "it as `seed` to hear this take again (bit for bit when it runs alone)",
                             "schema": {"type": "integer", "minimum": 0}},
               "X-Sample-Rate": {"description": "Always 24000", "schema": {"type": "integer"}}}
    secured = {"security": [{"bearer": []}]} if auth else {}
    voice_form = {"type": "object", "required": ["name", "audio"], "properties": {
        "name": {"type": "string", "pattern": NEW_VOICE_PATTERN, "description": "The new voice's name (a file stem)"},
        "audio": {"type": "string", "format": "binary", "description": "The voice clip: wav, flac, ogg or mp3, any "
                  "rate and channels (converted to 24 kHz mono); 1 s at least, at most 15 s used (a longer clip is "
                  "trimmed at a quiet point, or refused with a transcript)"},
        "text": {"type": "string", "maxLength": MAX_INSTRUCTIONS_CHARS, "description": "What the clip says: the "
                 "voice then clones in ICL mode (else from the x-vector alone)"}}}
    sample_form = {"type": "object", "required": ["name", "audio_sample", "consent"], "properties": {
        "name": voice_form["properties"]["name"],
        "audio_sample": voice_form["properties"]["audio"] | {"description": "The voice clip, checked and used as "
                                                                            "POST /v1/voices uses `audio`"},
        "consent": {"type": "string", "description": "A consent recording's id (POST /v1/audio/voice_consents)"},
        "type": {"type": "string", "enum": ["audio_sample"], "description": "audio_sample, the default; prompt is "
                 "refused (this server clones samples only)"}}}
    consent_form = {"type": "object", "required": ["name", "language", "recording"], "properties": {
        "name": {"type": "string", "maxLength": MAX_LABEL_CHARS, "description": "A label"},
        "language": {"type": "string", "pattern": LANGUAGE_TAG, "description": "The consent phrase's language, a "
                     "BCP 47 tag (en-US)"},
        "recording": {"type": "string", "format": "binary", "description": "The consent recording (wav, flac, ogg "
                      "or mp3), checked as a voice clip is; kept as uploaded where the server has a --voices folder"}}}

    def answer(schema: str, why: str) -> dict:
        return {"description": why, "content": {"application/json": {"schema": ref(schema)}}}

    consent_id = [{"name": "consent_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    not_base = "A checkpoint that does not clone (CustomVoice, VoiceDesign)"
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "qtts serve", "version": "1", "description": f"Qwen3-TTS on ncnn, serving {model_id}: "
                 "OpenAI's speech API, streamed."},
        "paths": {
            "/v1/audio/speech": {"post": {
                "operationId": "createSpeech", "summary": "Speak text, streamed as it is generated",
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref("SpeechRequest")}}},
                "responses": {"200": {"description": "The audio, chunked as it is generated: the bytes of "
                                                     "response_format, or with stream_format sse server-sent events "
                                                     "(no samples at all where the model ends the text at its "
                                                     "first frame)",
                                      "headers": headers, "content": audio},
                              "400": error("Invalid request, or a `ref_audio` that cannot be used (not base64, "
                                           "not audio, too long, silent, ...; refused on checkpoints that do not "
                                           "clone)"), "401": error("Missing or wrong API key"),
                              "404": error("Unknown model"), "408": error("The body stalled (--body-timeout)"),
                              "413": error("Body too large (64 KiB; an upload's limit when it names `ref_audio` "
                                           "in its first 64 KiB)"),
                              "500": error("The engine failed before any audio (a stream that fails later is cut "
                                           "off: its chunked body never ends)"),
                              "501": error("The format (mp3, the default, or another compressed one) or a speed "
                                           "needs PyAV, which this server lacks"),
                              "503": error("Batch and queue full (Retry-After says when to try again), or the "
                                           "engine stopped")}, **secured}},
            "/v1/models": {"get": {"operationId": "listModels", "summary": "The served checkpoint and what it can do",
                                   "responses": {"200": {"description": "One model", "content": {
                                       "application/json": {"schema": ref("ModelList")}}},
                                       "401": error("Missing or wrong API key")}, **secured}},
            "/v1/voices": {
                "get": {"operationId": "listVoices", "summary": "The voices a speech request may name",
                        "responses": {"200": {"description": "Every voice", "content": {
                            "application/json": {"schema": ref("VoiceList")}}},
                            "401": error("Missing or wrong API key")}, **secured},
                "post": {"operationId": "createVoice", "summary": "Add a voice from a clip (Base checkpoints), saved "
                                                                  "in the --voices folder",
                         "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": voice_form}}},
                         "responses": {"201": {"description": "Built and saved", "content": {
                             "application/json": {"schema": ref("VoiceCreated")}}},
                             "400": error("A clip that cannot be used (NaN, silent, too short, too long with a "
                                          "transcript, unreadable), a bad name, a checkpoint that does not clone, "
                                          "or no --voices folder"), "401": error("Missing or wrong API key"),
                             "409": error("A voice of that name exists"), "413": error("Upload too large")},
                         **secured}},
            "/v1/voices/{name}": {"delete": {
                "operationId": "deleteVoice", "summary": "Remove a cloned voice and its files",
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "Deleted", "content": {
                    "application/json": {"schema": ref("VoiceDeleted")}}},
                    "400": error("A built-in voice (it cannot be deleted)"), "401": error("Missing or wrong API key"),
                    "404": error("No such voice")}, **secured}},
            "/v1/audio/voices": {"get": {
                "operationId": "listAudioVoices", "summary": "Every voice a speech request may name, with the names "
                                                             "that speak it (--voice-alias, OpenAI's voice names)",
                "responses": {"200": answer("ListedVoices", "Every voice"), "401": error("Missing or wrong API key")},
                **secured}, "post": {
                "operationId": "createAudioVoice", "summary": "OpenAI's voice from an audio sample and a consent "
                                                              "recording (Base checkpoints), made as POST /v1/voices "
                                                              "makes one; its id works as a speech request's "
                                                              "{\"id\": ...}",
                "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": sample_form}}},
                "responses": {"200": answer("AudioVoice", "Built and saved"),
                              "400": error("An unknown consent, a clip that cannot be used, a bad name, a prompt "
                                           f"voice, no --voices folder, or {not_base.lower()}"),
                              "401": error("Missing or wrong API key"), "409": error("A voice of that name exists"),
                              "413": error("Upload too large")}, **secured}},
            "/v1/audio/voices/{voice_id}": {"delete": {
                "operationId": "deleteAudioVoice", "summary": "Remove the voice with that id and its files (not its "
                                                              "consent recording)",
                "parameters": [{"name": "voice_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": answer("AudioVoiceDeleted", "Deleted"), "400": error(not_base),
                              "401": error("Missing or wrong API key"), "404": error("No voice has that id")},
                **secured}},
            "/v1/audio/voice_consents": {
                "post": {"operationId": "createVoiceConsent", "summary": "Keep a consent recording (Base checkpoints; "
                                                                         "in the --voices folder's consents/, else in "
                                                                         "memory)",
                         "requestBody": {"required": True, "content": {"multipart/form-data": {
                             "schema": consent_form}}},
                         "responses": {"200": answer("VoiceConsent", "Kept"),
                                       "400": error(f"A recording that cannot be used, a bad field, or {not_base}"),
                                       "401": error("Missing or wrong API key"), "413": error("Upload too large")},
                         **secured},
                "get": {"operationId": "listVoiceConsents", "summary": "The consent recordings, oldest first",
                        "parameters": [{"name": "after", "in": "query", "schema": {"type": "string"}},
                                       {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                                   "maximum": MAX_LIST,
                                                                                   "default": 20}}],
                        "responses": {"200": answer("VoiceConsentList", "A page"),
                                      "400": error(f"A bad after or limit, or {not_base.lower()}"),
                                      "401": error("Missing or wrong API key")}, **secured}},
            "/v1/audio/voice_consents/{consent_id}": {
                "get": {"operationId": "retrieveVoiceConsent", "summary": "One consent recording",
                        "parameters": consent_id,
                        "responses": {"200": answer("VoiceConsent", "It"), "400": error(not_base),
                                      "401": error("Missing or wrong API key"), "404": error("No such consent")},
                        **secured},
                "post": {"operationId": "updateVoiceConsent", "summary": "A new label",
                         "parameters": consent_id, "requestBody": {"required": True, "content": {
                             "application/json": {"schema": {"type": "object", "required": ["name"],
                                                             "additionalProperties": False,
                                                             "properties": {"name": consent_form["properties"][
                                                                 "name"]}}}}},
                         "responses": {"200": answer("VoiceConsent", "Renamed"),
                                       "400": error(f"A bad body, or {not_base.lower()}"),
                                       "401": error("Missing or wrong API key"), "404": error("No such consent")},
                         **secured},
                "delete": {"operationId": "deleteVoiceConsent", "summary": "Remove a consent recording (the voices "
                                                                           "made under it stay)",
                           "parameters": consent_id,
                           "responses": {"200": answer("VoiceConsentDeleted", "Deleted"), "400": error(not_base),
                                         "401": error("Missing or wrong API key"),
                                         "404": error("No such consent")}, **secured}},
            "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document",
                                      "responses": {"200": {"description": "OpenAPI 3.1", "content": {
                                          "application/json": {"schema": {"type": "object"}}}}}, **secured}},
            "/health": {"get": {"operationId": "health", "summary": "Liveness and the batch in flight",
                                "responses": {"200": {"description": "Healthy", "content": {
                                    "application/json": {"schema": ref("Health")}}},
                                    "503": {"description": "The engine stopped", "content": {
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
