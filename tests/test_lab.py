"""`make lab` as a reader meets it: a real JupyterLab server, started by the Makefile's own `lab` rule, opens
every chapter as a notebook (jupytext), double-clicks open `.py` as notebooks, the kernel is .venv's python,
and the log holds no extension error."""

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from jupyter_client import BlockingKernelClient

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(ROOT.glob("notebooks/[0-9][0-9]_*.py")) + sorted(ROOT.glob("notebooks/appendix_*.py"))
LOG_ERRORS = re.compile(r"Traceback|Failed to load|Error loading server extension|extension failed|^\[E ", re.M)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base, token, path, method="GET", body=None):
    req = urllib.request.Request(f"{base}{path}", method=method, data=body,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def _kernel_connection_file(kernel_id):
    """The connection file of the kernel process the server started (its `-f` argument, read from /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "ipykernel_launcher" in argv and "-f" in argv and kernel_id in argv[argv.index("-f") + 1]:
            return argv[argv.index("-f") + 1]
    return None


def test_make_lab_opens_every_chapter_as_a_notebook(tmp_path):
    assert CHAPTERS, "no chapters found"
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "lab.log"
    lab_args = f"--no-browser --ServerApp.ip=127.0.0.1 --port={port} --ServerApp.port_retries=0 " \
               f"--IdentityProvider.token={token}"
    # The Makefile's own rule; -o: never reinstall .venv from inside a test.
    cmd = ["make", "--no-print-directory", "-o", ".venv/.qtts-installed", "lab", f"LAB_ARGS={lab_args}"]
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 40
        while True:
            assert server.poll() is None, f"make lab exited with {server.returncode}:\n{log_path.read_text()}"
            try:
                _api(base, token, "/api/status")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, f"server did not answer:\n{log_path.read_text()}"
                time.sleep(0.3)

        for chapter in CHAPTERS:
            rel = chapter.relative_to(ROOT).as_posix()
            model = _api(base, token, f"/api/contents/{rel}?type=notebook&content=1")
            nb = model["content"]
            assert model["type"] == "notebook" and nb["nbformat"] == 4, rel
            assert len(nb["cells"]) > 5, (rel, len(nb["cells"]))
            first = nb["cells"][0]
            assert first["cell_type"] == "markdown" and first["source"].startswith("# "), (rel, first)
            assert {c["cell_type"] for c in nb["cells"]} >= {"markdown", "code"}, rel
            assert nb["metadata"]["kernelspec"]["name"] == "python3", rel

        # Double-click opens a .py as a notebook: the project's labconfig sets jupytext's default viewer.
        settings = _api(base, token, "/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
        viewers = settings["schema"]["properties"]["defaultViewers"]["default"]
        assert viewers.get("python") == "Jupytext Notebook", viewers

        # The chapters' kernel (python3) runs .venv's python: ask the kernel itself.
        kernel = _api(base, token, "/api/kernels", "POST", json.dumps({"name": "python3"}).encode())
        try:
            connection_file = None
            for _ in range(100):
                connection_file = _kernel_connection_file(kernel["id"])
                if connection_file and Path(connection_file).exists():
                    break
                time.sleep(0.2)
            assert connection_file, "kernel process not found"
            client = BlockingKernelClient(connection_file=connection_file)
            client.load_connection_file()
            client.start_channels()
            try:
                client.wait_for_ready(timeout=30)
                out = []
                client.execute_interactive("import sys; print(sys.prefix)", timeout=30,
                                           output_hook=lambda m: out.append(m["content"].get("text", ""))
                                           if m["msg_type"] == "stream" else None)
            finally:
                client.stop_channels()
            assert Path("".join(out).strip()).resolve() == (ROOT / ".venv").resolve(), out
        finally:
            _api(base, token, f"/api/kernels/{kernel['id']}", "DELETE")
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=5)

    log = log_path.read_text()
    assert "jupyterlab_jupytext | extension was successfully loaded" in log, log
    bad = [line for line in log.splitlines() if LOG_ERRORS.search(line)]
    assert not bad, "errors in the JupyterLab log:\n" + "\n".join(bad) + "\n\n" + log
