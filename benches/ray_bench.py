"""Total generated tokens per second of ``tallow serve --replicas N`` (Ray Serve, one thread per
replica) at many concurrent clients, with one ``tallow serve`` using every core as the
reference.

Each configuration is a fresh server process on a free port. ``--clients`` clients send
``--requests`` completions each, one after the other (sampled, ``--tokens`` tokens each, the
end-of-generation token ignored so that every request generates the same number); the figure
is all the tokens generated over the wall time from the first request to the last answer.

    python benches/ray_bench.py [-m MODEL] [--clients 32] [--requests 2] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(args: list[str]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tallow", "serve", "--port", str(port), "--log-level", "warning"]
        + args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tallow serve {' '.join(args)} did not start")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def tokens_per_second(url: str, model: str, clients: int, requests: int, tokens: int) -> float:
    def client(i: int) -> int:
        made = 0
        with httpx.Client(timeout=600) as http:
            for j in range(requests):
                body = {
                    "model": model,
                    "prompt": f"Story {i}-{j}: once upon a time,",
                    "max_tokens": tokens,
                    "temperature": 0.8,
                    "seed": 1000 * i + j,
                    "ignore_eos": True,
                }
                r = http.post(f"{url}/v1/completions", json=body)
                r.raise_for_status()
                made += r.json()["usage"]["completion_tokens"]
        return made

    client(clients)  # warm up
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        made = sum(pool.map(client, range(clients)))
    return made / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request")
    args = parser.parse_args()
    common = ["-m", args.model, "--ctx", "512", "--max-batch", str(args.clients)]
    cores = os.cpu_count() or 1
    configurations = [
        (f"tallow serve, {cores} threads", common),
        ("1 replica, 1 thread", [*common, "--replicas", "1", "--threads", "1"]),
        ("2 replicas, 1 thread each", [*common, "--replicas", "2", "--threads", "1"]),
    ]
    print(
        f"model {args.model}, {args.clients} clients x {args.requests} requests x "
        f"{args.tokens} tokens"
    )
    print(f"{'configuration':>28}  tok/s")
    for name, serve_args in configurations:
        with server(serve_args) as url:
            rate = tokens_per_second(url, args.model, args.clients, args.requests, args.tokens)
        print(f"{name:>28}  {rate:6.1f}", flush=True)


if __name__ == "__main__":
    main()
