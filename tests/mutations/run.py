"""`make guarantees`: break each guarantee's code on purpose, run only its named tests, and say whether they caught it.

Each entry of tests/mutations/*.toml is one realistic break of the code that keeps one row of docs/guarantees.md:

    [[mutation]]
    row = "Concurrent increments are all counted"      # the start of the row's guarantee, as docs/guarantees.md has it
    file = "counters/writes.py"
    find = "return ndb.transaction(txn, retries=0)"     # must occur exactly once in the file
    replace = "return txn()"
    says = "the legacy writer without its transaction"  # the break, in a reader's words
    tests = ["tests/test_counters.py::test_one_shard_counter_backs_off_and_stays_exact"]
    backends = ["legacy"]                                # optional: legacy (the default), firestore, or both

The tree is copied to a scratch directory (the files git knows, as they are in the working tree now); each break is
applied there, its tests run on each of its backends, and the file restored. The working tree is never touched.
Before any break, each entry's tests run once unbroken: a test that fails anyway proves nothing, and is reported.
`--write` puts the outcome in docs/guarantees.md's "checked" column of each row.

Killed: pytest failed (exit 1) on the broken code. Survived: it passed. Anything else (a test that does not exist, a
`find` that no longer matches) is an error of the entry, reported as such: never counted as killed.
"""
import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = Path(__file__).resolve().parent
DOC = ROOT / "docs" / "guarantees.md"
TIMEOUT = 900  # seconds one pytest run may take: a crash test's own bounds are far below


@dataclasses.dataclass
class Mutation:
    row: str
    file: str
    find: str
    replace: str
    says: str
    tests: list[str]
    backends: list[str]
    source: str  # the .toml it came from


@dataclasses.dataclass
class Outcome:
    mutation: Mutation
    backend: str
    verdict: str  # killed, survived, error
    detail: str
    test: str = ""  # the test that failed first on the broken code (pytest -x stops there)


def load(only: str | None = None, entries: str = "*") -> list[Mutation]:
    found = []
    for path in sorted(ENTRIES.glob(f"{entries}.toml")):
        for entry in tomllib.loads(path.read_text()).get("mutation", []):
            mutation = Mutation(source=path.name, backends=entry.pop("backends", ["legacy"]), **entry)
            if only is None or only in mutation.row or only in mutation.file:
                found.append(mutation)
    return found


