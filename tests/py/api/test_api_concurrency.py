"""Concurrency: 16 parallel greedy streams give exactly what each gives alone; a client that disconnects (streaming
or not) frees its sequence and KV blocks (docs/api.md §scheduling, visible in /metrics); the queue limit answers 503;
SIGTERM drains; seeded sampling is unaffected by concurrent load (docs/api.md §determinism)."""
import json
import socket
import threading
import time

import pytest

from conftest import Server


def greedy_stream(server, prompt, max_tokens=24, extra=None):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            **(extra or {})}
    st, _, raw = server.request("POST", "/v1/completions", body, timeout=120)
    assert st == 200, raw[:300]
    out = []
    for e in raw.decode().split("\n\n"):
        if e.startswith("data: {"):
            c = json.loads(e[6:])
            out += [ch["text"] for ch in c["choices"]]
    return "".join(out)


WORDS = ["model", "engine", "token", "layers", "experts", "support", "measure", "welcome", "family", "follow",
         "stored", "return", "doctor", "Please", "check", "world"]
PROMPTS = [" ".join(WORDS[(i + j) % 16] for j in range(i * 5 + 3)) for i in range(16)]


def test_16_parallel_greedy_streams_equal_alone(server):
    alone = [greedy_stream(server, p) for p in PROMPTS]
    results = [None] * 16
    errors = []

    def run(i):
        try:
            results[i] = greedy_stream(server, PROMPTS[i])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == alone
    assert len(set(alone)) > 4  # the prompts really give different outputs


def test_seeded_sampling_amid_load(server):
    body = {"prompt": "Hello", "max_tokens": 16, "temperature": 1.2, "seed": 7, "ignore_eos": True}
    st, a = server.json("POST", "/v1/completions", body)
    noise = [threading.Thread(target=greedy_stream, args=(server, p, 32)) for p in PROMPTS[:8]]
    for t in noise:
        t.start()
    st, b = server.json("POST", "/v1/completions", body)
    for t in noise:
        t.join()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def _raw_request(port, body):
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def _wait(pred, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return time.time() - t0
        time.sleep(0.02)
    return None


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_frees_sequence(server, stream):
    before = server.metric("requests_aborted_total", 'reason="client_disconnect"')
    gen_before = server.metric("generation_tokens_total")
    s = _raw_request(server.port, {"messages": [{"role": "user", "content": "long"}], "max_tokens": 1000,
                                   "ignore_eos": True, "stream": stream})
    assert _wait(lambda: server.metric("num_requests_running") == 1, 10) is not None
    if stream:
        assert b"200" in s.recv(200)
    assert server.metric("kv_cache_usage_perc") > 0
    s.close()
    waited = _wait(lambda: server.metric("num_requests_running") == 0 and server.metric("kv_cache_blocks_used") == 0, 5)
    assert waited is not None and waited < 1.0
    assert server.metric("requests_aborted_total", 'reason="client_disconnect"') == before + 1
    produced = server.metric("generation_tokens_total") - gen_before
    assert produced < 1000  # generation stopped early
    time.sleep(0.2)
    assert server.metric("generation_tokens_total") - gen_before == produced  # and nothing is counted afterwards


def test_queue_full_503_and_drain(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "queue.log"
    s = Server(tiny_model["dir"], ["--max-num-seqs", "1", "--max-queue-len", "1", "--shutdown-timeout", "60"], log)
    try:
        long_body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 300, "ignore_eos": True}
        results = {}

        def run(name):
            results[name] = s.json("POST", "/v1/chat/completions", long_body)

        t1 = threading.Thread(target=run, args=("a",))
        t1.start()
        assert _wait(lambda: s.metric("num_requests_running") == 1, 10) is not None
        t2 = threading.Thread(target=run, args=("b",))
        t2.start()
        assert _wait(lambda: s.metric("num_requests_waiting") == 1, 10) is not None
        st, h, b = s.request("POST", "/v1/chat/completions", long_body)
        assert st == 503 and h["retry-after"] == "1"
        assert json.loads(b)["error"]["code"] == "server_is_overloaded"
        assert s.metric("requests_rejected_total", 'reason="overloaded"') == 1
        # /health answers at once under load
        t0 = time.time()
        assert s.json("GET", "/health")[0] == 200
        assert time.time() - t0 < 0.5
        # SIGTERM: new requests get 503 draining, running ones finish, then the process exits 0.
        s.proc.terminate()
        assert _wait(lambda: s.request("GET", "/health")[0] == 503, 5) is not None
        st, b = s.json("POST", "/v1/chat/completions", long_body)
        assert st == 503 and b["error"]["code"] == "draining"
        t1.join(120)
        t2.join(120)
        assert results["a"][0] == 200 and results["a"][1]["choices"][0]["finish_reason"] == "length"
        assert results["b"][0] == 200
        assert s.proc.wait(timeout=60) == 0
    finally:
        s.stop()
