#!/usr/bin/env python3
"""Per-test results from one `iscsi-test-cu -t FAMILY.SUITE` run (its stdout+stderr).

usage: testcu_parse.py OUTPUT_FILE FAMILY.SUITE [TEST...]

Prints one line per test: `FAMILY.SUITE.TEST RESULT [detail]`, RESULT one of
  PASSED   CUnit's verdict "passed" and no [SKIPPED] line while the test ran
  SKIPPED  CUnit's verdict "passed" but the test printed [SKIPPED] (CUnit counts skips as
           passed, so they are counted here)
  FAILED   CUnit's verdict "FAILED"; detail = the first assertion / [FAILED] message
  NOTRUN   listed in TEST... but never started (the process hung, crashed or was killed
           earlier); the test that was running when the output ends gets ABORTED
  ABORTED  started, no verdict: the process died or timed out during this test

Some tests check one thing per service action and print [SKIPPED] for the service actions the
target does not offer, then go on with the others; PARTIAL_SKIPS lists them: when every
[SKIPPED] line of such a test names an unoffered part, it counts as PASSED, the skipped part
in the detail.
How CUnit prints (verbose mode, the default): "  Test: NAME ..." then whatever the test
prints, then "passed" or "FAILED" at the end of a line, then for FAILED numbered assertion
lines ("    1. file.c:123  - CU_ASSERT..."). libiscsi's helpers print "[FAILED] ..." and
"[SKIPPED] ..." lines; a "[FAILED]" line alone is not a verdict (some tests expect a command
to fail and print it), only CUnit's own word is.
"""
import re
import sys

TEST_RE = re.compile(r"^\s*Test: (\S+) \.\.\.(.*)$")
VERDICT_RE = re.compile(r"(passed|FAILED)\s*$")


# FAMILY.SUITE.TEST -> pattern of the [SKIPPED] lines that skip only a part of it.
PARTIAL_SKIPS = {
    # OVERWRITE and BLOCK ERASE are refused with DATA PROTECT / RESERVATION CONFLICT as the test
    # expects; CRYPTO ERASE is not offered (no encryption), so that third check is skipped.
    "ALL.Sanitize.Readonly": re.compile(r"\[SKIPPED\] SANITIZE CRYPTO_ERASE is not implemented"),
    "ALL.Sanitize.Reservations": re.compile(
        r"\[SKIPPED\] SANITIZE CRYPTO_ERASE is not implemented"),
}


def verdict_of(text):
    """'passed'/'FAILED' if this piece of a line is CUnit's verdict, else None."""
    s = text.strip()
    if not s or s.startswith("["):
        return None
    # "passed" may be followed on the same line by what a cleanup printed afterwards
    # (seen: "Test: LUNReset ...passed    [FAILED] PRIN command: ..." from the suite teardown).
    m = re.match(r"^(?:\.\.\.)?(passed|FAILED)(\s|$)", s)
    if m:
        return m.group(1)
    m = VERDICT_RE.search(s)
    if not m:
        return None
    # The verdict is appended to whatever the test printed last without a newline; accept
    # it when it is the whole piece or follows the "..." of the Test: line.
    before = s[: m.start()]
    if before == "" or before.endswith("..."):
        return m.group(1)
    return None


def main():
    out_file, suite = sys.argv[1], sys.argv[2]
    expected = sys.argv[3:]
    results = {}  # test -> [result, detail]
    order = []
    cur = None
    skipped = False
    detail = ""
    after_fail = None  # test whose assertion lines follow
    skip_lines = []  # the [SKIPPED] lines of the current test

    def finish(v):
        nonlocal cur
        partial = PARTIAL_SKIPS.get(f"{suite}.{cur}")
        if v == "passed" and skipped and partial and all(partial.search(l) for l in skip_lines):
            results[cur] = ["PASSED", "part skipped: " + detail]
        elif v == "passed":
            results[cur] = ["SKIPPED" if skipped else "PASSED", detail if skipped else ""]
        else:
            results[cur] = ["FAILED", detail]
        cur = None

    with open(out_file, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = TEST_RE.match(line)
            if m:
                if cur is not None:
                    results[cur] = ["ABORTED", "no verdict before the next test"]
                cur, skipped, detail, after_fail = m.group(1), False, "", None
                skip_lines = []
                order.append(cur)
                rest = m.group(2)
                v = verdict_of(rest) if re.match(r"^(passed|FAILED)(\s|$)", rest) else None
                if v:
                    t = cur
                    finish(v)
                    after_fail = t if v == "FAILED" else None
                    continue
                line = rest
            if cur is None:
                # Assertion lines after a FAILED verdict: keep the first as the detail.
                if after_fail and re.match(r"^\s+\d+\. ", line):
                    if not results[after_fail][1].startswith("assert"):
                        prev = results[after_fail][1]
                        results[after_fail][1] = "assert " + line.strip() + \
                            (" | " + prev if prev else "")
                continue
            if "[SKIPPED]" in line:
                skipped = True
                skip_lines.append(line)
                if not detail:
                    detail = line.strip()
            elif "[FAILED]" in line and not detail:
                detail = line.strip()
            v = verdict_of(line)
            if v:
                t = cur
                finish(v)
                after_fail = t if v == "FAILED" else None
    if cur is not None:
        results[cur] = ["ABORTED", "output ends during this test (hang, crash or timeout)"]
    for t in expected:
        if t not in results:
            results[t] = ["NOTRUN", "never started"]
            order.append(t)
    for t in order:
        r, d = results[t]
        d = re.sub(r"\s+", " ", d)[:300]
        print(f"{suite}.{t} {r}" + (f" {d}" if d else ""))


if __name__ == "__main__":
    main()