def changed_since(mutations: list[Mutation], commit: str) -> list[Mutation]:
    """The entries whose broken file or test files differ between `commit` and the working tree: the ones whose
    outcome in docs/guarantees.md may no longer hold."""
    changed = set(subprocess.run(["git", "diff", "--name-only", commit, "--"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout.split())
    changed |= set(subprocess.run(["git", "ls-files", "-o", "--exclude-standard"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout.split())
    return [m for m in mutations
            if m.file in changed or m.source in {Path(name).name for name in changed}
            or any(test.partition("::")[0] in changed for test in m.tests)]


def scratch_copy() -> Path:
    """The files git knows (tracked, and untracked but not ignored), as the working tree has them, in a new directory;
    the virtualenv linked, not copied."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    target = Path(tempfile.mkdtemp(prefix="guarantees-"))
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    for venv in (".venv", os.environ.get("VENV", ".venv")):
        if (ROOT / venv).exists() and not (target / venv).exists():
            (target / venv).symlink_to(ROOT / venv)
    return target


def pytest(tree: Path, tests: list[str], backend: str) -> tuple[int, str, str]:
    """Run `tests` in `tree` on `backend`: pytest's exit code, the first failure's assertion (else its summary line),
    and the test that failed."""
    env = {**os.environ, "DATASTORE": backend}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return -1, f"no answer in {TIMEOUT} s", ""
    lines = done.stdout.splitlines()
    said = [line[1:].strip() for line in lines if line.startswith("E ")]  # the first failure's assertion
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    test = failed[0].split()[1] if failed and len(failed[0].split()) > 1 else ""  # "FAILED tests/x.py::t - ..."
    return done.returncode, (said or failed or lines[-1:] or [""])[0][:300], test


def run(mutations: list[Mutation], tree: Path) -> list[Outcome]:
    outcomes, baseline = [], {}
    for mutation in mutations:
        path = tree / mutation.file
        text = path.read_text() if path.is_file() else ""
        for backend in mutation.backends:
            if text.count(mutation.find) != 1:
                outcomes.append(Outcome(mutation, backend, "error",
                                        f"`find` occurs {text.count(mutation.find)} times in {mutation.file}"))
                continue
            key = (tuple(mutation.tests), backend)
            if key not in baseline:
                baseline[key] = pytest(tree, mutation.tests, backend)
            code, detail, _ = baseline[key]
            if code != 0:
                outcomes.append(Outcome(mutation, backend, "error", f"fails unbroken (exit {code}): {detail}"))
                continue
            path.write_text(text.replace(mutation.find, mutation.replace))
            try:
                code, detail, test = pytest(tree, mutation.tests, backend)
            finally:
                path.write_text(text)
            verdict = "killed" if code == 1 else "survived" if code == 0 else "error"
            outcomes.append(Outcome(mutation, backend, verdict, detail if code else "every named test passed", test))
            print(f"{verdict:8} {backend:9} {mutation.row[:60]!r}: {detail[:150]}", flush=True)
    return outcomes


def write_doc(outcomes: list[Outcome]) -> list[str]:
    """Each row's "checked" cell from its outcomes; returns the rows named by an entry that the document lacks."""
    lines = DOC.read_text().splitlines()
    missing = []
    by_row: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_row.setdefault(outcome.mutation.row, []).append(outcome)
    for row, results in by_row.items():
        at = [i for i, line in enumerate(lines) if line.startswith(f"| {row}")]
        if len(at) != 1:
            missing.append(row)
            continue
        checked = "; ".join(f"{o.verdict} ({o.backend}){_by(o.test)}: {o.mutation.says}: `{_brief(o.detail)}`"
                            for o in results)
        lines[at[0]] = lines[at[0]].rstrip(" |").rsplit(" | ", 1)[0] + f" | {checked} |"
    DOC.write_text("\n".join(lines) + "\n")
    return missing


def _by(test: str) -> str:
    """Which of the row's tests caught the break (its name, the file is the row's), when pytest named one."""
    return f" by `{test.rpartition('::')[2]}`" if test else ""


def _brief(detail: str) -> str:
    """What the assertion said, fit for a table cell."""
    return detail.replace("|", "\\|").replace("`", "'")[:160]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="only entries whose row or file contains this text")
    parser.add_argument("--entries", default="*", help="only the entries of tests/mutations/NAME.toml (a glob)")
    parser.add_argument("--backend", choices=("legacy", "firestore"), help="only this backend's runs")
    parser.add_argument("--changed-since", metavar="COMMIT",
                        help="only entries whose file, tests or entry changed since COMMIT")
    parser.add_argument("--write", action="store_true", help="write the outcomes into docs/guarantees.md")
    args = parser.parse_args()
    mutations = load(args.only, args.entries)
    if args.backend:
        mutations = [dataclasses.replace(m, backends=[b for b in m.backends if b == args.backend]) for m in mutations]
    if args.changed_since:
        mutations = changed_since(mutations, args.changed_since)
        print(f"{len(mutations)} entries whose code, tests or entry changed since {args.changed_since[:12]}")
        if not mutations:
            return 0
    if not mutations:
        print("no mutation entries match", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still removes its scratch copy
    started, tree = time.monotonic(), scratch_copy()
    try:
        outcomes = run(mutations, tree)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    counts = {v: sum(o.verdict == v for o in outcomes) for v in ("killed", "survived", "error")}
    print(f"{counts['killed']} killed, {counts['survived']} survived, {counts['error']} errors "
          f"in {time.monotonic() - started:.0f} s")
    if args.write:
        for row in write_doc(outcomes):
            print(f"error: no single row of docs/guarantees.md starts with {row!r}")
            counts["error"] += 1
    return 0 if counts["survived"] == counts["error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
