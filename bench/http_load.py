#!/usr/bin/env python3
"""Soak and abuse runs for the HTTP front end (`latent serve`). A program, not a test: it starts its own server on
127.0.0.1 (a free port), drives it with raw asyncio sockets, prints figures and exits; every mode is bounded in time.

  soak       N streaming clients (default 256) for --minutes on the model: counts errors, samples the server's RSS
             (VmRSS from /proc) and prints its drift.
  abandon    opens --connections streams (default 4000), abandons half of them mid-stream, then checks that the
             server still answers and that every sequence is freed (/metrics: running, waiting, KV blocks).
  connections  --connections open connections at once (default 10000): a third idle keep-alive, a third streaming,
             a third slow clients sending their headers a byte at a time; times /health and /metrics meanwhile.

  python3 bench/http_load.py soak --latent build/release/latent --minutes 2
  python3 bench/http_load.py abandon --latent build/release/latent
  python3 bench/http_load.py connections --latent build/release/latent

Only 127.0.0.1 is used. Raises its own descriptor limit to the hard limit.
"""
import argparse
import asyncio
import http.client
import json
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    def __init__(self, args, extra):
        self.port = free_port()
        self.log = open(args.log, "w") if args.log else subprocess.DEVNULL
        cmd = [args.latent, "serve", "--port", str(self.port), "--log-level", "warn", *extra]
        if args.model:
            cmd += ["--model", args.model]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"latent serve exited with {self.proc.returncode}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        sys.exit("latent serve did not become healthy")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def http_bytes(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return (head + "\r\n").encode() + data


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            body += await reader.readexactly(size + 2)
            body = body[:-2]
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def request(port, method, path, body=None, timeout=60):
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(http_bytes(method, path, body))
        await writer.drain()
        return await asyncio.wait_for(read_response(reader), timeout)
    finally:
        writer.close()


async def metrics(port):
    st, _, b = await request(port, "GET", "/metrics")
    out = {}
    for line in b.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k.split("{")[0].split(":", 1)[-1]] = out.get(k.split("{")[0].split(":", 1)[-1], 0) + float(v)
    return out


