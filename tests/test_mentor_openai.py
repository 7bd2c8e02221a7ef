"""The openai backend over real HTTP on 127.0.0.1.

- Fault injection: a stdlib http.server in a thread answers scripted responses (valid, HTTP 500,
  a delay past the timeout, malformed JSON, JSON without choices, 404, a flaky 500-then-OK).
- A real OpenAI-compatible server: `transformers serve` on the tiny random Llama (~35 s to start on
  2 cores; the model writes noise, so the mentor must count garbage and go on without hints).
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mentor_fast.mentor import LLMAgents, Mentor, OpenAIBackend
from mentor_fast.mentor.testing import (
    CharPromptBuilder,
    exact_score,
    ladder_problem,
    make_group,
    mentor_configs,
    scripted_generate,
)
from mentor_fast.rollout.base import SamplingParams


def chat(text):
    return [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]


def completion(text):
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
    }


class Scripted(BaseHTTPRequestHandler):
    """The behaviour is the first word of the last user message: ok, 500, slow, malformed, ..."""

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.bodies.append(body)
            srv.auth.append(self.headers.get("Authorization"))
            srv.inflight += 1
            srv.max_inflight = max(srv.max_inflight, srv.inflight)
        self.answered = False
        try:
            self._answer(srv.route(body["messages"][-1]["content"]))
        except (BrokenPipeError, ConnectionResetError):  # the client timed out first
            pass
        finally:
            self._leave()

    def _leave(self):
        """The request stops counting as in flight once its answer starts going out: the client may send
        its next request as soon as it has read this one's, before this thread would get to a `finally`
        (under load that made 3 in flight of a client that allows 2)."""
        if not self.answered:
            self.answered = True
            with self.server.lock:
                self.server.inflight -= 1

    def _answer(self, text):
        mode = text.split()[0]
        with self.server.lock:
            self.server.hits[text] = self.server.hits.get(text, 0) + 1
            hit = self.server.hits[text]
        if mode == "500" or (mode == "flaky" and hit == 1):
            return self._send(500, b'{"error": "boom"}')
        if mode == "404":
            return self._send(404, b'{"error": "no such model"}')
        if mode == "slow":
            time.sleep(float(text.split()[1]))
        if mode == "malformed":
            return self._send(200, b'{"choices": [ {"message": ')
        if mode == "nochoices":
            return self._send(200, json.dumps({"object": "chat.completion"}).encode())
        self._send(200, json.dumps(completion(self.server.reply(text))).encode())

    def _send(self, code, payload):
        self._leave()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    srv.daemon_threads = True
    srv.lock, srv.bodies, srv.auth, srv.hits = threading.Lock(), [], [], {}
    srv.inflight = srv.max_inflight = 0
    srv.reply = lambda text: f"echo: {text}"
    srv.route = lambda text: text  # message -> behaviour text
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def backend_for(srv, **kw):
    host, port = srv.server_address
    return OpenAIBackend(
        f"http://{host}:{port}/v1", "scripted-model", **({"timeout_s": 0.5, "retries": 0} | kw)
    )


def test_fault_injection_each_failure_is_one_none_counted_by_kind(server):
    b = backend_for(server, concurrency=3)
    texts = ["ok one", "500", "slow 1.5", "malformed", "nochoices", "404", "ok two"]
    out = b.complete([chat(t) for t in texts], max_tokens=7, temperature=0.3)
    assert out == ["echo: ok one", None, None, None, None, None, "echo: ok two"]
    assert b.counts.snapshot() == {
        "requests/ok": 2,
        "errors/http_500": 1,
        "errors/timeout": 1,
        "errors/malformed": 2,
        "errors/http_404": 1,
    }
    sent = server.bodies[0]
    assert sent["model"] == "scripted-model" and sent["max_tokens"] == 7 and sent["temperature"] == 0.3
    assert sent["messages"][0] == {"role": "system", "content": "sys"}


def test_fault_injection_retries_recover_transient_errors_only(server):
    b = backend_for(server, retries=1, backoff_s=0.01)
    assert b.complete([chat("flaky a"), chat("404")], 8, 0.0) == ["echo: flaky a", None]
    assert server.hits == {"flaky a": 2, "404": 1}  # 5xx retried, 4xx not
    assert b.counts.snapshot() == {"requests/ok": 1, "retries/http": 1, "errors/http_404": 1}


def test_fault_injection_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    b = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "m", timeout_s=1.0, retries=1, backoff_s=0.01)
    assert b.complete([chat("ok")], 8, 0.0) == [None]
    assert b.counts.snapshot() == {"errors/connection": 1, "retries/http": 1}


def test_api_key_from_environment_and_concurrency_limit(server, monkeypatch):
    monkeypatch.setenv("MENTOR_TEST_KEY", "sk-test")
    b = backend_for(server, api_key_env="MENTOR_TEST_KEY", concurrency=2, timeout_s=5.0)
    b.complete([chat("slow 0.2")] * 5, 8, 0.0)
    assert server.auth == ["Bearer sk-test"] * 5
    assert server.max_inflight == 2
    monkeypatch.delenv("MENTOR_TEST_KEY")
    backend_for(server, api_key_env="MENTOR_TEST_KEY").complete([chat("ok")], 8, 0.0)
    assert server.auth[-1] is None  # unset key (a local server): no Authorization header


def test_fault_injection_pipeline_goes_on_without_hints(server):
    """A mentor over the scripted server: one group gets a fused diagnosis + hints, one group's
    requests fail (HTTP 500, retried once); the failed group keeps its rollouts and is counted."""
    good = json.dumps(
        {
            "diagnosis": {"failure_type": "arithmetic slip", "root_cause": "subtraction"},
            "hint_l1": "Recheck the subtraction.",
            "hint_l2": "Add first.",
            "hint_l3": "Add 47 and 385.",
        }
    )
    server.reply = lambda text: good
    host, port = server.server_address
    cfg = mentor_configs("agents.backend=openai", f"agents.base_url=http://{host}:{port}/v1", "agents.model=m",
                         "agents.timeout_s=5.0", "agents.retries=1", "trigger.max_groups_frac=1.0",
                         "trigger.collapse_abs=1.0", "reroll.count=2")
    mentor = Mentor.from_config(*cfg, CharPromptBuilder())
    mentor.agents.backend.backoff_s = 0.01
    ok_p, bad_p = ladder_problem("ok"), ladder_problem("bad")
    bad_p = type(bad_p)("bad", "500 " + bad_p.question, bad_p.gold, bad_p.solution_steps)
    groups = [make_group(ok_p, ["\\boxed{1}"] * 4, 0), make_group(bad_p, ["\\boxed{1}"] * 4, 1)]

    # The mentor's user message starts with "Problem:\n<question>": route the "500" problem to failures.
    server.route = lambda text: "500" if text.startswith("Problem:\n500") else "ok"
    gen = scripted_generate(lambda prompt, k: "\\boxed{303}" if "Recheck" in prompt else "\\boxed{1}")
    out = mentor.intervene(groups, 0, gen, exact_score, SamplingParams(n=4))
    m = out.metrics
    assert m["mentor/triggered"] == 2 and m["mentor/rescued"] == 1 and m["mentor/no_hint"] == 1
    assert (
        m["mentor/errors/http_500"] == 1 and m["mentor/retries/http"] == 1 and m["mentor/no_hint/error"] == 1
    )
    assert out.groups[1] is groups[1] and out.groups[0].num_correct == 1


# ---------------------------------------------------------------- a real server


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def transformers_server(tiny_model_path):
    exe = Path(sys.executable).parent / "transformers"
    if not exe.exists():
        pytest.skip("the `transformers` CLI is not installed beside this Python")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    port = _free_port()
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.Popen(
        [
            str(exe),
            "serve",
            str(tiny_model_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("transformers serve did not answer /health within 120 s")
        yield f"http://127.0.0.1:{port}/v1", str(tiny_model_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow  # ~60 s on 2 cores: the server takes ~35-47 s to start
@pytest.mark.timeout(240)
def test_real_openai_compatible_server_transformers_serve(transformers_server):
    url, model = transformers_server
    backend = OpenAIBackend(url, model, timeout_s=60, retries=0, concurrency=2)
    out = backend.complete([chat("What is 2 + 2?"), chat("Name a colour.")], max_tokens=8, temperature=0.0)
    assert all(isinstance(t, str) for t in out), backend.counts.snapshot()
    assert backend.counts.snapshot() == {"requests/ok": 2}
    # The random tiny model cannot write the JSON diagnosis: one retry, then garbage, no hint.
    agents = LLMAgents(backend, fused=True, max_tokens=12, hint_max_tokens=4, temperature=0.0)
    cfg = mentor_configs("agents.backend=openai", f"agents.model={model}", "trigger.max_groups_frac=1.0",
                         "trigger.collapse_abs=1.0")
    mentor = Mentor(*cfg, agents, CharPromptBuilder())
    groups = [make_group(ladder_problem("real"), ["\\boxed{1}"] * 4)]
    result = mentor.intervene(
        groups, 0, scripted_generate(lambda p, k: "\\boxed{1}"), exact_score, SamplingParams(n=4)
    )
    assert result.metrics["mentor/garbage"] == 1 and result.metrics["mentor/no_hint"] == 1
    assert result.metrics["mentor/retries/parse"] == 1 and result.groups[0] is groups[0]
