#!/usr/bin/env bash
# A lossy, rate-limited cluster on one host: RANKS network namespaces
# (gl-tb-rank0, gl-tb-rank1, ...), each with a veth whose peer is a port of
# a Linux bridge in a hub namespace (gl-tb-hub), so the host's own network
# is never touched. Rank R has 10.77.0.(R+1)/24, MTU 1500. Each rank's
# egress is an HTB class of RATE in front of a tail-drop queue of
# QUEUE_BYTES; each rank's input drops packets at random with probability
# LOSS (iptables statistic on INPUT, so TCP and QUIC meet the same loss;
# this kernel has no netem). With DELAY_MS > 0 every packet arriving at a
# rank is held DELAY_MS (+- JITTER_MS) by a user-space delay stage on an
# NFQUEUE (target/release/delay_stage), so any two ranks see an RTT of
# 2 x DELAY_MS. COMMAND then runs in every rank namespace at
# once with torchrun's environment, and everything is torn down on exit,
# Ctrl-C included.
#
#   sudo bash scripts/testbed.sh -- python3 train.py          # 4 ranks, 1 Gbit/s, lossless
#   RANKS=2 RATE=200mbit LOSS=0.05 sudo -E bash scripts/testbed.sh -- ./target/release/allreduce_bench
#   sudo bash scripts/testbed.sh --ranks 4 --loss 0.01 --cc bbr --dscp-priority -- python3 train.py
#
# Options (each also from the environment variable named after it):
#   --ranks N          RANKS, number of ranks (default 4, at most 253)
#   --rate R           RATE, HTB rate (and ceil) of each rank's egress, a tc
#                      rate with a unit: 1gbit, 200mbit, ... (default 1gbit)
#   --queue-bytes B    QUEUE_BYTES, bfifo limit in front of it (default 1000000)
#   --loss P           LOSS, drop probability on each rank's input (default 0)
#   --delay-ms D       DELAY_MS, one-way delay added on each rank's ingress in
#                      milliseconds (default 0: no delay stage); RTT = 2 x D.
#                      Builds target/release/delay_stage if missing (cargo
#                      build --release --bin delay_stage)
#   --jitter-ms J      JITTER_MS, each packet's delay uniform in [D-J, D+J],
#                      without reordering (default 0)
#   --port P           PORT, MASTER_PORT handed to the command (default 29500)
#   --cc NAME          TCP_CC, TCP congestion control inside the namespaces:
#                      cubic (default) or bbr. Set explicitly, since a new
#                      namespace inherits the host's default (bbr on this
#                      host); if the host's tcp_allowed_congestion_control
#                      lacks TCP_CC, it is added for the run and restored.
#   --dscp-priority    DSCP_PRIORITY=1: two HTB classes under the rate; packets
#                      whose DSCP is in PRIORITY_DSCP (default "46", EF; a
#                      space-separated list, as gradlane's --dscp marks) go
#                      to the class of prio 0 with a rate of RATE less
#                      LOW_SHARE percent (default 5), the rest to a class of
#                      prio 1 with LOW_SHARE percent; both borrow up to RATE.
#   --log-dir D        LOG_DIR: rank R's stdout and stderr to D/rankR.log
#                      instead of the terminal with a "[rank R] " prefix
#   --grace S          GRACE: when one rank fails, the others are killed after
#                      S seconds (default 30)
#   --dry-run          DRY_RUN=1: check the options, print what would run and
#                      exit (needs no root; touches nothing)
#   --wait-lock        WAIT_LOCK=1: if another testbed is running, wait for it
#                      to end instead of exiting
#   OFFLOADS=off|on    TSO/GSO/GRO of the veths (default off: the stack cuts
#                      segments of MTU size before the queue, so a loss or a
#                      tail drop hits one 1500-byte packet, not a 64 KB batch)
#
# The command's environment: MASTER_ADDR=10.77.0.1, MASTER_PORT, WORLD_SIZE,
# RANK, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, GROUP_RANK=RANK,
# GRADLANE_RANK_ADDR (this rank's address), GLOO_SOCKET_IFNAME (the veth,
# unless set) and PYTHONUNBUFFERED=1 (unless set). It runs as the invoking
# user (root). The exit status is nonzero if any rank fails. At the end,
# per rank on stderr: the egress queue's drops, iptables' drops and accepted
# packets on input (the real loss rate) and the packets the veth received,
# and with a delay the delay stage's own line (packets delayed, the most
# held at once, the kernel's drops on its queue).
# The kernel's random drops are not seeded: two runs lose different packets.
#
# Needs root; installs iproute2, iptables and ethtool if missing. One
# testbed at a time (a lock, /run/lock/gl-tb.lock); namespaces left by a
# crashed run are removed at start.
set -euo pipefail

