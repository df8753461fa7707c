"""OpenAI's voice names on `qtts serve`, without a model: which voice each speaks (`Voices.aliases`, `--voice-alias`,
`--default-voice`), how `parse_speech` resolves them, and the checkpoints that refuse a request's own clip
(`ref_audio`)."""
import argparse
import json
from types import SimpleNamespace

import pytest

from qtts_lib.runtime.app.server import voice_alias
from qtts_lib.runtime.app.server.schema import OPENAI_VOICES, RequestError, Served, parse_speech
from qtts_lib.runtime.app.server.voices import Voices
from qtts_lib.runtime.errors import InputError
from qtts_lib.runtime.pipeline.sampling import Sampling


def store(tmp_path, kind: str = "base", clips: tuple = (), speakers: tuple = (), **options) -> Voices:
    """A store over a folder of empty clips (names only: nothing here is built) and a stand-in checkpoint."""
    folder = tmp_path / "voices"
    folder.mkdir(exist_ok=True)
    for name in clips:
        (folder / f"{name}.wav").write_bytes(b"")
    synth = SimpleNamespace(kind=kind, speakers=list(speakers))
    return Voices(synth, folder, log=lambda m: None, **options)


def test_openais_names_speak_the_first_stored_voice_in_name_order(tmp_path):
    voices = store(tmp_path, clips=("zed", "bob", "carl"))
    assert voices.default() == "bob" and voices.aliases() == {n: "bob" for n in OPENAI_VOICES}


def test_an_alias_a_default_voice_and_a_voice_of_that_name_each_win(tmp_path):
    voices = store(tmp_path, clips=("bob", "carl", "alloy"), alias={"nova": "carl", "narrator": "carl"},
                   default="carl")
    aliases = voices.aliases()
    assert "alloy" not in aliases  # a voice of that name: it speaks itself
    assert aliases["nova"] == aliases["narrator"] == aliases["echo"] == "carl"
    listed = {v["name"]: v for v in voices.listed()}
    assert listed["carl"]["default"] and "narrator" in listed["carl"]["aliases"] and listed["bob"]["aliases"] == []


def test_a_clip_that_cannot_be_used_is_not_the_default(tmp_path):
    voices = store(tmp_path, clips=("abe", "bob"))
    voices.broken["abe"] = "the voice clip is silent"
    assert voices.default() == "bob"


def test_without_stored_voices_the_first_built_in_speaker_speaks(tmp_path):
    assert store(tmp_path, "custom_voice", speakers=("serena", "vivian")).default() == "serena"
    assert store(tmp_path, "voice_design").default() == "design"
    assert store(tmp_path).aliases() == {}  # a Base checkpoint with no clip: no voice to speak them


def test_an_alias_or_default_that_names_no_voice_stops_the_start(tmp_path):
    with pytest.raises(InputError, match="--voice-alias alloy=nobody: no voice named 'nobody'"):
        store(tmp_path, clips=("bob",), alias={"alloy": "nobody"}).check_aliases()
    with pytest.raises(InputError, match="--default-voice: no voice named 'carl'"):
        store(tmp_path, clips=("bob",), default="carl").check_aliases()
    store(tmp_path, "custom_voice", speakers=("serena",), alias={"alloy": "Serena"}).check_aliases()


@pytest.mark.parametrize("value", ["alloy", "alloy=", "=bob", "alloy=../bob", "a b=bob"])
def test_a_malformed_alias_is_refused_by_the_parser(value):
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=VOICE"):
        voice_alias(value)
    assert voice_alias("alloy=bob") == ("alloy", "bob")


def served(kind: str = "base") -> Served:
    speakers = ["serena"] if kind == "custom_voice" else []
    return Served("tiny", kind, "0.6B", ["auto", "english"], speakers, kind != "base", Sampling())


def parse(body: dict, kind: str = "base", voices=("alice", "bob"), aliases=None):
    return parse_speech(json.dumps(body).encode(), served(kind), list(voices), {}, aliases)


def test_parse_speech_resolves_an_alias_and_says_what_it_named():
    aliases = {"alloy": "alice", "nova": "gone"}
    assert parse({"input": "Hi.", "voice": "alloy"}, aliases=aliases).voice == "alice"
    assert parse({"input": "Hi.", "voice": {"id": "alloy"}}, aliases=aliases).voice == "alice"
    assert parse({"input": "Hi.", "voice": "bob"}, aliases={"bob": "alice"}).voice == "bob"  # a voice's own name
    with pytest.raises(RequestError, match="unknown voice 'gone' \\(what 'nova' speaks") as caught:
        parse({"input": "Hi.", "voice": "nova"}, aliases=aliases)  # deleted since the start
    assert caught.value.param == "voice"


def test_the_default_format_is_mp3():
    assert parse({"input": "Hi.", "voice": "alice"}).format == "mp3"


def test_ref_audio_stands_for_the_voice_and_ref_text_needs_it():
    speech = parse({"input": "Hi.", "ref_audio": "AAAA", "ref_text": " Hello. ", "voice": "nobody"})
    assert (speech.voice, speech.ref_audio, speech.ref_text) == (None, "AAAA", "Hello.")
    for body, param in (({"input": "Hi."}, "voice"), ({"input": "Hi.", "voice": "alice", "ref_text": "x"}, "ref_text"),
                        ({"input": "Hi.", "ref_audio": ""}, "ref_audio")):
        with pytest.raises(RequestError) as caught:
            parse(body)
        assert caught.value.status == 400 and caught.value.param == param, caught.value.message


@pytest.mark.parametrize("kind", ["custom_voice", "voice_design"])
def test_checkpoints_without_a_speaker_encoder_refuse_ref_audio(kind):
    with pytest.raises(RequestError) as caught:
        parse({"input": "Hi.", "voice": "serena", "ref_audio": "AAAA"}, kind, voices=["serena", "design"])
    e = caught.value
    assert (e.status, e.param, e.code) == (400, "ref_audio", "cannot_clone")
    assert "no speaker encoder" in e.message and kind.replace("_", " ") in e.message


def test_the_speaker_encoder_really_is_missing_from_a_custom_voice_checkpoint():
    """What the refusal says, seen in the exported graphs: only Base has speaker_encoder.param."""
    from qtts_lib import paths

    for ckpt, has in (("tiny-base", True), ("tiny-customvoice", False), ("tiny-voicedesign", False)):
        ncnn = paths.model_dir(ckpt) / "ncnn"
        if not ncnn.is_dir():
            pytest.skip(f"{ckpt} is not exported here")
        assert (ncnn / "speaker_encoder.param").is_file() == has, ckpt
