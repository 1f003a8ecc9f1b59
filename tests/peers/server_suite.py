"""Compares a run of llama.cpp's server tests (pytest's JUnit XML) with the expected failures.

The list (server-suite-expected.txt): a line "## REASON" gives the reason of the test ids on the
lines after it, up to the next; "#" starts a comment. A test that fails (or errors) and is not
listed fails the comparison, and so does a listed one that passes: the list only shrinks. Tests
under a reason that starts with "flaky:" may pass or fail (timing on a loaded machine). With
--write the list is rewritten from this run: the failures, under the reasons they had, new ones
under "## unexplained"."""
import argparse
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        # classname "unit.test_basic" (xunit1), name "test_x[param]".
        file = case.get("classname", "").replace(".", "/") + ".py"
        tid = file + "::" + case.get("name", "")
        kinds = {child.tag for child in case}
        if "failure" in kinds or "error" in kinds:
            out[tid] = "failed"
        elif "skipped" in kinds:
            out[tid] = "skipped"
        else:
            out[tid] = "passed"
    return out


def read_expected(path):
    expected, reason = {}, None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if line.startswith("## "):
                reason = line[3:].strip()
            elif line.strip() and not line.startswith("#"):
                if reason is None:
                    sys.exit(f"{path}:{n}: a test id before any '## REASON' line")
                expected[line.strip()] = reason
    return expected


def write_expected(path, got, expected):
    by_reason = {}
    for tid, res in sorted(got.items()):
        if res == "failed" or expected.get(tid, "").startswith("flaky:"):
            by_reason.setdefault(expected.get(tid, "unexplained"), []).append(tid)
    with open(path) as f:  # the header comment stays
        header = [l for l in f.read().split("\n## ")[0].splitlines() if l.startswith("#")]
    with open(path, "w") as f:
        f.write("\n".join(header) + "\n")
        for reason, ids in by_reason.items():
            f.write(f"\n## {reason}\n" + "".join(t + "\n" for t in ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--junit", required=True)
    ap.add_argument("--expected", required=True)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    got = outcomes(a.junit)
    expected = read_expected(a.expected)
    n = {k: sum(1 for v in got.values() if v == k) for k in ("passed", "failed", "skipped")}
    print(f"server-suite: {n['passed']} of {len(got)} passed, {n['failed']} failed, "
          f"{n['skipped']} skipped; {len(expected)} expected failures listed")
    if a.write:
        write_expected(a.expected, got, expected)
        print(f"server-suite: rewrote {a.expected}")
        return 0
    new = sorted(t for t, r in got.items() if r == "failed" and t not in expected)
    fixed = sorted(t for t, r in got.items()
                   if r == "passed" and t in expected and not expected[t].startswith("flaky:"))
    gone = sorted(t for t in expected if t not in got)
    for t in new:
        print(f"server-suite: NEW FAILURE {t}")
    for t in fixed:
        print(f"server-suite: now passes, remove it from the list: {t} ({expected[t]})")
    for t in gone:
        print(f"server-suite: listed but not run (renamed?): {t}")
    return 1 if new or fixed or gone else 0


if __name__ == "__main__":
    sys.exit(main())
