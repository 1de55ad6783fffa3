#!/usr/bin/env bash
# The BPF tables' NodePort cases and the sysctl test of the real Netlink, run with the machine's
# root network namespace forwarding IPv4 (net.ipv4.ip_forward=1), as on any Kubernetes node or
# host where a container engine has run. Before issue 38 the tests ran in the root namespace,
# where bpf_fib_lookup found the machine's default route and neighbour and turned the tables'
# TC_ACT_OK verdicts into TC_ACT_REDIRECT. They now run in namespaces of their own
# (tests/support/privileged_main.cc), but a new namespace still copies its IPv4 settings from the
# root one: this keeps every result independent of the machine.
#
# What runs: every table case of a NodePort (a packet from outside, and its reply going back
# outside: the path on which the programs ask the FIB of the test's own namespace) of the
# Service and policy tables, in both builds of the TC programs; the XDP and overlay tables make
# namespaces of their own with their routes and ip_forward=1. About 15 datapath loads, ~2.5 s of
# CPU each.
#
# ctest runs it alone (RUN_SERIAL): nothing else runs while the root namespace forwards. The
# original value is put back on every way out, and each binary has a deadline shorter than
# ctest's so that the script itself always gets to put it back.
#
# usage: tests/bpf/host_forwarding_test.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
KNOB=/proc/sys/net/ipv4/ip_forward
RUNS=(  # binary, gtest filter
  "bpf_lb_priv_test */*NodePort*"
  "bpf_policy_priv_test */*NodePort*"
  "agent_kernel_netlink_priv_test NetlinkPrivTest.SetSysctl*"
)

for run in "${RUNS[@]}"; do
  b=${run%% *}
  [ -x "$BUILD/tests/$b" ] || { echo "FAIL: $BUILD/tests/$b is not built" >&2; exit 1; }
  # A filter that matches nothing would pass without testing anything.
  n=$("$BUILD/tests/$b" --gtest_list_tests --gtest_filter="${run#* }" | grep -c '^  ' || true)
  [ "$n" -gt 0 ] || { echo "FAIL: no test of $b matches ${run#* }" >&2; exit 1; }
done

ORIGINAL=$(cat "$KNOB")
restore() { echo "$ORIGINAL" >"$KNOB"; }
trap restore EXIT
trap 'exit 130' INT TERM HUP
echo 1 >"$KNOB"
if ip -4 route show default | grep -q .; then
  echo "root namespace: ip_forward=1, default route: $(ip -4 route show default | head -1)"
else
  echo "root namespace: ip_forward=1, no default route (a test left in it would find no route)"
fi

failed=()
for run in "${RUNS[@]}"; do
  b=${run%% *}
  timeout 240 "$BUILD/tests/$b" --gtest_brief=1 --gtest_filter="${run#* }" || failed+=("$b")
done

[ "$(cat "$KNOB")" = 1 ] || { echo "FAIL: something set the root namespace's ip_forward back" >&2; exit 1; }
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAIL with the root namespace forwarding: ${failed[*]}" >&2
  exit 1
fi
echo "ok: every case passes with the root namespace forwarding"
