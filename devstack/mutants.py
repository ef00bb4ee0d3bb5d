"""`make mutants`: mutmut (pinned in requirements-dev.txt) over named modules of the app, on one backend, and
docs/mutants.md written from the outcome.

    make mutants                                    # every module of MODULES below, legacy emulator, memcached
    make mutants MODULES="comments/bookmarks.py"    # a subset (paths as below, space-separated)
    make mutants MODULES="..." TESTS="tests/test_comments.py"   # other test files for mutmut's stats run (a trial)
    make mutants ARGS=--resume                      # go on from the last run: only mutants it has no verdict on

What it does, in order:
1. extracts HEAD (`git archive`; ARGS="--commit REV": another commit; ARGS=--working-tree: the files git knows as
   the working tree has them now) to a fresh scratch tree, .devstack/mutants/ (git-ignored), so that edits made in
   the working tree meanwhile change nothing, and the report names the commit it ran on;
2. writes mutmut's settings there (setup.cfg's [mutmut]: the modules, the test files, the fork server, this plugin);
3. starts one emulator (DATASTORE's, at consistency 1.0, as tests/conftest.py's `stack`) that every mutant's pytest
   session borrows (devstack/mutants_plugin.py): the Java emulator starts once, not once per mutant;
4. has mutmut write the mutants, then runs `mutmut run --max-children 1 <their names>`: mutmut's stats run first
   runs the test files once, recording which tests reach each function; then each mutant runs only the tests that
   reached its function (-x). With --resume, the verdicts of the last run are kept (mutmut's .meta files: mutmut
   itself drops those of a function whose code changed since) and only the mutants without one are named, so a run
   of many hours is made in parts, session by session;
5. writes docs/mutants.md: the date, the commit, mutmut's version, per module mutants / killed / survived / timeout
   / score, the time per mutant, each survivor's diff with a column for people to say why it survives (kept
   across runs for a survivor whose change is the same), and the mutants on the lines of each break of
   docs/guarantees.md. A run over a subset replaces that subset's rows only, in each table; under "Runs" the ten
   newest entries stay, and any older one a module's row still comes from.

Not part of `make test` or CI: a full run takes hours at one worker (docs/mutants.md, the trials' projection). To
make it in parts, stop it (Ctrl-C, or SIGTERM to this script: each mutant's verdict is saved as it comes), write what
it has (`ARGS=--report-only`), and go on later with `ARGS=--resume`.
"""
import argparse
import ast
import contextlib
import datetime
import difflib
import fnmatch
import importlib.metadata
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from devstack.services import Stack, backend_from_env, cache_from_env

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".devstack" / "mutants"
DOC = REPO / "docs" / "mutants.md"
PACKAGES = ["accounts", "appstats", "blog", "comments", "core", "counters", "latency", "mapper", "planner", "tour"]

# The test files of mutmut's stats run, one list for every module (found by what imports each module or drives it
# through the API): mutmut drops every verdict when the list changes, so a run over some modules names them all too,
# and --resume keeps the verdicts. mutmut then picks, per function, the tests among them that reached it.
TESTS = ["tests/test_counters.py", "tests/test_api_counters.py", "tests/test_idempotency.py",
         "tests/test_blog.py", "tests/test_api_blog.py", "tests/test_comments.py", "tests/test_api_comments.py",
         "tests/test_mapper.py", "tests/test_api_jobs.py", "tests/test_termination.py", "tests/test_accounts.py",
         "tests/test_integrity.py", "tests/test_once.py", "tests/test_core.py", "tests/test_sessions.py",
         "tests/test_mutants_bookmarks_handback.py", "tests/test_mutants_survivors.py"]  # these two: written to kill
