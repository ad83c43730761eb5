"""``python -m gradlane certs``: a job's certificates from the wheel alone,
the same four files as the Rust ``certs`` tool (no cargo, no checkout).

    python -m gradlane certs --job my-job --out-dir certs
    python -m gradlane certs --san 10.0.0.1 --san 10.0.0.2 --out-dir certs
    python -m gradlane certs --job my-job --ca ca-dir --out-dir certs

Then give every rank the directory: ``export GRADLANE_CERT_DIR=$PWD/certs``.
"""

from __future__ import annotations

import argparse
import os
import sys

import gradlane

#: What ``certs`` writes; with ``--ca`` the CA's key stays where it is.
FILES = ("ca.pem", "ca.key", "server.pem", "server.key")


def certs_parser(sub) -> None:
    p = sub.add_parser(
        "certs",
        help="write ca.pem, ca.key, server.pem and server.key (keys mode 0600)",
        description="Write ca.pem, ca.key, server.pem and server.key (keys mode 0600): "
        "for a job (--job, any address) or for the addresses given (--san).",
    )
    p.add_argument("--out-dir", default="certs", help="directory to write the files into (default: certs)")
    p.add_argument(
        "--san",
        action="append",
        dest="sans",
        metavar="NAME",
        help="a DNS name or IP address the server certificate is valid for; repeat for several "
        "(default: localhost 127.0.0.1 ::1)",
    )
    p.add_argument(
        "--job",
        help="a certificate for this job instead of names or addresses: the job's ranks "
        "check each other by it, on any address",
    )
    p.add_argument(
        "--ca",
        metavar="DIR",
        help="with --job: sign with the CA (ca.pem, ca.key) in DIR instead of a fresh one; "
        "ca.key is not copied",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace certificates and keys already in the directory (every certificate the old "
        "CA signed stops being trusted by ranks given the new ca.pem)",
    )


def certs(args) -> int:
    if args.job is not None and args.sans:
        print("gradlane certs: --job and --san exclude each other", file=sys.stderr)
        return 2
    if args.ca is not None and args.job is None:
        print("gradlane certs: --ca needs --job", file=sys.stderr)
        return 2
    if args.ca is not None and os.path.realpath(args.ca) == os.path.realpath(args.out_dir):
        print(
            "gradlane certs: --out-dir must be another directory than --ca "
            "(it goes to every rank; the CA's key must not)",
            file=sys.stderr,
        )
        return 2
    writes = [f for f in FILES if not (args.ca is not None and f == "ca.key")]
    existing = [os.path.join(args.out_dir, f) for f in writes]
    existing = [p for p in existing if os.path.exists(p)]
    if existing and not args.force:
        print(
            f"gradlane certs: {', '.join(existing)} already exist; not replacing them without --force",
            file=sys.stderr,
        )
        return 1
    try:
        if args.job is not None:
            files = gradlane.generate_job_certs(args.out_dir, args.job, args.ca)
            valid_for = f"the job {args.job.lower()!r}, on any address"
        else:
            sans = args.sans or ["localhost", "127.0.0.1", "::1"]
            files = gradlane.generate_certs(args.out_dir, sans)
            valid_for = ", ".join(sans)
    except (ValueError, OSError) as e:
        print(f"gradlane certs: {e}", file=sys.stderr)
        return 1
    print(f"server certificate valid for: {valid_for}")
    print(f"wrote {files['ca_cert']}  (CA certificate: give to every rank)")
    if args.ca is not None:
        print(f"signed by {files['ca_key']}  (CA key, not copied)")
    else:
        print(f"wrote {files['ca_key']}  (CA key: keep private)")
    print(f"wrote {files['server_cert']}  (server certificate)")
    print(f"wrote {files['server_key']}  (server key)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradlane", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    certs_parser(sub)
    args = parser.parse_args(argv)
    return certs(args)


if __name__ == "__main__":
    sys.exit(main())
