"""A bulk TCP flow for scripts/tta_bench.sh's competing-traffic condition.

``sink --port P`` accepts connections and discards what they send;
``send --to HOST:PORT`` connects (retrying until the sink is up) and
sends as fast as TCP lets it until killed, reconnecting if the
connection breaks. Both run until killed.
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sink", help="accept and discard")
    s.add_argument("--port", type=int, required=True)
    t = sub.add_parser("send", help="send to a sink until killed")
    t.add_argument("--to", required=True, help="HOST:PORT of the sink")
    args = p.parse_args()
    sink(args.port) if args.mode == "sink" else send(args.to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
