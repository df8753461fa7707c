"""The page at `/` in a real headless browser (Debian's Chromium, driven by Selenium through chromium-driver): it
lists the server's voices, speaks what is typed, plays the audio as it streams in, and downloads it; its "type as you
go" box speaks text while it is typed, over the WebSocket /v1/audio/speech/stream.

Without Chromium and its driver the page tests are a recorded skip, unless QTTS_REQUIRE_BROWSER is set (.ci/run
sets it after installing them): there a skip would mean the set-up broke, so it is a failure."""
import os
import shutil
import struct
from pathlib import Path

import pytest
from serving import start_server, stop_server

REQUIRE = "QTTS_REQUIRE_BROWSER"
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"
MAX_FRAMES = 12


class BrowserRequired(RuntimeError):
    """QTTS_REQUIRE_BROWSER is set and no Chromium or chromedriver was found."""


def browser_or_skip(found: tuple[str | None, str | None] | None = None, required: str | None = None):
    """(chromium, chromedriver) paths, or None with a reason to skip; raises `BrowserRequired` where required."""
    found = found or (next(filter(None, map(shutil.which, CHROMIUM)), None), shutil.which(DRIVER))
    required = os.environ.get(REQUIRE, "") if required is None else required
    if all(found):
        return found, ""
    reason = ("no Chromium or chromedriver on PATH: apt-get install chromium chromium-driver (Debian), as .ci/run "
              "does")
    if required and required.lower() not in ("0", "false", "no"):
        raise BrowserRequired(f"{REQUIRE}={required}: {reason}")
    return None, reason


def test_a_missing_browser_is_a_skip_unless_required():
    assert browser_or_skip((None, "/usr/bin/chromedriver"), required="")[0] is None
    with pytest.raises(BrowserRequired):
        browser_or_skip(("/usr/bin/chromium", None), required="1")
    assert browser_or_skip(("/usr/bin/chromium", "/usr/bin/chromedriver"), required="1")[0] is not None


