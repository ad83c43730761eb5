"""One rank of scripts/p2p_stress.py's jobs: runs the job's program (every
rank derives the same one from --seed), checks every message it
receives, and prints its counts on a line that starts with P2P_STRESS.
Started with torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

#: Values a message may hold (3 say whose it is); most are small, as a
#: pipeline's control messages are.
SIZES = [3, 3, 10, 10, 100, 1000, 100_000]
#: Tags the tags phase draws from.
TAGS = [2, 3, 4, 5, 6]
#: Values of every message from any source (the receiver posts its
#: buffer before it knows the sender).
ANY_SIZE = 64


class Rank:
    """This rank's counts, and what it checks across phases."""

    def __init__(self, rank: int, world: int, seed: int):
        self.rank, self.world = rank, world
        #: This rank's own choices (send or isend, the order of waits):
        #: the shared draws stay the same on every rank.
        self.local = random.Random(seed * 1000 + rank)
        self.ops = 0
        self.bytes_received = 0
        #: The next sequence number of messages to each rank.
        self.sent_to = [0] * world
        #: Per (sender, tag): the last sequence number received.
        self.last_seq: dict[tuple[int, int], int] = {}
        #: Messages from any source, by sender: expected and received.
        self.any_expected = [0] * world
        self.any_received = [0] * world

    # A message: [sender, its sequence number to the receiver, tag], then
    # values that depend on all three.
    def message(self, to: int, tag: int, size: int) -> torch.Tensor:
        seq = self.sent_to[to]
        self.sent_to[to] += 1
        t = torch.full((size,), value(self.rank, seq, tag))
        t[:3] = torch.tensor([self.rank, seq, tag], dtype=torch.float32)
        return t

    def check(self, t: torch.Tensor, source: int, tag: int) -> None:
        """That ``t`` is ``source``'s next message with ``tag``: whole,
        and after the last one received from it with that tag."""
        sender, seq, got_tag = (int(v) for v in t[:3].tolist())
        assert (sender, got_tag) == (source, tag), (sender, got_tag, source, tag)
        assert bool((t[3:] == value(source, seq, tag)).all()), (source, seq, tag)
        last = self.last_seq.get((source, tag), -1)
        assert seq > last, f"from {source} tag {tag}: message {seq} after {last}"
        self.last_seq[source, tag] = seq
        self.bytes_received += t.numel() * 4
        self.ops += 1


def value(sender: int, seq: int, tag: int) -> float:
    return float(sender * 1000 + seq % 1000 + tag / 8)


def draw_sizes(rng: random.Random, n: int) -> list[int]:
    return [rng.choice(SIZES) for _ in range(n)]


def phase_any(me: Rank, rng: random.Random, scale: int) -> None:
    """One receiver, every other rank sends it a few messages (send and
    isend); it receives from any source (recv and irecv, alternately)."""
    receiver = rng.randrange(me.world)
    counts = {r: rng.randint(3, 12) * scale for r in range(me.world) if r != receiver}
    if me.rank == receiver:
        for r, n in counts.items():
            me.any_expected[r] += n
        for i in range(sum(counts.values())):
            t = torch.empty(ANY_SIZE)
            if i % 2:
                source = dist.recv(t, tag=1)
            else:
                work = dist.irecv(t, tag=1)
                work.wait()
                source = work._source_rank()
            me.check(t, source, 1)
            me.any_received[source] += 1
    else:
        works = []
        for _ in range(counts[me.rank]):
            t = me.message(receiver, 1, ANY_SIZE)
            if me.local.random() < 0.5:
                dist.send(t, receiver, tag=1)
            else:
                works.append(dist.isend(t, receiver, tag=1))
            me.ops += 1
        for w in works:
            w.wait()


def phase_tags(me: Rank, rng: random.Random, scale: int) -> None:
    """Every ordered pair: the sender isends messages of random tags in
    one order; the receiver irecvs them a tag at a time in another."""
    plan = {}
    for s in range(me.world):
        for d in range(me.world):
            if s != d:
                n = rng.randint(2, 6) * scale
                plan[s, d] = [(rng.choice(TAGS), size) for size in draw_sizes(rng, n)]
    tag_orders = {key: rng.sample(TAGS, len(TAGS)) for key in plan}
    works = []
    for (s, d), messages in plan.items():
        if s == me.rank:
            for tag, size in messages:
                works.append(dist.isend(me.message(d, tag, size), d, tag=tag))
                me.ops += 1
    received = []
    for (s, d), messages in plan.items():
        if d == me.rank:
            for tag in tag_orders[s, d]:
                for got_tag, size in messages:
                    if got_tag == tag:
                        t = torch.empty(size)
                        received.append((t, s, tag, dist.irecv(t, s, tag=tag)))
    for w in works:
        w.wait()
    for t, s, tag, w in received:
        w.wait()
        me.check(t, s, tag)