# survivors (the trial's, and the full run's); a new test goes into one of them, so that the list stays the same
# Each module and the functions to mutate (None: all of them).
MODULES: dict[str, list[str] | None] = {
    "counters/simple.py": None,
    "counters/service.py": None,
    "counters/writes.py": None,
    "blog/service.py": None,
    "comments/service.py": None,
    "comments/bookmarks.py": None,
    "mapper/tree.py": None,
    "mapper/unvisited.py": None,
    "mapper/completion.py": None,
    "core/transactions.py": None,
    "core/exactly_once.py": None,
    # the session code only: the generation that sign-out renews, the cookie's checks, sign-in's and sign-out's
    # session (not the Google token checks nor the names shown)
    "core/identity.py": ["_generation_key", "generation", "_renew_generation", "_session_is_current", "current_user",
                         "_keep", "sign_out"],
}
# Code only Firestore runs (classes or functions by module): the legacy run's tests reach it without judging it, so
# its mutants are judged by a run with DATASTORE=firestore (`DATASTORE=firestore make mutants ARGS=--resume`, in its
# own scratch tree, FIRESTORE_WORK), whose verdicts the report takes for them. counters/writes.py's BlindShardWriter:
# a server-side increment and the marker's insert in one commit, the backend's own writer (legacy's is transactional).
FIRESTORE_ONLY: dict[str, list[str]] = {"counters/writes.py": ["BlindShardWriter"]}
FIRESTORE_WORK = REPO / ".devstack" / "mutants-firestore"
# mutmut's exit codes, as its stats module names them; "score" below is mutmut's own (its badge): killed and timed
# out over all mutants but the skipped ones, so a mutant no test reaches ("no tests") counts against it.
COLUMNS = ["mutants", "killed", "survived", "timeout", "no tests", "other", "not run", "score"]
TABLE = ["lines", *COLUMNS, "s / mutant"]


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def firestore_only(name: str) -> bool:
    """Whether mutmut's mutant `name` is in FIRESTORE_ONLY's code (mutmut names a function f's mutants `x_f__mutmut_N`,
    a method m's of class C `xǁCǁm__mutmut_N`)."""
    module, _, mutant = name.rpartition(".")
    return any(mutant.startswith((f"xǁ{code}ǁ", f"x_{code}__mutmut_"))
               for path, codes in FIRESTORE_ONLY.items() if module_name(path) == module for code in codes)


def globs(modules: list[str]) -> list[str]:
    """mutmut's mutant names to run: `pkg.mod.x_func__mutmut_N`, every function's or the listed ones'."""
    found = []
    for path in modules:
        functions = MODULES.get(path)  # None too for a module renamed since the run
        found += [f"{module_name(path)}.x_{f}__mutmut_*" for f in functions] if functions else [
            f"{module_name(path)}.*"]
    return found


def scratch_tree(commit: str | None, resume: bool) -> None:
    """WORK, fresh: the tree of `commit` (git archive), or with None the files git knows as the working tree has
    them now (uncommitted edits, others' too); this tool's pytest plugin as it is here (an older commit may predate
    it); the virtualenv linked. `resume`: mutmut's verdicts (mutants/**/*.meta), its stats (which tests reach each
    function) and the sessions' timings are kept; every other file is written again."""
    kept = {}
    if resume and (WORK / "mutants").is_dir():
        kept = {path.relative_to(WORK): path.read_bytes() for path in [*(WORK / "mutants").rglob("*"),
                                                                        WORK / "sessions.jsonl"]
                if path.suffix == ".meta" or path.name in ("mutmut-stats.json", "sessions.jsonl") and path.exists()}
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    for path, content in kept.items():
        (WORK / path).parent.mkdir(parents=True, exist_ok=True)
        (WORK / path).write_bytes(content)
    if commit is not None:
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(WORK)], input=archive, check=True)
    else:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                                capture_output=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            source = REPO / name
            if source.is_file():
                (WORK / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, WORK / name)
    shutil.copy2(Path(__file__).with_name("mutants_plugin.py"), WORK / "devstack" / "mutants_plugin.py")
    (WORK / ".venv").symlink_to(REPO / ".venv")


