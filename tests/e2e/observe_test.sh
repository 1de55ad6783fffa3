#!/usr/bin/env bash
# The flow monitor end to end in a 1-node sluice-lab: `sluicectl observe --follow` attached to the
# node's agent sees real traffic by pod and Service name: a Service translation (client -> the
# ClusterIP of obs/web -> the server pod), a policy point allowing the flow to port 8080, and
# the NetworkPolicy drop of the flow to port 8081, with its reason and the enforcing point; `--last`
# then finds the drop again in the agent's history, as a table and filtered, and the agent
# switches the datapath's events off once nobody observes. Last, the service map page
# (--ui_address) in headless Chromium: once the page polls, new traffic and a drop are drawn as
# edges coloured by verdict, with the drop reason, and listed in its flow table.
set -euo pipefail
NAME=flowsobs$$
source "$(dirname "$0")/lib.sh"
lab_init
WORK=$(mktemp -d /tmp/sluice-observe-test.XXXXXX)
KEEP_LOGS=/tmp/observe_test-$NAME

# The lab's agents take extra flags from SLUICE_LAB_AGENT_ARGS: the service map page.
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --ui_address=127.0.0.1:9971"
KUBECONFIG_PATH=$("$LAB" up --nodes 1 --name "$NAME") || fail "up"
unset SLUICE_LAB_AGENT_ARGS
SOCK=$DIR/node1/observe.sock
OBSERVE() { "$SLUICECTL" observe --socket "$SOCK" "$@"; }
log "lab $NAME up"

{
  cat <<'YAML'
apiVersion: v1
kind: Namespace
metadata: {name: obs}
YAML
  pod_manifest server --namespace obs --labels app=web --node node1 --ports 8080,8081
  pod_manifest client --namespace obs --labels app=client --node node1 --ports 8080
  cat <<'YAML'
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: obs}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-8080-only, namespace: obs}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: 8080, protocol: TCP}]
YAML
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait -n obs --for=condition=Ready pod/server pod/client --timeout=60s >/dev/null || fail "pods not Ready"
SERVER_IP=$(K get pod server -n obs -o jsonpath='{.status.podIP}')
CLUSTER_IP=$(K get service web -n obs -o jsonpath='{.spec.clusterIP}')
log "server $SERVER_IP, obs/web $CLUSTER_IP"
probe() { "$LAB" probe --name "$NAME" --from obs/client --to "$1" --timeout 1 || true; }
# The policy is in force once 8081 is closed and 8080 open.
wait_for 20 sh -c "[ \"\$('$LAB' probe --name '$NAME' --from obs/client --to $SERVER_IP:8081 --timeout 1)\" != CONNECTED ]" ||
  fail "the policy never closed 8081"
wait_for 20 sh -c "[ \"\$('$LAB' probe --name '$NAME' --from obs/client --to $CLUSTER_IP:80 --timeout 1)\" = CONNECTED ]" ||
  fail "obs/web never served"

# Not through OBSERVE: $! must be sluicectl itself, not a subshell a kill would leave it behind.
"$SLUICECTL" observe --socket "$SOCK" --follow -o json --namespace obs >"$WORK/follow.json" \
  2>"$WORK/follow.err" &
FOLLOW=$!
before_down() { kill "$FOLLOW" 2>/dev/null || true; wait "$FOLLOW" 2>/dev/null || true; }
wait_for 10 grep -q "an observer is attached" "$DIR/node1/log/agent.log" || fail "observer never attached"

expect "probe to obs/web" "$(probe "$CLUSTER_IP:80")" CONNECTED
r=$(probe "$SERVER_IP:8081")
[ "$r" != CONNECTED ] || fail "8081 connected through the policy"

# count FILE PYTHON-CONDITION: JSON lines of FILE (flows, named f) the condition holds for.
count() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def dig(d, *path):  # f["a"]["b"], None where a level is missing
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return d
n = 0
for line in open(sys.argv[1]):
    f = json.loads(line)
    n += bool(eval("(" + sys.argv[2] + ")", {"f": f, "g": lambda *p: dig(f, *p)}))
print(n)
PY
}
has() { [ "$(count "$WORK/follow.json" "$1")" -gt 0 ]; }
wait_for 10 has 'f["type"] == "translate" and g("source", "pod") == "client"
  and g("service", "namespace") == "obs" and g("service", "name") == "web"
  and g("backend", "pod") == "server" and g("backend", "port") == 8080' ||
  fail "no translation client -> obs/web -> server: $(cat "$WORK/follow.json")"
# Reported once per flow, by the first policy point it passes (here the client's egress, open).
wait_for 10 has 'f["type"] == "policy" and f["verdict"] == "forwarded"
  and g("source", "pod") == "client" and g("destination", "pod") == "server"
  and g("destination", "port") == 8080' ||
  fail "no allowed policy verdict for 8080: $(cat "$WORK/follow.json")"
