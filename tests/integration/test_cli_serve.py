"""The process-starting half of tests/unit/test_cli_serve.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
from app.cli import main


def test_serve_says_when_the_engine_dies_after_ready(capsys):
    """Issue 16 item 9: the sim rig's engine dies on the first request after ready (vLLM 0.32's
    lines; the API server exits with code 0). `serve` reports the failure after ready with the
    diagnosis (the CUDA error of the engine's traceback) and exits 1, nothing left behind."""
    import json
    import socket
    import threading
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    answers: list = []

    def one_request() -> None:
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        req = urllib.request.Request(url + "/v1/completions", method="POST",
                                     headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": "hello", "max_tokens": 4}).encode())
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as e:
            answers.append(e.code)

    t = threading.Thread(target=one_request, daemon=True)
    t.start()
    rc = main(["serve", "--model", "Qwen/Qwen2.5-7B-Instruct", "--engine", "sim", "--port", str(port),
               "--sim-gpu", "RTX 4090", "--sim-time-scale", "10", "--max-model-len", "4096",
               "--sim-engine-dies-at-request", "1", "--quiet-log", "--startup-timeout", "60", "--grace", "5"])
    t.join(10)
    out = capsys.readouterr().out
    assert answers == [500]
    assert rc == 1, out
    assert "failed: the server was ready, then exited with code 0: its engine died" in out
    assert ("Diagnosis: engine_runtime_error — the server was ready, then the engine died on a request: "
            "RuntimeError: CUDA error: an illegal memory access was encountered") in out
    assert "no process of the server group is left" in out
