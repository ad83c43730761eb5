"""Bulk TCP flows for scripts/tta_bench.sh's competing-traffic conditions.

``sink --port P`` accepts connections and discards what they send;
``send --to HOST:PORT`` connects (retrying until the sink is up) and
sends as fast as TCP lets it until killed, reconnecting if the
connection breaks. ``tenant --to HOST:PORT --on-ms A --off-ms B --seed S``
is another tenant's bulk collective on a shared cloud: it sends as fast
as TCP lets it, on ``--flows`` connections at once, for a random time
(exponential, mean A ms), then stays silent for another (mean B ms), and
again, from its seed. All run until killed.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import threading
import time


def sink(port: int) -> None:
    srv = socket.create_server(("0.0.0.0", port), reuse_port=True)

    def drain(conn: socket.socket) -> None:
        with conn:
            while conn.recv(1 << 20):
                pass

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def send(to: str) -> None:
    host, port = to.rsplit(":", 1)
    block = bytes(1 << 20)
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=5) as conn:
                conn.settimeout(None)
                while True:
                    conn.sendall(block)
        except OSError:
            time.sleep(0.2)


def tenant(to: str, on_ms: float, off_ms: float, seed: int, flows: int) -> None:
    host, port = to.rsplit(":", 1)
    rng = random.Random(seed)
    block = bytes(64 << 10)
    conns: list[socket.socket | None] = [None] * flows

    def burst(i: int, until: float) -> None:
        try:
            if conns[i] is None:
                c = socket.create_connection((host, int(port)), timeout=5)
                c.settimeout(None)
                conns[i] = c
            while time.monotonic() < until:
                conns[i].sendall(block)
        except OSError:
            if conns[i] is not None:
                conns[i].close()
            conns[i] = None

    while True:
        time.sleep(rng.expovariate(1000.0 / off_ms))
        until = time.monotonic() + rng.expovariate(1000.0 / on_ms)
        threads = [threading.Thread(target=burst, args=(i, until)) for i in range(flows)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sink", help="accept and discard")
    s.add_argument("--port", type=int, required=True)
    t = sub.add_parser("send", help="send to a sink until killed")
    t.add_argument("--to", required=True, help="HOST:PORT of the sink")
    u = sub.add_parser("tenant", help="send to a sink in bursts, on and off at random")
    u.add_argument("--to", required=True, help="HOST:PORT of the sink")
    u.add_argument("--on-ms", type=float, required=True, help="mean length of a burst")
    u.add_argument("--off-ms", type=float, required=True, help="mean pause between bursts")
    u.add_argument("--seed", type=int, default=0, help="the bursts' random seed")
    u.add_argument("--flows", type=int, default=1,
                   help="connections a burst sends on at once (a collective of several)")
    args = p.parse_args()
    if args.mode == "sink":
        sink(args.port)
    elif args.mode == "send":
        send(args.to)
    else:
        tenant(args.to, args.on_ms, args.off_ms, args.seed, args.flows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