PREFIX=gl-tb
HUB=$PREFIX-hub
BRIDGE=$PREFIX-br
DEV=$PREFIX-eth # each rank's veth, inside its namespace
SUBNET=10.77.0

RANKS=${RANKS:-4}
RATE=${RATE:-1gbit}
QUEUE_BYTES=${QUEUE_BYTES:-1000000}
LOSS=${LOSS:-0}
DELAY_MS=${DELAY_MS:-0}
JITTER_MS=${JITTER_MS:-0}
PORT=${PORT:-29500}
TCP_CC=${TCP_CC:-cubic}
DSCP_PRIORITY=${DSCP_PRIORITY:-0}
PRIORITY_DSCP=${PRIORITY_DSCP:-46}
LOW_SHARE=${LOW_SHARE:-5}
LOG_DIR=${LOG_DIR:-}
GRACE=${GRACE:-30}
OFFLOADS=${OFFLOADS:-off}
DRY_RUN=${DRY_RUN:-0}
WAIT_LOCK=${WAIT_LOCK:-0}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

die() {
    echo "testbed: $*" >&2
    exit 2
}

while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --ranks) RANKS=${2:?--ranks needs a value}; shift 2 ;;
        --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
        --queue-bytes) QUEUE_BYTES=${2:?--queue-bytes needs a value}; shift 2 ;;
        --loss) LOSS=${2:?--loss needs a value}; shift 2 ;;
        --delay-ms) DELAY_MS=${2:?--delay-ms needs a value}; shift 2 ;;
        --jitter-ms) JITTER_MS=${2:?--jitter-ms needs a value}; shift 2 ;;
        --port) PORT=${2:?--port needs a value}; shift 2 ;;
        --cc) TCP_CC=${2:?--cc needs a value}; shift 2 ;;
        --dscp-priority) DSCP_PRIORITY=1; shift ;;
        --log-dir) LOG_DIR=${2:?--log-dir needs a value}; shift 2 ;;
        --grace) GRACE=${2:?--grace needs a value}; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --wait-lock) WAIT_LOCK=1; shift ;;
        --) shift; break ;;
        *) die "unknown option '$1' (the command goes after --; see --help)" ;;
    esac