def phase_batch(me: Rank, rng: random.Random, scale: int) -> None:
    """batch_isend_irecv around the ring, a few tags a batch."""
    right, left = (me.rank + 1) % me.world, (me.rank - 1) % me.world
    for _ in range(rng.randint(2, 5) * scale):
        tags = rng.sample(range(10, 16), rng.randint(1, 3))
        sizes = draw_sizes(rng, len(tags))
        ops, got = [], []
        for tag, size in zip(tags, sizes):
            ops.append(dist.P2POp(dist.isend, me.message(right, tag, size), right, tag=tag))
        for tag, size in zip(tags, sizes):
            t = torch.empty(size)
            got.append((t, tag))
            ops.append(dist.P2POp(dist.irecv, t, left, tag=tag))
        rng.shuffle(ops)
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        me.ops += len(tags)
        for t, tag in got:
            me.check(t, left, tag)


def phase_waits(me: Rank, rng: random.Random, scale: int) -> None:
    """An isend to and an irecv from every other rank, several rounds
    posted at once, waited for in a random order."""
    rounds = rng.randint(1, 4) * scale
    sizes = {(s, d, i): rng.choice(SIZES) for s in range(me.world) for d in range(me.world)
             for i in range(rounds) if s != d}
    works, received = [], []
    for i in range(rounds):
        for peer in range(me.world):
            if peer == me.rank:
                continue
            t = me.message(peer, 20, sizes[me.rank, peer, i])
            works.append(dist.isend(t, peer, tag=20))
            r = torch.empty(sizes[peer, me.rank, i])
            works.append(dist.irecv(r, peer, tag=20))
            received.append((r, peer))
            me.ops += 1
    me.local.shuffle(works)
    for w in works:
        w.wait()
    for r, peer in received:
        me.check(r, peer, 20)


def phase_last(me: Rank, rng: random.Random, profile: bool) -> None:
    """Every rank but one sends its last message and returns at once; the
    one receives them from any source."""
    receiver = rng.randrange(me.world)
    if me.rank != receiver:
        t = me.message(receiver, 30, ANY_SIZE)
        if me.local.random() < 0.5:
            dist.send(t, receiver, tag=30)
        else:
            dist.isend(t, receiver, tag=30).wait()
        me.ops += 1
        return
    ctx = torch.autograd.profiler.profile() if profile else _nothing()
    with ctx:
        for i in range(me.world - 1):
            t = torch.empty(ANY_SIZE)
            work = dist.irecv(t, tag=30)
            if i == me.world - 2:
                # A callback that runs on the thread that completes the
                # receive, as the profiler's: the rank returns meanwhile.
                # (gloo's receives have no future.)
                try:
                    work.get_future().then(lambda f: time.sleep(0.05))
                except RuntimeError:
                    pass
            work.wait()
            me.check(t, work._source_rank(), 30)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--backend", default="gradlane")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.backend == "gradlane":
        import gradlane.torch  # noqa: F401 - registers the backend on any torch
    dist.init_process_group(args.backend)
    # The program: the same draws on every rank.
    rng = random.Random(args.seed)
    me = Rank(rank, world, args.seed)
    for _ in range(rng.randint(1, 3)):
        for phase in rng.sample([phase_any, phase_tags, phase_batch, phase_waits], 4):
            phase(me, rng, args.scale)
    assert me.any_received == me.any_expected, (me.any_received, me.any_expected)
    profile, destroy = rng.random() < 0.5, rng.random() < 0.5
    phase_last(me, rng, profile)
    print("P2P_STRESS " + json.dumps({"rank": rank, "ops": me.ops,
                                      "bytes_received": me.bytes_received,
                                      "profile": profile, "destroy": destroy}), flush=True)
    if destroy:
        dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