def chrome(downloads: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found, reason = browser_or_skip()
    if found is None:
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--autoplay-policy=no-user-gesture-required", "--window-size=900,900"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    return webdriver.Chrome(options=options, service=Service(executable_path=found[1]))


@pytest.fixture(scope="module")
def page(tts, tmp_path_factory):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    tmp = tmp_path_factory.mktemp("page")
    proc, url = start_server(tmp, "--max-frames", str(MAX_FRAMES))
    try:
        driver = chrome(tmp / "downloads")
    except BaseException:
        stop_server(proc)
        raise
    yield driver, url, tmp / "downloads"
    driver.quit()
    stop_server(proc)


def wait_for(driver, condition: str, timeout: float = 60):
    """Until the page's JavaScript `condition` holds (the page's state lives on <body data-...>)."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(f"return {condition}"))


def test_the_page_speaks_plays_as_it_streams_and_downloads(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver, url, downloads = page
    driver.get(url + "/")
    wait_for(driver, "document.body.dataset.state === 'ready'")
    voices = [o.text for o in Select(driver.find_element(By.ID, "voice")).options]
    assert voices == ["alice", "bob"]  # the server's list (tiny-base clones the clips in --voices)
    assert "english" in [o.text for o in Select(driver.find_element(By.ID, "language")).options]
    assert not driver.find_element(By.ID, "instructions").is_displayed()  # a Base checkpoint follows none
    text = driver.find_element(By.ID, "text")
    text.clear()
    text.send_keys("Hello from the browser.")
    Select(driver.find_element(By.ID, "voice")).select_by_visible_text("bob")
    driver.find_element(By.TAG_NAME, "summary").click()  # the sampling controls
    driver.find_element(By.ID, "seed").send_keys("3")
    driver.find_element(By.ID, "temperature").send_keys("0.8")  # a value the field's own validation must let by
    driver.find_element(By.ID, "play").click()
    wait_for(driver, "['done', 'error'].includes(document.body.dataset.state)")
    data = data_of(driver)
    assert data["state"] == "done", driver.find_element(By.ID, "status").text
    samples, pieces = int(data["samples"]), int(data["pieces"])
    print(f"page: {samples} samples in {pieces} pieces, first audio after {data['firstMs']} ms")
    # played as it streamed: the server sends a piece per 4 frames, and the page scheduled each as it arrived
    assert 0 < samples <= MAX_FRAMES * 1920 and pieces >= 2 and int(data["firstMs"]) >= 0
    assert data["audioState"] == "running"  # the Web Audio context played the pieces as they came
    # the download: mp3, asked again with the same fields (same seed, same audio), saved by the browser
    Select(driver.find_element(By.ID, "format")).select_by_value("mp3")
    driver.find_element(By.ID, "download").click()
    wait_for(driver, "document.body.dataset.downloaded !== undefined")
    mp3 = saved(driver, downloads / "speech.mp3")
    assert len(mp3) == int(data_of(driver)["downloaded"].split(":")[1]) and mp3[:3] == b"ID3"
    Select(driver.find_element(By.ID, "format")).select_by_value("wav")
    driver.find_element(By.ID, "download").click()
    wav = saved(driver, downloads / "speech.wav")  # built in the page from the pcm it played
    assert wav[:4] == b"RIFF" and struct.unpack("<I", wav[40:44])[0] == 2 * samples == len(wav) - 44


def test_the_page_queues_more_audio_at_each_pause_of_a_slow_stream(page):
    """Where the server speaks slower than real time the queued audio runs out: the next piece waits twice the lead
    of the last pause (at most 4 s), so that playback pauses a few times, for longer each time, not before every
    piece. The page's `schedule(queuedUntil, now, lead, first)` decides when a piece starts."""
    driver, url, _ = page
    driver.get(url + "/")
    wait_for(driver, "document.body.dataset.state === 'ready'")
    queued, first, late, later, capped = driver.execute_script(
        "return [schedule(1.5, 1.0, 0.05, false), schedule(0, 2.0, 0.05, true), schedule(1.0, 2.0, 0.05, false), "
        "schedule(1.0, 2.0, 0.1, false), schedule(1.0, 2.0, 3, false)]")
    assert queued == {"start": 1.5, "lead": 0.05, "paused": False}  # right behind the audio queued before it
    assert first["start"] == pytest.approx(2.05) and not first["paused"]  # the first piece is no pause
    assert late["start"] == pytest.approx(2.1) and late["lead"] == pytest.approx(0.1) and late["paused"]
    assert later["start"] == pytest.approx(2.2) and later["lead"] == pytest.approx(0.2)
    assert capped["lead"] == 4 and capped["start"] == pytest.approx(6.0)


def data_of(driver) -> dict:
    return driver.execute_script("return Object.assign({}, document.body.dataset)")


def saved(driver, path: Path) -> bytes:
    """A download's bytes, once the browser has renamed it from its .crdownload (complete)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(lambda d: path.exists())
    return path.read_bytes()


def test_the_page_adds_a_voice_speaks_with_it_and_deletes_it(page, tmp_path):
    """The upload form: a name, a clip file and its transcript go to POST /v1/voices; the voice list is asked again
    and the new voice chosen; it speaks (without a seed: the page shows the seed the answer named); the delete
    button removes it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from qtts_lib import paths

    driver, url, _ = page
    driver.get(url + "/")
    wait_for(driver, "document.body.dataset.state === 'ready'")
    assert driver.find_element(By.ID, "upload").is_displayed()  # a Base checkpoint clones
    driver.find_element(By.ID, "new-name").send_keys("carol")
    driver.find_element(By.ID, "new-audio").send_keys(str(paths.voice_wav()))
    driver.find_element(By.ID, "new-text").send_keys((paths.INPUTS / "voice.txt").read_text().strip())
    driver.find_element(By.ID, "add-voice").click()
    wait_for(driver, "['added:carol', 'error'].includes(document.body.dataset.voiceState)")
    assert data_of(driver)["voiceState"] == "added:carol", driver.find_element(By.ID, "upload-status").text
    assert "icl" in driver.find_element(By.ID, "upload-status").text
    voice = Select(driver.find_element(By.ID, "voice"))
    assert [o.text for o in voice.options] == ["alice", "bob", "carol"]
    assert voice.first_selected_option.text == "carol"
    driver.find_element(By.ID, "play").click()
    wait_for(driver, "['done', 'error'].includes(document.body.dataset.state)")
    data = data_of(driver)
    assert data["state"] == "done" and int(data["samples"]) > 0, driver.find_element(By.ID, "status").text
    assert data["seed"].isdigit() and f"seed {data['seed']}" in driver.find_element(By.ID, "status").text
    driver.find_element(By.ID, "delete-voice").click()
    wait_for(driver, "document.body.dataset.voiceState === 'deleted:carol'")
    assert [o.text for o in Select(driver.find_element(By.ID, "voice")).options] == ["alice", "bob"]


TYPED = [  # about 40 tokens each: one segment (60 tokens at most) apiece, decided while the next is typed
    "The morning train left the old station a little after six o'clock that day, and most of the long wooden seats "
    "in every one of its narrow carriages were still completely empty.",
    "A tired woman sitting by the window read the same page of her heavy library book three times over before she "
    "finally gave up and watched the wet green fields go slowly by.",
    "At the second stop a young boy carrying an old black violin case sat down across from her and smiled warmly, as "
    "if the two of them had somehow met somewhere long before.",
]


def test_the_page_speaks_as_you_type_over_the_websocket(page):
    """The "type as you go" box: typed in pieces of four words, its text goes to /v1/audio/speech/stream as it is
    typed; audio plays before the last sentence is typed (the first segment is decided by the words after it), and
    after Ctrl+Enter (text.done) every segment is listed with its span inside the audio that arrived, in order, and
    lit as it plays. From a browser the API key rides in the URL (`?api_key=`): a WebSocket takes no header."""
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver, url, _ = page
    driver.get(url + "/")
    wait_for(driver, "document.body.dataset.state === 'ready'")
    assert driver.execute_script("const key = document.getElementById('key'); key.value = 'k y';"
                                 "const url = liveUrl(); key.value = ''; return url") == \
        url.replace("http", "ws", 1) + "/v1/audio/speech/stream?api_key=k+y"
    assert driver.execute_script("return liveUrl()") == url.replace("http", "ws", 1) + "/v1/audio/speech/stream"
    box = driver.find_element(By.ID, "live-text")
    words = " ".join(TYPED).split(" ")
    pieces = [" ".join(words[i:i + 4]) + " " for i in range(0, len(words), 4)]
    early = -(-len(" ".join(TYPED[:2]).split(" ")) // 4) + 1  # two sentences and the third's first words
    for piece in pieces[:early]:
        box.send_keys(piece)
        time.sleep(0.05)
    wait_for(driver, "+document.body.dataset.liveSamples > 0 || document.body.dataset.liveState === 'error'")
    assert data_of(driver)["liveState"] == "streaming", driver.find_element(By.ID, "live-status").text
    for piece in pieces[early:]:
        box.send_keys(piece)
        time.sleep(0.05)
    box.send_keys(Keys.CONTROL, Keys.ENTER)
    wait_for(driver, "['done', 'error'].includes(document.body.dataset.liveState)")
    data = data_of(driver)
    assert data["liveState"] == "done", driver.find_element(By.ID, "live-status").text
    samples, pieces_in = int(data["liveSamples"]), int(data["livePieces"])
    spans = driver.execute_script("return [...document.querySelectorAll('#live-segments li')].map("
                                  "(li) => [+li.dataset.start, +li.dataset.end, li.lastChild.textContent])")
    print(f"page, typed: {samples} samples in {pieces_in} pieces, {len(spans)} segments")
    assert samples > 0 and pieces_in >= 2 and len(spans) == int(data["liveSegments"]) >= 3
    ends = [0.0] + [end for _, end, _ in spans]
    assert all(ends[i] <= start < end for i, (start, end, _) in enumerate(spans))  # in order, one after another
    assert spans[-1][1] <= samples / 24000 + 1e-3  # inside the audio that arrived
    spoken = " ".join(text.strip() for _, _, text in spans).split()
    assert spoken == " ".join(TYPED).split()  # every word typed, each once, in order
    assert "seed" in driver.find_element(By.ID, "live-status").text
    wait_for(driver, f"+document.body.dataset.liveSaid === {len(spans)}", timeout=30)  # lit as each one played
    assert not driver.find_elements(By.CSS_SELECTOR, "#live-segments li:not(.said)")


def test_the_type_as_you_go_box_shows_the_servers_error(page):
    """A speech.start the server refuses (a temperature below its range, set past the field's own check) comes back
    as one error message, shown in the box's status as the other forms show theirs."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver, url, _ = page
    driver.get(url + "/")
    wait_for(driver, "document.body.dataset.state === 'ready'")
    driver.execute_script("document.getElementById('temperature').value = '-1'")
    box = driver.find_element(By.ID, "live-text")
    box.send_keys("Hello there. ")
    box.send_keys(Keys.CONTROL, Keys.ENTER)
    wait_for(driver, "['done', 'error'].includes(document.body.dataset.liveState)")
    status = driver.find_element(By.ID, "live-status")
    print(f"page, typed: the error shown: {status.text}")
    assert data_of(driver)["liveState"] == "error" and status.get_attribute("class") == "error"
    assert "temperature" in status.text and int(data_of(driver)["liveSamples"]) == 0
