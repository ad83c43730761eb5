# Sourced on the GPU host, in the checkout's root, after scripts/gpu_pack.sh's
# target/gpu was carried there (docs/GPU.md):
#
#   source scripts/gpu_env.sh
#
# Puts the unpacked network tools on PATH (with their libraries and
# iptables' extensions), the carried binaries where the scripts look for
# them (target/release), and installs the gradlane wheel into the
# interpreter PY (default python3; no network needed). Then
# scripts/testbed.sh and scripts/tta_bench.sh run unchanged (PY set).

GPU_DIR=${GPU_DIR:-$PWD/target/gpu}
if [[ ! -d $GPU_DIR/tools || ! -d $GPU_DIR/bin ]]; then
    echo "gpu_env: no $GPU_DIR/tools or bin; run scripts/gpu_pack.sh where cargo is and carry target/gpu" >&2
    return 2 2>/dev/null || exit 2
fi
T=$GPU_DIR/tools
# iptables is one multi-call binary; Debian makes the name a link through
# alternatives, which dpkg -x does not run. The kernel's legacy tables
# are what scripts/testbed.sh uses.
ln -sf xtables-legacy-multi "$T/usr/sbin/iptables"
ln -sf xtables-legacy-multi "$T/usr/sbin/iptables-save"
export PATH="$T/usr/sbin:$T/sbin:$T/usr/bin:$T/bin:$PATH"
export LD_LIBRARY_PATH="$T/usr/lib/x86_64-linux-gnu:$T/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export XTABLES_LIBDIR="$T/usr/lib/x86_64-linux-gnu/xtables"
mkdir -p target/release
cp -f "$GPU_DIR"/bin/* target/release/
export PY=${PY:-$(command -v python3)}
"$PY" -m pip install --quiet --no-deps --no-index --force-reinstall "$GPU_DIR"/wheels/*.whl ||
    "$PY" -m pip install --quiet --no-deps --no-index --force-reinstall --break-system-packages "$GPU_DIR"/wheels/*.whl
for tool in ip tc iptables ethtool; do
    command -v "$tool" >/dev/null || { echo "gpu_env: $tool does not run" >&2; return 2 2>/dev/null || exit 2; }
done
"$PY" -c 'import gradlane.torch, sklearn, torch; print("gpu_env: gradlane", gradlane.__file__, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
