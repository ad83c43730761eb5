# Sourced by the testbed benches (elastic_bench.sh, tta_bench.sh,
# allreduce_bottleneck.sh), from the repository root, after
# target/release/certs is built.

# testbed_certs DIR RANKS: a CA and one server certificate in DIR that
# names every rank's testbed address, 10.77.0.1 to 10.77.0.RANKS
# (scripts/testbed.sh gives rank R 10.77.0.(R+1)), so that each rank
# serves the same certificate.
testbed_certs() {
    local dir=$1 ranks=$2 r
    local sans=()
    for r in $(seq 1 "$ranks"); do sans+=(--san "10.77.0.$r"); done
    ./target/release/certs --out-dir "$dir" "${sans[@]}" >/dev/null
}
