"""The checks of a Python test that checks a list of facts, each printed as it is made (`ok   NAME`
or `FAIL NAME: DETAIL`); finish() prints the count and exits 1 if any failed. Used by
tests/repo/release_versions_test.py and tests/helm/dockerfile_test.py, which put tests/support on
sys.path to import it."""
import sys

failures = []
passed = 0


def check(name, ok, detail=""):
    global passed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failures.append(name)
        print(f"FAIL {name}{': ' + detail if detail else ''}")


def finish():
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)
