#!/usr/bin/env bash
# Packs what the time-to-accuracy testbed needs on a GPU host that has no
# cargo, no network tools and no network (docs/GPU.md), into target/gpu
# (one folder to carry, about 30 MB):
#
#   target/gpu/bin/      stripped release binaries: certs, delay_stage
#   target/gpu/wheels/   the gradlane wheel (abi3: any CPython from 3.11)
#   target/gpu/pywheels/ pytest and its dependencies, for gpu_tests.sh
#   target/gpu/tools/    Debian's iproute2, iptables and ethtool with the
#                        libraries they need, unpacked (dpkg -x)
#   target/gpu/BUILD     the build, for runs.csv (the tree there has no .git)
#
#   bash scripts/gpu_pack.sh
#
# Runs here (root for apt-get, which fetches the packages without
# installing them). There: `source scripts/gpu_env.sh` puts it all in place.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=target/gpu
VENV=${VENV:-.venv-test}
# The tools and every library of theirs a plain Ubuntu or Debian host may
# lack (glibc and the like are everywhere).
PACKAGES=(iproute2 iptables ethtool libbpf1 libelf1 libmnl0 libcap2 libxtables12
    libip4tc2 libip6tc2 libnfnetlink0 libnetfilter-conntrack3 libnftnl11 libdb5.3
    libbsd0 libmd0 libtirpc3 libtirpc-common)

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/wheels" "$OUT/pywheels" "$OUT/tools" "$OUT/debs"

echo "== release binaries" >&2
cargo build --quiet --release --bin certs --bin delay_stage
for b in certs delay_stage; do
    strip -o "$OUT/bin/$b" "target/release/$b"
done

echo "== the wheel" >&2
[[ -x $VENV/bin/maturin ]] || die_venv=1
if [[ ${die_venv:-0} == 1 ]]; then
    echo "gpu_pack: $VENV has no maturin; run 'bash scripts/test.sh' first or set VENV" >&2
    exit 2
fi
PATH="$(realpath "$VENV")/bin:$PATH" "$VENV/bin/maturin" build --quiet --release --strip \
    -m python/Cargo.toml -o "$OUT/wheels" >&2

echo "== pytest's wheels, for scripts/gpu_tests.sh" >&2
"$VENV/bin/python" -m pip download --quiet --dest "$OUT/pywheels" pytest >&2

echo "== network tools (Debian packages, unpacked)" >&2
(cd "$OUT/debs" && { apt-get download "${PACKAGES[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get download "${PACKAGES[@]}" >/dev/null; }; })
for deb in "$OUT"/debs/*.deb; do
    dpkg -x "$deb" "$OUT/tools"
done
rm -rf "$OUT/debs" "$OUT/tools/usr/share/doc" "$OUT/tools/usr/share/man"

echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- examples python gradlane scripts || echo +changes)" >"$OUT/BUILD"
du -sh "$OUT" >&2
echo "gpu_pack: carry target/gpu (device tool: carry=[\"target/gpu\"]), then: source scripts/gpu_env.sh" >&2