def write_settings(modules: list[str], tests: list[str]) -> None:
    top = sorted({path.name for path in WORK.iterdir()} - set(PACKAGES)
                 - {".ci", ".venv", "tests", "setup.cfg", "pyproject.toml", ".gitignore"})

    def lines(values: list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    (WORK / "setup.cfg").write_text(
        "# Written by devstack/mutants.py for this run; see that file.\n[mutmut]\n"
        f"source_paths ={lines(PACKAGES)}\n"
        f"only_mutate ={lines(modules)}\n"
        f"also_copy ={lines(top)}\n"
        f"pytest_add_cli_args ={lines(['-p', 'devstack.mutants_plugin', '-p', 'no:cacheprovider'])}\n"
        f"pytest_add_cli_args_test_selection ={lines(tests)}\n"
        # grpc (ndb's transport) is not fork-safe once used: mutmut's parent stays clean and forks each mutant from
        # a server that has only collected the tests
        "process_isolation = forkserver\n"
        # a mutant's wall limit is (its tests' measured time + this) x 15: room for fixtures' setup, which mutmut's
        # measure leaves out, on a machine other suites share
        "timeout_constant = 5\n")


def generate(env: dict[str, str]) -> None:
    """mutmut's own first step, alone: the mutants written into WORK/mutants, and each module's .meta with a verdict
    for every mutant (None: not run yet; kept from the last run where the function's code is the same)."""
    subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c",
                    "from mutmut.__main__ import create_mutants\n"
                    "from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir\n"
                    "copy_src_dir(); copy_also_copy_files(); create_mutants(1)"],
                   cwd=WORK, env=env, check=True, stdout=subprocess.DEVNULL)


def undecided(modules: list[str]) -> list[str]:
    """The mutants of `modules` (their listed functions) that have no verdict: not run yet, or run when no test
    reached their function (stats from a narrower list of test files may have missed it)."""
    return sorted(name for statuses in outcomes(modules).values() for name, status in statuses.items()
                  if status in ("not run", "no tests"))


