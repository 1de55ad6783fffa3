#!/usr/bin/python3
"""Validates a Prometheus text exposition (format 0.0.4) read from stdin with the reference
parser (Debian's python3-prometheus-client) and the conventions Sluice follows. Prints one line
per family ("NAME TYPE SAMPLES") and exits 1 with the reason on the first violation."""
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

text = sys.stdin.read()
try:
    families = list(text_string_to_metric_families(text))
except Exception as e:  # the parser raises ValueError and friends on malformed lines
    print(f"parse error: {e}", file=sys.stderr)
    sys.exit(1)

seen = set()
for line in text.splitlines():
    if line.startswith("# TYPE "):
        name = line.split()[2]
        if name in seen:
            print(f"duplicate TYPE for {name}", file=sys.stderr)
            sys.exit(1)
        seen.add(name)
        if not name.startswith("sluice_"):
            print(f"{name}: no sluice_ prefix", file=sys.stderr)
            sys.exit(1)
        if line.split()[3] == "counter" and not name.endswith("_total"):
            print(f"counter {name} does not end in _total", file=sys.stderr)
            sys.exit(1)

for f in families:
    if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", f.name):
        print(f"bad metric name {f.name}", file=sys.stderr)
        sys.exit(1)
    if f.type == "histogram":
        for s in f.samples:
            if s.name.endswith("_bucket") and "le" not in s.labels:
                print(f"{f.name}: bucket without le", file=sys.stderr)
                sys.exit(1)
    print(f"{f.name} {f.type} {len(f.samples)}")
