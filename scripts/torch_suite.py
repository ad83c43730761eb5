"""torch's own distributed test suite over gloo and over gradlane, on the
same tests, and the comparison.

For each world size it runs the suite (scripts/torch_suite_driver.py,
torch's spawn driver rebuilt for the installed torch) over gloo, then over
gradlane on the tests gloo passed, and prints, per world size, the counts
and every test gradlane fails with the first line of its error. A
JSON summary goes to --out.

    python scripts/torch_suite.py --ranks 2 3
    python scripts/torch_suite.py --ranks 2 -k "reduce or gather"

Needs torch and gradlane importable by the interpreter that runs it
(scripts/torch_suite.sh uses the test venv), and pytest with xdist.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

DRIVER = Path(__file__).with_name("torch_suite_driver.py")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 3], help="world sizes to run")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k filter on test names")
    p.add_argument("--workers", type=int, default=3, help="tests run side by side (pytest-xdist)")
    p.add_argument("--backends", nargs="+", default=["gloo", "gradlane"],
                   help="the first is the reference; the others run the tests it passed")
    p.add_argument("--out", type=Path, default=None, help="JSON summary (default: none)")
    p.add_argument("--reference-from", type=Path, default=None,
                   help="take the reference backend's outcomes from an earlier --out file "
                        "instead of running it again")
    p.add_argument("--cert-dir", default=None,
                   help="GRADLANE_CERT_DIR for gradlane (default: made in a temporary directory)")
    return p.parse_args()


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """Test name -> (passed | failed | skipped, first line of why)."""
    got = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        status, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
                why = first_error_line((child.text or "") + "\n" + (child.get("message") or ""))
            elif child.tag == "skipped":
                status = "skipped"
                why = (child.get("message") or "").splitlines()[0] if child.get("message") else ""
        got[name] = (status, why)
    return got


def first_error_line(text: str) -> str:
    """The rank's exception (the last one pytest's report shows), where the
    suite's message carries one."""
    lines = [re.sub(r"^E\s+", "", l.strip()) for l in text.splitlines() if l.strip()]
    errors = [
        l for l in lines
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt|Failure):", l)
        and "exited with error code" not in l
    ]
    if errors:
        return errors[-1][:200]
    return lines[0][:200] if lines else ""


def keyword_matches(keyword: str, name: str) -> bool:
    """pytest's -k on a bare test name: words joined by and, or, not."""
    words = re.findall(r"\(|\)|\w+", keyword)
    expr = " ".join(w if w in ("and", "or", "not", "(", ")") else repr(w in name) for w in words)
    return bool(eval(expr))  # noqa: S307 - built from True/False and operators only


def run_suite(backend: str, world: int, tests: list[str] | None, keyword: str | None,
              workers: int, env: dict, work: Path) -> dict[str, tuple[str, str]]:
    junit = work / f"{backend}-{world}.xml"
    cmd = [sys.executable, "-m", "pytest", str(DRIVER), "-p", "no:cacheprovider", "-q",
           "-n", str(workers), f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    if keyword:
        cmd += ["-k", keyword]
    listing = None
    if tests is not None:
        if not tests:
            return {}
        listing = work / f"{backend}-{world}.tests"
        listing.write_text("".join(f"{DRIVER}::TestDistBackendWithSpawn::{t}\n" for t in tests))
        cmd = [c for c in cmd if c != str(DRIVER)] + [f"@{listing}"]
    run_env = dict(env, GRADLANE_SUITE_BACKEND=backend, WORLD_SIZE=str(world),
                   TEMP_DIR=tempfile.mkdtemp(prefix=f"suite-{backend}-{world}-"))
    started = time.time()
    print(f"== {backend}, {world} ranks: {len(tests) if tests is not None else 'all'} tests", flush=True)
    log = work / f"{backend}-{world}.log"
    with open(log, "w") as f:
        subprocess.run(cmd, env=run_env, stdout=f, stderr=subprocess.STDOUT, check=False)
    got = outcomes(junit) if junit.exists() else {}
    counts = {s: sum(1 for v in got.values() if v[0] == s) for s in ("passed", "failed", "skipped")}
    print(f"   {counts} in {time.time() - started:.0f} s (log {log})", flush=True)
    return got


def main():
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="torch-suite-"))
    env = dict(os.environ)
    if "gradlane" in args.backends and not args.cert_dir:
        import gradlane

        args.cert_dir = str(work / "certs")
        gradlane.generate_job_certs(args.cert_dir, "torch-suite")
    if args.cert_dir:
        env["GRADLANE_CERT_DIR"] = args.cert_dir
    reference, others = args.backends[0], args.backends[1:]
    earlier = json.loads(args.reference_from.read_text()) if args.reference_from else {}
    summary = {}
    for world in args.ranks:
        if str(world) in earlier:
            ref = {t: tuple(v) for t, v in earlier[str(world)][reference].items()}
            if args.keyword:
                ref = {t: v for t, v in ref.items() if keyword_matches(args.keyword, t)}
        else:
            ref = run_suite(reference, world, None, args.keyword, args.workers, env, work)
        passed = sorted(t for t, (s, _) in ref.items() if s == "passed")
        row = {reference: ref}
        for backend in others:
            row[backend] = run_suite(backend, world, passed, None, args.workers, env, work)
        summary[world] = row

    print()
    print("| ranks | backend | passed | failed | skipped |")
    print("|---:|---|---:|---:|---:|")
    for world, row in summary.items():
        for backend, got in row.items():
            c = [sum(1 for v in got.values() if v[0] == s) for s in ("passed", "failed", "skipped")]
            print(f"| {world} | {backend} | {c[0]} | {c[1]} | {c[2]} |")
    for world, row in summary.items():
        for backend in others:
            failed = {t: why for t, (s, why) in row[backend].items() if s != "passed"}
            if failed:
                print(f"\n{backend}, {world} ranks, not passed where {reference} passed ({len(failed)}):")
                for t, why in sorted(failed.items()):
                    print(f"  {t}: {row[backend][t][0]}: {why}")
    if args.out:
        args.out.write_text(json.dumps(
            {str(w): {b: {t: list(v) for t, v in got.items()} for b, got in row.items()}
             for w, row in summary.items()}, indent=1))
    bad = sum(1 for row in summary.values() for b in others
              for s, _ in row[b].values() if s != "passed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
