"""The two-host torchrun walkthrough as README.md gives it ("Across two
hosts"): its commands, read from README so that what is run cannot drift
from what a user reads, and the check of what the job printed.

Two runners use it: scripts/two_host_walkthrough.sh (as root, two
namespaces of scripts/testbed.sh as the hosts) and
python/tests/test_two_host_walkthrough.py (no root, both "hosts" on
loopback). Standard library only: the script's --dry-run runs it with any
python3.

    python3 scripts/two_host_commands.py commands [--master-addr IP] [--master-port P]
        one line per step: "certs ARGS" (what follows `--` in README's
        certs command), "copy DIR FILE..." (the directory it writes and the
        files that go to the other hosts), then "host N COMMAND" per host,
        README's line with the master address and port replaced
    python3 scripts/two_host_commands.py check [--target A] LOG...
        the output of every host's torchrun: exits nonzero, saying why,
        unless rank 0's test accuracy reached the target and every rank
        printed the same parameters
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import shlex
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTION = "Across two hosts"
#: The accuracy the digits example must reach, as in
#: python/tests/test_example_digits.py.
TARGET_ACCURACY = 0.95
#: What the copy step carries to the other host: the files the backend
#: reads from GRADLANE_CERT_DIR. ca.key, which signs more certificates,
#: stays where the certificates were made.
COPIED = ("ca.pem", "server.pem", "server.key")


class WalkthroughError(Exception):
    """README's walkthrough is not in the form this reads, or its job's
    output does not show success."""


@dataclasses.dataclass
class Walkthrough:
    #: README's certs command, and its line number.
    certs: str
    certs_line: int
    #: README's torchrun command per host (node rank), and its line.
    hosts: dict[int, tuple[int, str]]

    def certs_args(self) -> list[str]:
        """The certs program's arguments: what follows `--`."""
        words = shlex.split(self.certs)
        return words[words.index("--") + 1 :]

    def cert_dir(self) -> str:
        """The directory the certs command writes (its --out-dir)."""
        return flag_value(self.certs_args(), "--out-dir", self.certs_line)

    def job(self) -> str:
        return flag_value(self.certs_args(), "--job", self.certs_line)

    def host_command(self, node: int, master_addr: str | None, master_port: int | None) -> str:
        """Host `node`'s command as README gives it, with the master's
        address and port replaced when given (the rest, `$PWD` included,
        left for the shell)."""
        text = self.hosts[node][1]
        if master_addr is not None:
            text = re.sub(r"(--master-addr[= ])\S+", rf"\g<1>{master_addr}", text)
        if master_port is not None:
            text = re.sub(r"(--master-port[= ])\S+", rf"\g<1>{master_port}", text)
        return text


def flag_value(words: list[str], flag: str, line: int) -> str:
    for i, w in enumerate(words):
        if w == flag and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    raise WalkthroughError(f"README.md:{line}: the command has no {flag}")


def code_lines(text: str, section: str = SECTION) -> list[tuple[int, str]]:
    """(line number, command) of the indented code lines under the `##`
    heading `section`."""
    lines = text.splitlines()
    out, inside, found = [], False, False
    for i, line in enumerate(lines, 1):
        if line.startswith("## "):
            inside = line[3:].strip() == section
            found = found or inside
            continue
        if inside and line.startswith("    ") and line.strip():
            out.append((i, line.strip()))
    if not found:
        raise WalkthroughError(f"README.md has no section '## {section}'")
    return out