async def stream_one(port, body, timeout=600):
    """One streaming request: (ok, n_events, error)."""
    st, _, raw = await request(port, "POST", "/v1/chat/completions", body, timeout)
    if st != 200:
        return False, 0, f"status {st}: {raw[:200]!r}"
    events = [e for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    if not events or events[-1] != "data: [DONE]":
        return False, len(events), "stream did not end with [DONE]"
    if any('"error"' in e for e in events):
        return False, len(events), "error event"
    return True, len(events), None


def chat(i, max_tokens):
    return {"messages": [{"role": "user", "content": f"Tell me about item {i}."}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0.7, "seed": i}


async def timed(port, path):
    t0 = time.perf_counter()
    st, _, _ = await request(port, "GET", path, timeout=30)
    return st, (time.perf_counter() - t0) * 1000


async def soak(args):
    srv = Server(args, ["--max-num-seqs", str(args.clients), "--max-queue-len", str(4 * args.clients)])
    try:
        end = time.time() + args.minutes * 60
        ok = errors = events = 0
        err_samples = []
        rss = []

        async def client(i):
            nonlocal ok, errors, events
            j = 0
            while time.time() < end:
                try:
                    good, n, why = await stream_one(srv.port, chat(i * 100000 + j, args.max_tokens))
                except Exception as e:  # noqa: BLE001
                    good, n, why = False, 0, repr(e)
                j += 1
                events += n
                if good:
                    ok += 1
                else:
                    errors += 1
                    if len(err_samples) < 5:
                        err_samples.append(why)

        async def sampler():
            while time.time() < end:
                rss.append(rss_mib(srv.proc.pid))
                await asyncio.sleep(5)

        t0 = time.time()
        await asyncio.gather(sampler(), *(client(i) for i in range(args.clients)))
        dt = time.time() - t0
        m = await metrics(srv.port)
        warm = rss[len(rss) // 4:] or rss
        print(f"soak: {args.clients} streaming clients for {dt / 60:.1f} min: {ok} requests ok, {errors} errors, "
              f"{events} SSE events ({events / dt:.0f}/s)")
        print(f"soak: server RSS MiB first {rss[0]:.1f}, after warm-up min {min(warm):.1f} max {max(warm):.1f} "
              f"(drift {(max(warm) - min(warm)) / max(min(warm), 1e-9) * 100:.1f} %), last {rss[-1]:.1f}")
        print(f"soak: /metrics running {m.get('num_requests_running')}, waiting {m.get('num_requests_waiting')}, "
              f"kv blocks used {m.get('kv_cache_blocks_used')}")
        for e in err_samples:
            print("soak: error sample:", e)
    finally:
        srv.stop()


async def abandon(args):
    n = args.connections
    srv = Server(args, ["--max-num-seqs", "64", "--max-queue-len", str(2 * n), "--sse-ping-interval", "1"])
    try:
        conns = []
        t0 = time.time()
        for i in range(n):
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(http_bytes("POST", "/v1/chat/completions", chat(i, args.max_tokens)))
            conns.append((r, w))
        print(f"abandon: {n} streams opened in {time.time() - t0:.1f} s")
        # Wait until each has its headers (scheduled or first ping), then abandon every second one mid-stream.
        await asyncio.gather(*(r.readuntil(b"\r\n\r\n") for r, _ in conns))
        for r, w in conns[::2]:
            w.transport.abort()  # RST: gone without a goodbye
        m = await metrics(srv.port)
        st, ms = await timed(srv.port, "/health")
        print(f"abandon: half abandoned; /health {st} in {ms:.1f} ms; running {m.get('num_requests_running')}, "
              f"waiting {m.get('num_requests_waiting')}")
        done = errors = 0

        async def finish(r, w):
            nonlocal done, errors
            try:
                raw = await asyncio.wait_for(r.read(), 600)
                done += b"data: [DONE]" in raw
            except Exception:  # noqa: BLE001
                errors += 1
            finally:
                w.close()
        await asyncio.gather(*(finish(r, w) for r, w in conns[1::2]))
        deadline = time.time() + 30
        while time.time() < deadline:
            m = await metrics(srv.port)
            if not m.get("num_requests_running") and not m.get("num_requests_waiting") and not m.get("kv_cache_blocks_used"):
                break
            await asyncio.sleep(0.2)
        st, ms = await timed(srv.port, "/health")
        print(f"abandon: {done} of {len(conns[1::2])} kept streams completed, {errors} errors; afterwards running "
              f"{m.get('num_requests_running')}, waiting {m.get('num_requests_waiting')}, kv blocks used "
              f"{m.get('kv_cache_blocks_used')}, aborted(client_disconnect) {m.get('requests_aborted_total')}; "
              f"/health {st} in {ms:.1f} ms")
    finally:
        srv.stop()


async def connections(args):
    n = args.connections
    srv = Server(args, ["--max-num-seqs", "64", "--max-queue-len", str(n), "--sse-ping-interval", "2",
                        "--read-timeout", "600", "--keep-alive-timeout", "600"])
    try:
        third = n // 3
        held = []
        t0 = time.time()
        for i in range(third):  # idle keep-alive: one request answered, the connection stays open
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(http_bytes("GET", "/version"))
            await read_response(r)
            held.append(w)
        for i in range(third):  # streams (long: they outlast the measurement)
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(http_bytes("POST", "/v1/chat/completions", chat(i, args.max_tokens)))
            held.append(w)
        slow = []
        for i in range(n - 2 * third):  # slow clients: a partial header, a byte now and then
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(b"GET /health HTTP/1.1\r\nHo")
            slow.append(w)
        print(f"connections: {n} open ({third} idle keep-alive, {third} streaming, {len(slow)} slow) in "
              f"{time.time() - t0:.1f} s")
        lat_h, lat_m = [], []
        for _ in range(20):
            for w in random.sample(slow, min(200, len(slow))):
                w.write(b"s")
            st, ms = await timed(srv.port, "/health")
            assert st == 200, st
            lat_h.append(ms)
            st, ms = await timed(srv.port, "/metrics")
            lat_m.append(ms)
            await asyncio.sleep(0.25)
        m = await metrics(srv.port)
        print(f"connections: /health ms median {statistics.median(lat_h):.1f} max {max(lat_h):.1f}; /metrics ms "
              f"median {statistics.median(lat_m):.1f} max {max(lat_m):.1f}; running {m.get('num_requests_running')}, "
              f"waiting {m.get('num_requests_waiting')}; server RSS {rss_mib(srv.proc.pid):.0f} MiB, threads "
              f"{len(os.listdir(f'/proc/{srv.proc.pid}/task'))}")
        for w in held + slow:
            w.transport.abort()
        deadline = time.time() + 60
        while time.time() < deadline:
            m = await metrics(srv.port)
            if not m.get("num_requests_running") and not m.get("num_requests_waiting"):
                break
            await asyncio.sleep(0.2)
        print(f"connections: after closing all: running {m.get('num_requests_running')}, waiting "
              f"{m.get('num_requests_waiting')}, kv blocks used {m.get('kv_cache_blocks_used')}")
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["soak", "abandon", "connections"])
    ap.add_argument("--latent", default=str(ROOT / "build/release/latent"))
    ap.add_argument("--model", default=None, help="model directory (default: latent's bundled demo model)")
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--connections", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--log", default=None, help="write the server's log here")
    args = ap.parse_args()
    if args.connections is None:
        args.connections = 4000 if args.mode == "abandon" else 10000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run({"soak": soak, "abandon": abandon, "connections": connections}[args.mode](args))


if __name__ == "__main__":
    main()
