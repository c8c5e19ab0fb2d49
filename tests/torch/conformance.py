"""The conformance table of docs/torch.md from two junit files of torch's suite.

    python tests/torch/conformance.py commrt.xml gloo.xml
    python tests/torch/conformance.py --skipped-for "small world size" gloo.xml


Each file is what ``pytest tests/torch/test_torch_suite.py --junitxml=FILE``
wrote (docs/torch.md has the commands).  Prints passed / skipped / failed
side by side, then every test gloo passes and commrt fails or skips (the
issue counts a skip there as a failure), with commrt's first line of error,
then any test commrt passes and gloo does not.  --skipped-for TEXT prints, as a
pytest -k expression, the tests of one file skipped with TEXT in the reason
(to rerun just those at another world size).
"""
import argparse
import sys
import xml.etree.ElementTree as ET

OUTCOMES = ("passed", "skipped", "failed")


def outcomes(path):
    """{test name: (outcome, message)} of one junit file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            node = kinds.get("failure", kinds.get("error"))
            out[case.get("name")] = ("failed", _first_line(node))
        elif "skipped" in kinds:
            out[case.get("name")] = ("skipped", kinds["skipped"].get("message", ""))
        else:
            out[case.get("name")] = ("passed", "")
    return out


def _first_line(node):
    """The most telling line of a failure: the last 'E   SomeError: ...' line."""
    text = (node.text or "") + "\n" + (node.get("message") or "")
    errors = [ln.strip()[1:].strip() for ln in text.splitlines()
              if ln.lstrip().startswith("E ") and "Error" in ln and "exited with" not in ln]
    return (errors[-1] if errors else (node.get("message") or "").splitlines()[0])[:200]


def counts(results):
    return {k: sum(1 for o, _ in results.values() if o == k) for k in OUTCOMES}


def table(names, results):
    lines = ["| torch's suite | " + " | ".join(OUTCOMES) + " | total |",
             "|---|" + "---|" * (len(OUTCOMES) + 1)]
    for name, res in zip(names, results):
        c = counts(res)
        lines.append(f"| {name} | " + " | ".join(str(c[k]) for k in OUTCOMES) +
                     f" | {len(res)} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skipped-for", metavar="TEXT",
                    help="print a -k expression of FILE's tests skipped for TEXT")
    ap.add_argument("commrt", help="junit xml of the run on commrt (FILE with --skipped-for)")
    ap.add_argument("gloo", nargs="?", help="junit xml of the run on gloo")
    args = ap.parse_args(argv)
    if args.skipped_for is not None:
        names = sorted(t for t, (o, m) in outcomes(args.commrt).items()
                       if o == "skipped" and args.skipped_for in m)
        print(" or ".join(names))
        return 0 if names else 1
    if args.gloo is None:
        ap.error("two junit files are needed (commrt's, gloo's)")
    ours, theirs = outcomes(args.commrt), outcomes(args.gloo)
    print(table(("commrt", "gloo"), (ours, theirs)))
    behind = sorted(t for t, (o, _) in theirs.items()
                    if o == "passed" and ours.get(t, ("missing", ""))[0] != "passed")
    print(f"\ngloo passes, commrt does not ({len(behind)}):")
    for t in behind:
        o, msg = ours.get(t, ("missing", "not run on commrt"))
        print(f"  {t}: {o}: {msg}")
    ahead = sorted(t for t, (o, _) in ours.items()
                   if o == "passed" and theirs.get(t, ("missing", ""))[0] != "passed")
    print(f"\ncommrt passes, gloo does not ({len(ahead)}):")
    for t in ahead:
        print(f"  {t}: {theirs.get(t, ('missing', ''))[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