def walkthrough(path: pathlib.Path = README) -> Walkthrough:
    """README's walkthrough: one certs command and one torchrun command per
    host, node ranks 0 to --nnodes - 1, lines that differ only in their
    --node-rank (else an error naming the line)."""
    lines = code_lines(path.read_text())
    certs = [(n, t) for n, t in lines if re.search(r"--bin certs\b", t)]
    if len(certs) != 1:
        raise WalkthroughError(
            f"README.md '## {SECTION}' must hold one certs command, not {len(certs)}"
        )
    hosts: dict[int, tuple[int, str]] = {}
    for n, t in lines:
        words = shlex.split(t)
        if "torchrun" not in words:
            continue
        node = flag_value(words, "--node-rank", n)
        if not node.isdigit() or int(node) in hosts:
            raise WalkthroughError(f"README.md:{n}: --node-rank {node} is not a new node rank")
        hosts[int(node)] = (n, t)
    if not hosts:
        raise WalkthroughError(f"README.md '## {SECTION}' has no torchrun command")
    for n, t in hosts.values():
        nnodes = flag_value(shlex.split(t), "--nnodes", n)
        if nnodes != str(len(hosts)) or sorted(hosts) != list(range(len(hosts))):
            raise WalkthroughError(
                f"README.md:{n}: --nnodes {nnodes}, but the section gives node ranks "
                f"{sorted(hosts)}"
            )
    first_line, first = hosts[0]
    for n, t in hosts.values():
        if re.sub(r"--node-rank[= ]\d+", "", t) != re.sub(r"--node-rank[= ]\d+", "", first):
            raise WalkthroughError(
                f"README.md:{n} differs from README.md:{first_line} in more than --node-rank"
            )
    return Walkthrough(certs[0][1], certs[0][0], hosts)


@dataclasses.dataclass
class Outcome:
    world: int
    #: (step, seconds, accuracy) of rank 0's evaluations.
    evaluations: list[tuple[int, float, float]]
    checksum: str

    def summary(self, target: float) -> str:
        step, seconds, acc = next(e for e in self.evaluations if e[2] >= target)
        last = self.evaluations[-1]
        return (
            f"test accuracy {acc:.3f} >= {target} first at step {step} ({seconds:.1f} s); "
            f"{last[2]:.3f} at the last step, {last[0]} ({last[1]:.1f} s); "
            f"all {self.world} ranks' parameters {self.checksum}"
        )


def check(outputs: list[str], target: float = TARGET_ACCURACY) -> Outcome:
    """What the hosts' torchrun printed (examples/torch/train_digits.py's
    lines, any prefix before them): an error unless rank 0's test
    accuracy reached `target` and every rank of the job printed the same
    parameters' checksum."""
    text = "\n".join(outputs)
    evaluations = [
        (int(s), float(t), float(a))
        for s, t, a in re.findall(
            r"step (\d+): ([0-9.]+) s, train loss [0-9.]+, test accuracy ([0-9.]+)", text
        )
    ]
    if not evaluations:
        raise WalkthroughError("no 'step N: ... test accuracy A' line: rank 0 did not train")
    if not any(a >= target for _, _, a in evaluations):
        best = max(a for _, _, a in evaluations)
        raise WalkthroughError(f"test accuracy never reached {target} (best {best:.3f})")
    sums = re.findall(r"rank (\d+) of (\d+): parameters ([0-9a-f]+)", text)
    if not sums:
        raise WalkthroughError("no 'rank R of N: parameters X' line: no rank finished")
    world = int(sums[0][1])
    ranks = sorted(int(r) for r, _, _ in sums)
    if ranks != list(range(world)) or any(int(n) != world for _, n, _ in sums):
        raise WalkthroughError(f"ranks {ranks} printed their parameters, of a world of {world}")
    distinct = {c for _, _, c in sums}
    if len(distinct) != 1:
        raise WalkthroughError(f"the ranks ended with different parameters: {sums}")
    return Outcome(world, evaluations, distinct.pop())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("commands", help="README's commands, one a line")
    c.add_argument("--readme", type=pathlib.Path, default=README)
    c.add_argument("--master-addr", help="in place of README's --master-addr")
    c.add_argument("--master-port", type=int, help="in place of README's --master-port")
    k = sub.add_parser("check", help="the hosts' output shows success")
    k.add_argument("--target", type=float, default=TARGET_ACCURACY)
    k.add_argument("logs", nargs="+", type=pathlib.Path)
    args = p.parse_args()
    try:
        if args.what == "commands":
            w = walkthrough(args.readme)
            print("certs", shlex.join(w.certs_args()))
            print("copy", w.cert_dir(), *COPIED)
            for node in sorted(w.hosts):
                print("host", node, w.host_command(node, args.master_addr, args.master_port))
        else:
            outcome = check([log.read_text() for log in args.logs], args.target)
            print(outcome.summary(args.target))
    except WalkthroughError as e:
        print(f"two_host_commands: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