wait_for 10 has 'f["verdict"] == "dropped" and f.get("drop_reason") == "policy_denied"
  and g("source", "pod") == "client" and g("destination", "namespace") == "obs"
  and g("destination", "pod") == "server" and g("destination", "port") == 8081
  and g("policy", "direction") == "ingress" and g("policy", "enforced")
  and f["node"] == "node1"' ||
  fail "no policy drop of client -> server:8081: $(cat "$WORK/follow.json")"
log "ok: follow saw the translation, the allowed flow and the policy drop, by name"

before_down
before_down() { :; }
wait_for 10 grep -q "no observer left" "$DIR/node1/log/agent.log" || fail "the observer never left"

# History: the drop again, as a table for people, filtered.
OBSERVE --last 5 --verdict dropped --drop-reason policy_denied --pod obs/server >"$WORK/last.txt" ||
  fail "observe --last"
head -1 "$WORK/last.txt" | grep -q "^TIME .*SOURCE .*DESTINATION .*VERDICT" || fail "no table header: $(cat "$WORK/last.txt")"
grep -q "obs/client:[0-9]* *obs/server:8081 .*policy *DROPPED *policy denied (ingress)" "$WORK/last.txt" ||
  fail "--last table lacks the drop: $(cat "$WORK/last.txt")"
cat "$WORK/last.txt" >&2
grep -q "FORWARDED" "$WORK/last.txt" && fail "--verdict dropped printed a forwarded flow: $(cat "$WORK/last.txt")"
OBSERVE --last 5 -o json --service obs/web >"$WORK/svc.json" || fail "observe --service"
[ "$(count "$WORK/svc.json" 'f["type"] == "translate"')" -ge 1 ] ||
  fail "--service obs/web found no translation: $(cat "$WORK/svc.json")"
[ "$(count "$WORK/svc.json" 'g("service", "name") != "web"')" = 0 ] ||
  fail "--service obs/web printed other flows: $(cat "$WORK/svc.json")"
OBSERVE --verdict denied >/dev/null 2>&1 && fail "an unknown verdict was accepted"
log "ok: --last, filters and the table"

# The service map page, in a real browser. Its first poll attaches an observer (events on).
UI=http://127.0.0.1:9971
ip netns exec "$NAME-node1" curl -sf -m 3 "$UI/flows.json" >/dev/null || fail "no flows.json"
attached_twice() { [ "$(grep -c "an observer is attached" "$DIR/node1/log/agent.log")" -ge 2 ]; }
wait_for 10 attached_twice || fail "the page's poll attached no observer"
expect "probe to obs/web (page open)" "$(probe "$CLUSTER_IP:80")" CONNECTED
[ "$(probe "$SERVER_IP:8081")" != CONNECTED ] || fail "8081 connected through the policy"
ip netns exec "$NAME-node1" chromium --headless --no-sandbox --disable-gpu --no-first-run \
  --user-data-dir="$WORK/chromium" --virtual-time-budget=6000 --dump-dom "$UI/" \
  >"$WORK/page.html" 2>"$WORK/chromium.err" || fail "chromium: $(tail -5 "$WORK/chromium.err")"
python3 - "$WORK/page.html" <<'PY' || fail "the page lacks the flows: $(cat "$WORK/page.html")"
import sys
from html.parser import HTMLParser
edges, rows = [], []
class Page(HTMLParser):
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "path" and a.get("class") == "edge":
            edges.append(a)
        if tag == "tr" and a.get("class") == "flow":
            rows.append(a)
Page().feed(open(sys.argv[1]).read())
def edge(src, dst):
    return next((e for e in edges if e["data-src"] == src and e["data-dst"] == dst), None)
want = [("obs/client", "svc:obs/web", {"forwarded"}), ("svc:obs/web", "obs/server", {"forwarded"}),
        ("obs/client", "obs/server", {"dropped", "mixed"})]
ok = True
for src, dst, verdicts in want:
    e = edge(src, dst)
    if e is None or e["data-verdict"] not in verdicts:
        print(f"edge {src} -> {dst}: {e}, want a verdict in {verdicts}", file=sys.stderr)
        ok = False
drop = edge("obs/client", "obs/server")
if drop is None or "policy_denied" not in drop["data-reasons"].split(","):
    print(f"the drop edge names no policy_denied: {drop}", file=sys.stderr)
    ok = False
if not any(r.get("data-verdict") == "dropped" and r.get("data-reason") == "policy_denied" for r in rows):
    print(f"no dropped policy_denied row among {len(rows)} rows", file=sys.stderr)
    ok = False
print(f"{len(edges)} edges, {len(rows)} rows", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
log "ok: the service map page in Chromium draws the translation, the backend and the policy drop"
if [ -n "${SLUICE_UI_SCREENSHOT:-}" ]; then
  bash "$(dirname "$0")/ui_screenshot.sh" "$UI/" "$SLUICE_UI_SCREENSHOT" "$NAME-node1" ||
    fail "screenshot"
fi
echo PASS
