"""Fixtures for the black-box API tests: a real `latent serve` on a tiny GLM-5-style model with a real tokenizer.

The model is built from committed files (tests/data/tokenizer/glm5 + a GLM-5 chat template) by tiny_chat_model.py;
its weights plant deterministic reasoning / tool-call / content outputs. The tests skip, with the reason, only when
that cannot be done: the latent binary or a Python package (tokenizers, safetensors, openai) is missing.

The binary is $LATENT_BIN (set by ctest), else the newest build/*/latent. $LATENT_SERVE_ARGS (shell words) is
appended to every server's flags: the whole suite runs against another layout, e.g.
LATENT_SERVE_ARGS="--device cuda --tensor-parallel-size 2" on a 2-GPU machine.
"""
import http.client
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_chat_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def _latent_bin():
    b = os.environ.get("LATENT_BIN")
    if b and Path(b).exists():
        return b
    cands = sorted(ROOT.glob("build/*/latent"), key=lambda p: p.stat().st_mtime, reverse=True)
    return str(cands[0]) if cands else None


def _skip_reason():
    ok, why = tiny_chat_model.available()
    if not ok:
        return why
    try:
        import openai  # noqa: F401
    except ImportError:
        return "python package missing: openai"
    b = _latent_bin()
    if not b:
        return "no latent binary (set LATENT_BIN or build it)"
    p = subprocess.run([b, "serve", "--help"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"{b} has no `serve` command"
    return None


def sanitized_build():
    """True when $LATENT_BUILD (set by ctest) is a sanitizer build, whose server runs many times slower."""
    b = os.environ.get("LATENT_BUILD")
    cache = Path(b) / "CMakeCache.txt" if b else None
    return bool(cache and cache.exists() and "LATENT_SANITIZE:BOOL=ON" in cache.read_text().splitlines())


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model_dir, extra, log_path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")
        kv = [] if "--kv-cache-bytes" in extra else ["--kv-cache-bytes", "256M"]  # a test may size it itself
        args = [_latent_bin(), "serve", "--model", str(model_dir), "--port", str(self.port), "--served-model-name",
                "tiny-glm", "--served-model-name", "tiny-alias", *kv, "--threads", "2", *extra,
                *shlex.split(os.environ.get("LATENT_SERVE_ARGS", ""))]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"latent serve exited {self.proc.returncode}: {Path(log_path).read_text()[-3000:]}")
            try:
                st, _, _ = self.request("GET", "/health")
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("latent serve did not become healthy in 120 s")

    def request(self, method, path, body=None, headers=None, timeout=60):
        """Raw HTTP: (status, headers dict (lower-case), body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def json(self, method, path, body=None, headers=None):
        st, h, b = self.request(method, path, body, headers)
        return st, json.loads(b) if b else None

    def client(self, api_key="none"):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60)

    def metrics(self):
        st, _, b = self.request("GET", "/metrics")
        assert st == 200
        out = {}
        for line in b.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def metric(self, name, labels=""):
        key = f'latent:{name}{{model_name="tiny-glm"{("," + labels) if labels else ""}}}'
        return self.metrics().get(key)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    why = _skip_reason()
    if why:
        pytest.skip(f"API tests need a tiny model with a tokenizer: {why}")
    d = tmp_path_factory.mktemp("tiny-chat-model")
    info = tiny_chat_model.build(d)
    info["dir"] = d
    return info


def _start(tiny_model, tmp_path_factory, name, extra):
    log = tmp_path_factory.mktemp("logs") / f"{name}.log"
    s = Server(tiny_model["dir"], extra, log)
    return s


@pytest.fixture(scope="session")
def server(tiny_model, tmp_path_factory):
    s = _start(tiny_model, tmp_path_factory, "main", ["--max-queue-len", "64", "--max-num-seqs", "32"])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def auth_server(tiny_model, tmp_path_factory):
    s = _start(tiny_model, tmp_path_factory, "auth", ["--api-key", "sk-test-1,sk-test-2", "--max-request-bytes", "4096"])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def clamp_server(tiny_model, tmp_path_factory):
    s = _start(tiny_model, tmp_path_factory, "clamp", ["--clamp-max-tokens"])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    return server.client()