done
(($#)) || die "no command given: scripts/testbed.sh [options] -- COMMAND ARGS... (see --help)"

# Bits per second of a tc rate with a unit (bit, kbit, mbit, gbit, tbit or
# bps, kbps, mbps, gbps in bytes); empty if it does not parse.
rate_bits() {
    awk -v r="$1" 'BEGIN {
        if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit
        n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
        m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
        m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
        if (u in m && n > 0) printf "%.0f\n", n * m[u] }'
}

# True if $1 is a whole number in [$2, $3].
int_in() { [[ $1 =~ ^[0-9]+$ ]] && ((10#$1 >= $2 && 10#$1 <= $3)); }

int_in "$RANKS" 1 253 || die "RANKS must be 1..253, not '$RANKS'"
RATE_BITS=$(rate_bits "$RATE")
[[ -n $RATE_BITS ]] || die "RATE must be a tc rate with a unit (1gbit, 200mbit, ...), not '$RATE'"
int_in "$QUEUE_BYTES" 1514 1000000000 || die "QUEUE_BYTES must be an integer >= 1514, not '$QUEUE_BYTES'"
[[ $LOSS =~ ^(0|0?\.[0-9]+)$ ]] || die "LOSS must be a probability in [0, 1), not '$LOSS'"
# Milliseconds: a number (fractions allowed) up to 10 s.
ms_ok() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v v="$1" 'BEGIN { exit !(v <= 10000) }'; }
ms_ok "$DELAY_MS" || die "DELAY_MS must be milliseconds in [0, 10000], not '$DELAY_MS'"
ms_ok "$JITTER_MS" || die "JITTER_MS must be milliseconds in [0, 10000], not '$JITTER_MS'"
DELAY_ON=$(awk -v v="$DELAY_MS" 'BEGIN { print (v > 0) ? 1 : 0 }')
if ((!DELAY_ON)) && awk -v v="$JITTER_MS" 'BEGIN { exit !(v > 0) }'; then
    die "JITTER_MS needs DELAY_MS > 0 (jitter is around the delay)"
fi
int_in "$PORT" 1 65535 || die "PORT must be 1..65535, not '$PORT'"
int_in "$GRACE" 0 86400 || die "GRACE must be a whole number of seconds, not '$GRACE'"
[[ $DSCP_PRIORITY == 0 || $DSCP_PRIORITY == 1 ]] || die "DSCP_PRIORITY must be 0 or 1"
int_in "$LOW_SHARE" 1 99 || die "LOW_SHARE must be 1..99 (percent)"
for d in $PRIORITY_DSCP; do
    int_in "$d" 0 63 || die "PRIORITY_DSCP must hold DSCP values 0..63, not '$d'"
done
[[ $OFFLOADS == on || $OFFLOADS == off ]] || die "OFFLOADS must be on or off"
[[ $DRY_RUN == 0 || $DRY_RUN == 1 ]] || die "DRY_RUN must be 0 or 1"
[[ $WAIT_LOCK == 0 || $WAIT_LOCK == 1 ]] || die "WAIT_LOCK must be 0 or 1"
if ((DRY_RUN)); then
    printf 'testbed: would run on %s ranks, %s each (queue %s bytes, loss %s, delay %s ms +- %s ms, TCP %s, DSCP priority %s):' \
        "$RANKS" "$RATE" "$QUEUE_BYTES" "$LOSS" "$DELAY_MS" "$JITTER_MS" "$TCP_CC" "$DSCP_PRIORITY"
    printf ' %q' "$@"
    echo
    exit 0
fi
((EUID == 0)) || die "needs root (network namespaces, tc, iptables)"

# The delay stage's binary, built here if missing (as the user who ran
# sudo, when there is one, so target/ stays theirs).
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STAGE_BIN=${DELAY_STAGE:-$ROOT/target/release/delay_stage}
if ((DELAY_ON)) && [[ ! -x $STAGE_BIN ]]; then
    build=(cargo build --release --bin delay_stage)
    echo "testbed: $STAGE_BIN missing, running ${build[*]} in $ROOT" >&2
    if [[ -n ${SUDO_USER:-} && $SUDO_USER != root ]]; then
        build=(sudo -u "$SUDO_USER" env "PATH=$PATH" "${build[@]}")
    fi
    if ! (cd "$ROOT" && "${build[@]}" >&2) || [[ ! -x $STAGE_BIN ]]; then
        die "no delay stage at $STAGE_BIN: build it with 'cargo build --release --bin delay_stage' in $ROOT"
    fi
fi

missing=()
command -v ip >/dev/null && command -v tc >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
command -v ethtool >/dev/null || missing+=(ethtool)
if ((${#missing[@]})); then
    echo "== installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi

# The congestion controller must be available (loaded) in the kernel.
cc_available() { grep -qw -- "$TCP_CC" /proc/sys/net/ipv4/tcp_available_congestion_control; }
if ! cc_available; then
    if command -v modprobe >/dev/null; then modprobe "tcp_$TCP_CC" 2>/dev/null || true; fi
    cc_available || die "TCP congestion control '$TCP_CC' is not available in this kernel" \
        "(available: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control); modprobe tcp_$TCP_CC failed or is missing)"
fi

# The lock is held on fd 9, which no child inherits.
exec 9>/run/lock/$PREFIX.lock
if ! flock -n 9; then
    ((WAIT_LOCK)) || die "another testbed is running (lock /run/lock/$PREFIX.lock; --wait-lock waits for it)"
    echo "testbed: another testbed is running; waiting for it to end (lock /run/lock/$PREFIX.lock)" >&2
    flock 9
fi

rank_ns() { echo "$PREFIX-rank$1"; }

# Ends every process inside a namespace of ours, then deletes it.
remove_namespace() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [[ -n $pids ]]; then
        # shellcheck disable=SC2086 # word splitting wanted: a list of pids
        kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
}

remove_all() {
    local ns
    for ns in $(ip netns list | awk -v p="^$PREFIX-" '$1 ~ p { print $1 }'); do
        remove_namespace "$ns"
    done
}

# Per rank on stderr: what the egress queue dropped, what iptables dropped
# and let through on input, and what the veth received.
print_counters() {
    local r ns qdrop qsent drop acc rx stage
    echo "testbed: counters per rank (loss = iptables dropped / (dropped + accepted) on input)" >&2
    for ((r = 0; r < RANKS; r++)); do
        ns=$(rank_ns "$r")
        ip netns exec "$ns" true 2>/dev/null || continue
        read -r qsent qdrop < <(ip netns exec "$ns" tc -s qdisc show dev "$DEV" | awk '
            /^qdisc htb/ { root = 1; next } /^qdisc/ { root = 0; leaf = ($2 == "bfifo"); next }
            /Sent/ { d = $7; gsub(/[^0-9]/, "", d); if (root) sent = $4; else if (leaf) dropped += d }
            END { printf "%d %d\n", sent, dropped }')
        read -r drop acc < <(ip netns exec "$ns" iptables -L INPUT -v -n -x | awk -v dev="$DEV" '
            $6 == dev && $3 == "DROP" { d += $1 } $6 == dev && $3 == "ACCEPT" { a += $1 }
            END { printf "%d %d\n", d, a }')
        rx=$(ip netns exec "$ns" cat "/sys/class/net/$DEV/statistics/rx_packets" 2>/dev/null || echo "?")
        printf 'testbed: rank %d: egress sent %d packets, queue dropped %d; input: iptables dropped %d accepted %d (loss %s); veth received %s packets\n' \
            "$r" "$qsent" "$qdrop" "$drop" "$acc" \
            "$(awk -v d="$drop" -v a="$acc" 'BEGIN { if (d + a) printf "%.4f", d / (d + a); else print "n/a" }')" "$rx" >&2
        if ((DELAY_ON)); then
            stage=$(grep -h 'delay_stage: queue .*: delayed' "$STAGE_DIR/rank$r.log" 2>/dev/null || true)
            [[ -n $stage ]] || stage="delay_stage: no counters, it did not exit cleanly: $(tail -n 2 "$STAGE_DIR/rank$r.log" 2>/dev/null | tr '\n' ' ')"
            printf 'testbed: rank %d: %s\n' "$r" "$stage" >&2
        fi
    done
}

ALLOWED_FILE=/proc/sys/net/ipv4/tcp_allowed_congestion_control
ALLOWED_BEFORE=
declare -A RANK_OF=() # pid -> rank, ranks still running
STAGE_PIDS=()         # delay stages, one per rank
STAGE_DIR=
SETUP_DONE=0
timer=

# True while process $1 runs (not gone, not a zombie).
running() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $st && ${st:0:1} != Z ]]
}

# Stops the ranks still running: TERM to each one's session, KILL to what
# is left after 5 s, then KILL to anything their children left behind.
# (Polls rather than wait -n, which inside the exit trap missed ranks that
# had already ended.)
stop_ranks() {
    local pid i left groups
    ((${#RANK_OF[@]})) || return 0
    echo "testbed: stopping ranks ${RANK_OF[*]}" >&2
    groups=("${!RANK_OF[@]}")
    for pid in "${groups[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for ((i = 0; i < 50; i++)); do
        left=()
        for pid in "${groups[@]}"; do running "$pid" && left+=("${RANK_OF[$pid]}"); done
        ((${#left[@]})) || break
        sleep 0.1
    done
    if ((${#left[@]})); then
        echo "testbed: ranks ${left[*]} ignored TERM, killing them" >&2
    fi
    for pid in "${groups[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    wait "${groups[@]}" 2>/dev/null || true
    RANK_OF=()
}

# TERM to each delay stage, so that it accepts what it holds and prints
# its counters; remove_namespace would KILL it silently.
stop_stages() {
    local pid i left
    ((${#STAGE_PIDS[@]})) || return 0
    for pid in "${STAGE_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < 30; i++)); do
        left=0
        for pid in "${STAGE_PIDS[@]}"; do running "$pid" && left=1; done
        ((left)) || break
        sleep 0.1
    done
    for pid in "${STAGE_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait "${STAGE_PIDS[@]}" 2>/dev/null || true
    STAGE_PIDS=()
}

cleanup() {
    local status=$?
    # Teardown runs to its end: a second Ctrl-C (or timeout's signal to the
    # pid and then to the group) must not leave namespaces behind.
    trap - EXIT
    trap '' INT TERM
    [[ -n $timer ]] && kill -KILL "$timer" 2>/dev/null
    stop_ranks
    stop_stages
    ((SETUP_DONE)) && print_counters
    remove_all
    [[ -n $STAGE_DIR ]] && rm -rf "$STAGE_DIR"
    [[ -n $ALLOWED_BEFORE ]] && echo "$ALLOWED_BEFORE" >"$ALLOWED_FILE"
    exit "$status"
}
trap cleanup EXIT
trap 'echo "testbed: interrupted" >&2; exit 130' INT
trap 'echo "testbed: terminated" >&2; exit 143' TERM

remove_all

# A namespace other than the host's may only make an algorithm its default
# if the host lists it in tcp_allowed_congestion_control (EPERM otherwise;
# this host allows "reno bbr"). If TCP_CC is not there it is added for the run
# and the list restored on exit; the host's own default is left alone.
if ! grep -qw -- "$TCP_CC" "$ALLOWED_FILE"; then
    ALLOWED_BEFORE=$(cat "$ALLOWED_FILE")
    echo "testbed: adding $TCP_CC to the host's $ALLOWED_FILE ($ALLOWED_BEFORE) for this run" >&2
    echo "$ALLOWED_BEFORE $TCP_CC" >"$ALLOWED_FILE"
fi

tcx() { ip netns exec "$ns" tc "$@"; } # tc in rank namespace $ns
((DELAY_ON)) && STAGE_DIR=$(mktemp -d /tmp/gl-tb-delay.XXXXXX)
# The delay stages run SCHED_FIFO: on a busy host a woken normal task can
# wait a scheduler tick or more for a core (pings 2-34 ms late behind a
# 10 ms stage at load 7 on 2 cores; 0.2 ms under chrt). The stage does
# little per packet, and the kernel's RT throttling still bounds it.
STAGE_RUN=("$STAGE_BIN")
# Where the host refuses real-time scheduling (a container without
# CAP_SYS_NICE), the stage runs as a normal task.
if command -v chrt >/dev/null && chrt -f 10 true 2>/dev/null; then
    STAGE_RUN=(chrt -f 10 "$STAGE_BIN")
fi

# The hub: a bridge with one port per rank, no address of its own.
ip netns add "$HUB"
ip -n "$HUB" link set lo up
# Bridged frames are not handed to the hub's iptables.
ip netns exec "$HUB" sh -c 'echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables' 2>/dev/null || true
ip -n "$HUB" link add "$BRIDGE" type bridge stp_state 0
ip -n "$HUB" link set "$BRIDGE" up

for ((r = 0; r < RANKS; r++)); do
    ns=$(rank_ns "$r")
    port=$PREFIX-p$r
    ip netns add "$ns"
    # Only the 10.x addresses: no IPv6 chatter on the links.
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 2>/dev/null || true
    ip netns exec "$ns" sysctl -qw "net.ipv4.tcp_congestion_control=$TCP_CC"
    ip -n "$HUB" link add "$port" mtu 1500 type veth peer name "$DEV" netns "$ns" mtu 1500
    ip -n "$HUB" link set "$port" master "$BRIDGE"
    ip -n "$HUB" link set "$port" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$SUBNET.$((r + 1))/24" dev "$DEV"
    ip -n "$ns" link set "$DEV" up
    ip netns exec "$ns" ethtool -K "$DEV" tso "$OFFLOADS" gso "$OFFLOADS" gro "$OFFLOADS" >/dev/null 2>&1 || true
    ip netns exec "$HUB" ethtool -K "$port" tso "$OFFLOADS" gso "$OFFLOADS" gro "$OFFLOADS" >/dev/null 2>&1 || true

    # Egress: HTB of RATE, a byte-limited tail-drop queue under each class.
    if ((DSCP_PRIORITY)); then
        hi=$((RATE_BITS - RATE_BITS * LOW_SHARE / 100))
        lo=$((RATE_BITS * LOW_SHARE / 100))
        tcx qdisc add dev "$DEV" root handle 1: htb default 20 r2q 1000
        tcx class add dev "$DEV" parent 1: classid 1:1 htb rate "$RATE" ceil "$RATE"
        tcx class add dev "$DEV" parent 1:1 classid 1:10 htb rate "${hi}bit" ceil "$RATE" prio 0 quantum 30000
        tcx class add dev "$DEV" parent 1:1 classid 1:20 htb rate "${lo}bit" ceil "$RATE" prio 1 quantum 30000
        tcx qdisc add dev "$DEV" parent 1:10 handle 10: bfifo limit "$QUEUE_BYTES"
        tcx qdisc add dev "$DEV" parent 1:20 handle 20: bfifo limit "$QUEUE_BYTES"
        for d in $PRIORITY_DSCP; do
            tcx filter add dev "$DEV" parent 1: protocol ip prio 1 u32 \
                match ip tos "$(printf '0x%02x' $((d << 2)))" 0xfc flowid 1:10
        done
    else
        tcx qdisc add dev "$DEV" root handle 1: htb default 10 r2q 1000
        tcx class add dev "$DEV" parent 1: classid 1:10 htb rate "$RATE" ceil "$RATE"
        tcx qdisc add dev "$DEV" parent 1:10 handle 10: bfifo limit "$QUEUE_BYTES"
    fi

    # Input: random loss, then a rule that only counts what got through.
    ip netns exec "$ns" iptables -A INPUT -i "$DEV" -m statistic --mode random --probability "$LOSS" -j DROP
    ip netns exec "$ns" iptables -A INPUT -i "$DEV" -j ACCEPT

    # Delay on this rank's ingress, not on the sender's egress: a packet
    # held on egress is still charged to its TCP socket, and TCP small
    # queues (about 1 ms of the pacing rate below the socket) would then
    # throttle TCP to a fraction of RATE. Held on ingress it has left the
    # sender. Every rank delays what it receives by D, so the RTT between
    # any two ranks is 2 x D. The stage binds its queue before the rule
    # exists, so no packet is queued with nobody to release it.
    if ((DELAY_ON)); then
        ready=$STAGE_DIR/rank$r.ready
        ip netns exec "$ns" "${STAGE_RUN[@]}" --queue-num 0 --delay-ms "$DELAY_MS" --jitter-ms "$JITTER_MS" \
            --seed "$((r + 1))" --ready-file "$ready" >"$STAGE_DIR/rank$r.log" 2>&1 </dev/null 9>&- &
        STAGE_PIDS+=($!)
        for ((i = 0; i < 100; i++)); do
            [[ -s $ready ]] && break
            running "$!" || break
            sleep 0.05
        done
        [[ -s $ready ]] || die "the delay stage of rank $r was not ready within 5 s or exited: $(cat "$STAGE_DIR/rank$r.log")"
        ip netns exec "$ns" iptables -t mangle -A PREROUTING -i "$DEV" -j NFQUEUE --queue-num 0
    fi
done
SETUP_DONE=1

mode="one class"
((DSCP_PRIORITY)) && mode="priority class for DSCP ${PRIORITY_DSCP// /,} (rest ${LOW_SHARE}% assured)"
echo "testbed: $RANKS ranks at $SUBNET.1-$RANKS via bridge in $HUB; egress HTB $RATE ($mode), queue $QUEUE_BYTES bytes;" \
    "input loss $LOSS; input delay ${DELAY_MS} ms +- ${JITTER_MS} ms; tcp $TCP_CC; offloads $OFFLOADS" >&2
[[ -n $LOG_DIR ]] && mkdir -p "$LOG_DIR"

# Every rank at once, each in a session of its own so that it and its
# children can be stopped together.
for ((r = 0; r < RANKS; r++)); do
    ns=$(rank_ns "$r")
    run=(setsid ip netns exec "$ns" env
        MASTER_ADDR="$SUBNET.1" MASTER_PORT="$PORT" WORLD_SIZE="$RANKS" RANK="$r"
        LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK="$r" GRADLANE_RANK_ADDR="$SUBNET.$((r + 1))"
        GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$DEV}" PYTHONUNBUFFERED="${PYTHONUNBUFFERED:-1}"
        "$@")
    if [[ -n $LOG_DIR ]]; then
        "${run[@]}" >"$LOG_DIR/rank$r.log" 2>&1 </dev/null 9>&- &
    else
        "${run[@]}" </dev/null 9>&- \
            > >(trap '' INT TERM; exec sed -u "s/^/[rank $r] /" 9>&-) \
            2> >(trap '' INT TERM; exec sed -u "s/^/[rank $r] /" >&2 9>&-) &
    fi
    RANK_OF[$!]=$r
done

# Wait for every rank; after the first failure the rest get GRACE seconds.
first_fail=
failed=()
while ((${#RANK_OF[@]})); do
    done_pid=
    set +e
    wait -n -p done_pid "${!RANK_OF[@]}" ${timer:+"$timer"}
    st=$?
    set -e
    if [[ -z ${done_pid:-} ]]; then
        # wait -n came back without naming a process (bash 5.2 did, with a
        # rank still training): take a rank that has ended by its own pid,
        # or wait again while all run.
        for p in "${!RANK_OF[@]}"; do
            if ! kill -0 "$p" 2>/dev/null; then
                set +e
                wait "$p"
                st=$?
                set -e
                done_pid=$p
                break
            fi
        done
        if [[ -z ${done_pid:-} ]]; then
            sleep 0.2
            continue
        fi
    fi
    if [[ $done_pid == "$timer" ]]; then
        timer=
        echo "testbed: grace of ${GRACE}s over" >&2
        stop_ranks
        break
    fi
    r=${RANK_OF[$done_pid]}
    unset "RANK_OF[$done_pid]"
    if ((st != 0)); then
        echo "testbed: rank $r exited with status $st" >&2
        failed+=("$r:$st")
        if [[ -z $first_fail ]]; then
            first_fail=$st
            if ((${#RANK_OF[@]})); then
                echo "testbed: the other ranks get ${GRACE}s to finish" >&2
                sleep "$GRACE" 9>&- &
                timer=$!
            fi
        fi
    fi
done
if [[ -n $timer ]]; then
    kill -KILL "$timer" 2>/dev/null || true
    wait "$timer" 2>/dev/null || true
    timer=
fi

if [[ -n $first_fail ]]; then
    echo "testbed: FAILED, rank:status ${failed[*]}" >&2
    exit "$first_fail"
fi
echo "testbed: all $RANKS ranks exited with status 0" >&2