def run_mutmut(names: list[str], env: dict[str, str], log: Path) -> tuple[int, list[str]]:
    """mutmut's run, its output passed through and kept; its exit code and its last lines as printed."""
    command = [str(REPO / ".venv" / "bin" / "mutmut"), "run", "--max-children", "1", *names]
    shown = " ".join(command[1:4] + names[:3]) + (f" ... ({len(names)} names)" if len(names) > 3 else "")
    print(f"$ cd {WORK.relative_to(REPO)} && mutmut {shown}", flush=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=WORK, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        try:
            for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # type: ignore[union-attr]
                out.write(chunk)
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        except BaseException:  # stopped (Ctrl-C, SIGTERM): mutmut stops its workers on SIGINT, its verdicts saved
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            finally:
                proc.kill()
            raise
        code = proc.wait()
    return code, printed_summary(log)


def printed_summary(log: Path) -> list[str]:
    """mutmut's last status line (done/all and its counts by status, after its spinner) and its speed, as printed."""
    printed = [line.strip() for line in re.split(r"[\r\n]", log.read_text(errors="replace")) if line.strip()]
    stats = [m.group(1) for m in (re.search(r"(\d+/\d+\s+🎉.*)$", line) for line in printed) if m]
    speed = [line for line in printed if "mutations/second" in line]
    return stats[-1:] + speed[-1:]


def outcomes(modules: list[str]) -> dict[str, dict[str, str]]:
    """Each mutant's status by module, from mutmut's meta files, restricted to the functions asked for (mutmut's
    "not checked": "not run")."""
    from mutmut.stats import status_by_exit_code
    found = {}
    for path in modules:
        meta = json.loads((WORK / "mutants" / f"{path}.meta").read_text())
        functions = MODULES.get(path)  # None too for a module renamed since the run
        keep = {f"{module_name(path)}.x_{f}__mutmut_" for f in functions} if functions else None
        found[path] = {name: "not run" if code is None else status_by_exit_code[code]
                       for name, code in meta["exit_code_by_key"].items()
                       if keep is None or any(name.startswith(prefix) for prefix in keep)}
    if WORK != FIRESTORE_WORK:  # the legacy run's report: FIRESTORE_ONLY's code as the Firestore run judged it
        for path in set(found) & set(FIRESTORE_ONLY):
            meta_file = FIRESTORE_WORK / "mutants" / f"{path}.meta"
            there = json.loads(meta_file.read_text())["exit_code_by_key"] if meta_file.exists() else {}
            for name in [name for name in found[path] if firestore_only(name)]:
                code = there.get(name)
                found[path][name] = "not run" if code is None else status_by_exit_code[code]
    return found


def counts(statuses: dict[str, str]) -> dict[str, str]:
    tally = dict.fromkeys(COLUMNS[:-1], 0)
    for status in statuses.values():
        tally[status if status in tally else "other"] += 1
    tally["mutants"] = len(statuses)
    tested = len(statuses) - sum(s == "skipped" for s in statuses.values()) - tally["not run"]
    score = f"{100 * (tally['killed'] + tally['timeout']) / tested:.1f}%" if tested else "-"
    return {**{k: str(v) for k, v in tally.items()}, "score": score}


def mutant_changes(path: str) -> dict[str, tuple[str, int | None]]:
    """Each mutant of `path` (mutmut's name), its change (`- before / + after`) and the line of the source file it
    is on: in mutmut's copy of the module each function's mutant sits beside its unchanged copy (`__mutmut_orig`),
    so they are compared line by line, the unchanged copy's lines counted from the function's own in the source."""
    mutated = (WORK / "mutants" / path).read_text().splitlines()
    copies = {node.name: mutated[node.lineno - 1:node.end_lineno]
              for node in ast.walk(ast.parse("\n".join(mutated))) if isinstance(node, ast.FunctionDef)}
    starts = {}  # "f" or "Class.method" -> the line of its `def` in the source
    for node in ast.parse((WORK / path).read_text()).body:
        for inner in [node, *node.body] if isinstance(node, ast.ClassDef) else [node]:
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                starts[f"{node.name}.{inner.name}" if inner is not node else inner.name] = inner.lineno
    found: dict[str, tuple[str, int | None]] = {}
    for name, lines in copies.items():
        function, _, number = name.partition("__mutmut_")
        if not number.isdigit():
            continue
        # mutmut names a function f `x_f`, a method m of class C `xǁCǁm`
        qualified = function[2:].replace("ǁ", ".")
        plain = qualified.rpartition(".")[2]
        orig = [line.replace(f"{function}__mutmut_orig", plain) for line in copies[f"{function}__mutmut_orig"]]
        lines = [line.replace(name, plain) for line in lines]
        ops = difflib.SequenceMatcher(None, orig, lines).get_opcodes()
        _, first, end, added, added_end = next((op for op in ops if op[0] != "equal"), ("", 0, 0, 0, 0))
        change = " / ".join([f"- {line.strip()}" for line in orig[first:end]]
                            + [f"+ {line.strip()}" for line in lines[added:added_end]])
        where = starts.get(qualified)
        found[f"{module_name(path)}.{name}"] = (change, where + first if where else None)
    return found


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def code(text: str) -> str:
    text = cell(text)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def existing_rows(heading: str) -> list[str]:
    """The table rows of docs/mutants.md's section `heading` (none when there is no such file or section)."""
    if not DOC.exists():
        return []
    rows, inside = [], False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            inside = line[3:].strip() == heading
        elif inside and line.startswith("| ") and not line.startswith(("| module", "| guarantee", "|---")):
            rows.append(line)
    return rows


def earlier_runs(date: str, named: Iterable[str] = (), keep: int = 9) -> list[str]:
    """The `keep` newest run entries ("### ...") of docs/mutants.md's "Runs", and any older one whose date is in
    `named` (a row kept still names it), as they are written there, but the run of `date`'s own: a report written
    again while its run goes on (--report-only) replaces that run's entry."""
    if not DOC.exists():
        return []
    entries: list[list[str]] = []
    inside = False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            inside = line[3:].strip() == "Runs"
        elif inside and line.startswith("### "):
            entries.append([line])
        elif inside and entries:
            entries[-1].append(line)
    entries = [entry for entry in entries if entry_date(entry[0]) != date]
    named = set(named)
    return [line for i, entry in enumerate(entries) if i < keep or entry_date(entry[0]) in named for line in entry]


def entry_date(heading: str) -> str:
    """The date of a run's entry under "Runs", from its heading: "### 2026-11-30 08:49 UTC: `a.py`"."""
    return heading.removeprefix("### ").partition(": ")[0]


def cells(row: str) -> list[str]:
    """A table row's cells, stripped (a `|` inside a cell is written `\\|`: `cell`)."""
    return [text.strip() for text in re.split(r"(?<!\\)\|", row)[1:-1]]


def run_of(row: str) -> str:
    """The date of the run a row of "Per module" comes from (its last cell: `date, commit`)."""
    return cells(row)[-1].partition(",")[0]


def module_cell(row: str, column: int = 0) -> str:
    """The module a table row names in its cell `column`: `path`, or `path`:first-last (beside the guarantees)."""
    row_cells = cells(row)
    return row_cells[column].partition(":")[0].strip("`") if len(row_cells) > column else ""


def rows_left_alone(heading: str, modules: list[str], column: int = 0) -> list[str]:
    """The rows of section `heading` to keep: those of MODULES this run left alone (the module named in cell
    `column`). A module no longer in MODULES (renamed, or no longer mutated) has its rows dropped: its figures would
    describe code that is gone."""
    return [row for row in existing_rows(heading) if module_cell(row, column) in set(MODULES) - set(modules)]


def in_module_order(rows: list[str], column: int = 0) -> list[str]:
    """`rows` in MODULES' order of the module each names in cell `column` (as they were, within one module)."""
    order = {path: i for i, path in enumerate(MODULES)}
    return sorted(rows, key=lambda row: order.get(module_cell(row, column), len(order)))


def write_doc(modules: list[str], found: dict[str, dict[str, str]], run: dict[str, str], timing: list[str],
              note: str | None) -> None:
    kept_modules, kept_survivors = rows_left_alone("Per module", modules), rows_left_alone("Survivors", modules)
    said = {}  # (mutant, change) -> what a person wrote in the last column
    for row in existing_rows("Survivors"):
        row_cells = cells(row)
        if len(row_cells) == 6 and row_cells[5]:
            said[(row_cells[2].strip("`"), row_cells[4])] = row_cells[5]
    stamp = f"{run['date']}, {run['commit'][:12]}"
    rows = []
    for path in modules:
        times = per_mutant(path)
        rows.append(f"| `{path}` | {len((WORK / path).read_text().splitlines())} | "
                    + " | ".join(counts(found[path]).values())
                    + f" | {statistics.mean(times) if times else 0:.1f} | {stamp} |")
    survivors = []
    for path in modules:
        changes = mutant_changes(path)
        for name, status in sorted(found[path].items(), key=lambda item: int(item[0].rpartition("_")[2])):
            if status != "survived":
                continue
            change, line = changes[name]
            short = name.removeprefix(module_name(path) + ".")
            changed = code(change)
            survivors.append(f"| `{path}` | {line or '?'} | `{short}` | {stamp} | {changed} | "
                             f"{said.get((short, changed), '')} |")
    table, survivor_rows = in_module_order(kept_modules + rows), in_module_order(kept_survivors + survivors)
    text = [
        "# Mutants",
        "",
        "Written by `make mutants` ([devstack/mutants.py](../devstack/mutants.py), whose docstring says how to run it",
        "and what it does; linked from [testing.md](testing.md)). Each mutant is one small change mutmut makes to one",
        "function; the tests that reached that function in mutmut's stats run are run against it, up to the first",
        "failure.",
        "",
        "## Runs",
        "",
        "Newest first (the ten newest, and any older run a module's row below still comes from); the rows below",
        "name the run they come from.",
        "",
        f"### {run['date']}: {', '.join(f'`{m}`' for m in modules)}",
        "",
        f"- date: {run['date']}",
        f"- commit: {run['commit']}" + (f" ({run['dirty']})" if run.get("dirty") else ""),
        f"- tool: mutmut {run['version']}, one worker (`--max-children 1`), fork server isolation",
        f"- backend: DATASTORE={run['backend']} CACHE={run['cache']}",
        firestore_run(),
        f"- modules: {', '.join(f'`{m}`' for m in modules)}",
        f"- stats run's test files: {', '.join(f'`{t}`' for t in run['tests'])}",
        f"- mutmut's summary as printed: {'; '.join(f'`{line}`' for line in run['summary']) or '(none)'}",
        *[f"- {line}" for line in timing],
        *([f"- {note}"] if note else []),
        "",
        *earlier_runs(run["date"], named=[run_of(row) for row in table]),
        "## Per module",
        "",
        "Score: killed and timed out over all mutants but skipped ones (mutmut's own), so a mutant that no test",
        "reaches (\"no tests\") counts against it; in a run stopped before its end, over the mutants it ran (\"not",
        "run\": the ones left for `--resume`). \"other\": suspicious, segfault. Lines: the module's",
        "(the mutants of core/identity.py are its session code's only). s / mutant: the mean wall time of one",
        "mutant's pytest session. Each row names the run (date, commit) it comes from: a run over some modules",
        "replaces their rows only.",
        "",
        "| module | " + " | ".join(TABLE) + " | run |",
        "|---" * (len(TABLE) + 2) + "|",
        *table,
        "",
        "## Survivors",
        "",
        "Each mutant the tests let through: the module, the line it changes, mutmut's name for it (`mutmut show",
        "<module>.<name>` in .devstack/mutants/ prints its whole diff), the change, and for people to fill: whether it",
        "is equivalent (no behaviour can tell it apart) and why, or the test that now kills it.",
        "",
        "| module | line | mutant | run | change | why it survives / killed by |",
        "|---|---|---|---|---|---|",
        *survivor_rows,
        "",
        "## Beside the guarantees",
        "",
        "Each break of [guarantees.md](guarantees.md) (tests/mutations/*.toml) made in a module above, and mutmut's",
        "mutants on the same lines, as the run that judged the module left them: what the row's tests are known to",
        "catch beyond the break written for them (a mutant there that survived is a change on a guarantee's own",
        "lines that no test caught).",
        "",
        "| guarantee | break | lines | mutmut's mutants on them |",
        "|---|---|---|---|",
        *beside_guarantees(found),
        "",
    ]
    DOC.write_text("\n".join(text))


def firestore_run() -> str:
    """The line naming the Firestore run whose verdicts FIRESTORE_ONLY's code takes (or that there is none yet)."""
    code = "; ".join(f"`{path}`'s {', '.join(f'`{c}`' for c in codes)}" for path, codes in FIRESTORE_ONLY.items())
    if not (FIRESTORE_WORK / "run.json").exists():
        return f"- Firestore-only code ({code}): no run with DATASTORE=firestore yet, so its mutants are \"not run\""
    run = json.loads((FIRESTORE_WORK / "run.json").read_text())
    summary = printed_summary(FIRESTORE_WORK / "mutmut.log") if (FIRESTORE_WORK / "mutmut.log").exists() else []
    return (f"- Firestore-only code ({code}): its mutants as the run with DATASTORE=firestore CACHE={run['cache']} of "
            f"{run['date']} at {run['commit'][:12]} judged them; mutmut's summary there as printed: "
            + ("; ".join(f"`{line}`" for line in summary) or "(none)"))


def beside_guarantees(found: dict[str, dict[str, str]]) -> list[str]:
    """One row per break of tests/mutations/*.toml in a module of this run (`found`: its verdicts shown, by module):
    the mutants on its lines; the rows of the modules it left alone as the runs that judged them wrote them, as in
    the tables above."""
    from tests.mutations.run import load
    changes = {path: mutant_changes(path) for path in found}
    rows = []
    for entry in load():
        if entry.file not in found:
            continue
        text = (WORK / entry.file).read_text()
        if text.count(entry.find) != 1:
            rows.append(f"| {cell(entry.row)} | {cell(entry.says)} | `{entry.file}` | (its text is not found once "
                        "at the run's commit: the entry was re-aimed since) |")
            continue
        first = text[:text.index(entry.find)].count("\n") + 1
        last = first + entry.find.strip("\n").count("\n")
        on = {name: status for name, status in found[entry.file].items()
              if first <= (changes[entry.file][name][1] or 0) <= last}
        by_status: dict[str, list[str]] = {}
        for name, status in sorted(on.items()):
            by_status.setdefault(status, []).append(name.rpartition(".")[2])
        said = "; ".join(f"{status} {len(names)}" + (f" ({', '.join(f'`{n}`' for n in names)})"
                                                     if status in ("survived", "no tests") else "")
                         for status, names in sorted(by_status.items())) or "none"
        rows.append(f"| {cell(entry.row)} | {cell(entry.says)} | `{entry.file}`:{first}-{last} | {said} |")
    return in_module_order(rows_left_alone("Beside the guarantees", list(found), column=2) + rows, column=2)


def sessions(since: int = 0) -> list[dict]:
    """Each pytest session, as devstack/mutants_plugin.py timed it: mutant ("stats", "" for the clean run, "fail" for
    the forced failure, else a mutant's name), exit status, seconds. Kept across --resume runs: `since`, the number of
    sessions before this run began, leaves out the earlier runs'."""
    path = WORK / "sessions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()][since:] if path.exists() else []


def per_mutant(module: str | None = None, since: int = 0) -> list[float]:
    return [s["seconds"] for s in sessions(since) if "__mutmut_" in s["mutant"]
            and (module is None or s["mutant"].startswith(module_name(module) + ".x"))]


def timing_lines(seconds: float, stats_tests: list[str], since: int = 0) -> list[str]:
    """This run's times (its sessions from `since` on)."""
    by_kind: dict[str, float] = {}  # "" twice: the clean run, and the fork server's collection (the longer is the run)
    for s in sessions(since):
        if "__mutmut_" not in s["mutant"]:
            by_kind[s["mutant"]] = max(by_kind.get(s["mutant"], 0), s["seconds"])
    lines = [f"wall time: {seconds:.0f} s in all: mutant generation, mutmut's stats run over {len(stats_tests)} test "
             f"files ({by_kind.get('stats', 0):.0f} s), the clean run of the tests it found "
             f"({by_kind.get('', 0):.0f} s), the forced failure, then the mutants"]
    times = per_mutant(since=since)
    if times:
        survived = [s["seconds"] for s in sessions(since) if "__mutmut_" in s["mutant"] and s["exit"] == 0]
        lines.append(f"per mutant (its pytest session, as devstack/mutants_plugin.py timed it): {len(times)} "
                     f"mutants, mean {statistics.mean(times):.1f} s, median {statistics.median(times):.1f} s, "
                     f"longest {max(times):.1f} s, sum {sum(times):.0f} s"
                     + (f"; survivors (every test reaching the function run) mean {statistics.mean(survived):.1f} s"
                        if survived else "")
                     + "; a mutant stopped at mutmut's wall limit (a timeout) ends no session, so is not in these")
    return lines


def main() -> int:
    global WORK  # the Firestore run's is FIRESTORE_WORK
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", default="", help="space-separated paths among MODULES (default: all of them)")
    parser.add_argument("--tests", default="", help="space-separated test files for the stats run (default: TESTS "
                                                    "above; another list drops the last run's verdicts)")
    parser.add_argument("--mutants", default="", help="space-separated mutmut names (globs) to run instead of every "
                                                      "mutant of the modules, e.g. survivors after new tests")
    parser.add_argument("--note", help="a line added to docs/mutants.md's 'Last run' (e.g. that it was a trial)")
    parser.add_argument("--no-doc", action="store_true", help="leave docs/mutants.md as it is")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: write docs/mutants.md from the last run's results in .devstack/mutants/")
    parser.add_argument("--resume", action="store_true",
                        help="keep the last run's verdicts and run only the mutants without one")
    parser.add_argument("--commit", default="HEAD", help="the commit to mutate (default: HEAD)")
    parser.add_argument("--working-tree", action="store_true",
                        help="mutate the working tree as it is now, uncommitted edits included, instead of a commit")
    args = parser.parse_args()
    if args.report_only:  # also after a run that was stopped (its results so far, for --resume to go on from)
        run = json.loads((WORK / "run.json").read_text())
        run["summary"] = printed_summary(WORK / "mutmut.log")
        run["seconds"] = run["seconds"] or round((WORK / "mutmut.log").stat().st_mtime - run["started"])
        return report(run, args.note or run.get("note"), write=True)
    modules = args.modules.split() or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        print(f"not among devstack/mutants.py's MODULES: {', '.join(unknown)}", file=sys.stderr)
        return 2
    tests = args.tests.split() or TESTS
    backend, cache = backend_from_env(), cache_from_env()
    if backend != "legacy":  # the Firestore run: FIRESTORE_ONLY's code alone, in a scratch tree of its own
        WORK, modules = FIRESTORE_WORK, [m for m in modules if m in FIRESTORE_ONLY]
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{args.commit}^{{commit}}"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.strip()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, check=True, capture_output=True,
                            text=True).stdout.splitlines() if args.working_tree else []
    dirty = [line[3:] for line in status if line.strip()]
    run = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
           "dirty": f"the working tree, with uncommitted changes to {', '.join(dirty)}" if dirty else "",
           "version": importlib.metadata.version("mutmut"), "backend": backend, "cache": cache, "tests": tests,
           "modules": modules, "note": args.note, "mutants": args.mutants.split(), "resume": args.resume}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the emulator is still stopped
    started = time.monotonic()
    scratch_tree(None if args.working_tree else commit, args.resume)
    write_settings(modules, tests)
    run |= {"started": time.time(), "seconds": 0,  # for --report-only after a run that was stopped
            "sessions_from": len(sessions())}
    (WORK / "run.json").write_text(json.dumps(run, indent=1))
    emulator = Stack(consistency=1.0, backend=backend).emulator
    emulator.start()
    try:
        env = {**os.environ, "DATASTORE": backend, "CACHE": cache, "MUTANTS_TIMINGS": str(WORK / "sessions.jsonl"),
               "MUTANTS_SHARED_EMULATOR": json.dumps({"backend": backend, "port": emulator.port,
                                                      "pid": emulator.proc.pid})}
        generate(env)
        if WORK == FIRESTORE_WORK:  # FIRESTORE_ONLY's mutants by name: all of them, or those without a verdict
            every = undecided(modules) if args.resume else [n for found in outcomes(modules).values() for n in found]
            names = args.mutants.split() or [name for name in every if firestore_only(name)]
        else:
            names = args.mutants.split() or (undecided(modules) if args.resume else globs(modules))
        print(f"{len(names)} mutants to run" + (" (the ones without a verdict)" if args.resume else ""), flush=True)
        code, summary = run_mutmut(names, env, WORK / "mutmut.log") if names else (0, [])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(emulator.proc.pid, signal.SIGCONT)
        emulator.stop()
    run |= {"summary": summary, "seconds": round(time.monotonic() - started)}
    (WORK / "run.json").write_text(json.dumps(run, indent=1))
    if code != 0:
        print(f"mutmut exited {code}: see {WORK / 'mutmut.log'}", file=sys.stderr)
        return code
    return report(run, args.note, write=not args.no_doc and WORK != FIRESTORE_WORK)  # the legacy run's writes it


def shown(run: dict) -> dict[str, dict[str, str]]:
    """The verdicts a report shows, per module: a trial over some mutants (--mutants) shows those only; a resumed run
    (--resume, with or without --mutants) kept every other verdict, so it shows every mutant of its modules."""
    found = outcomes(run["modules"])
    if not run.get("mutants") or run.get("resume"):
        return found
    return {path: {name: status for name, status in statuses.items()
                   if any(fnmatch.fnmatch(name, pattern) for pattern in run["mutants"])}
            for path, statuses in found.items()}


def report(run: dict, note: str | None, write: bool) -> int:
    modules = run["modules"]
    found = shown(run)
    timing = timing_lines(run["seconds"], run["tests"], run.get("sessions_from", 0))
    print()
    for path in modules:
        print(f"{path}: " + ", ".join(f"{k} {v}" for k, v in counts(found[path]).items()))
    for line in timing:
        print(line)
    if write:
        write_doc(modules, found, run, timing, note)
        print(f"written: {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
