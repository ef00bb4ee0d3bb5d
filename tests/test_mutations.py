"""The entries of `make guarantees` (tests/mutations/*.toml) stay true to the code, the tests and docs/guarantees.md,
so that a break that no longer applies is caught here, on every run, and not only when someone runs the mutations."""
import ast
import dataclasses
import subprocess
from pathlib import Path

import pytest

from tests.mutations import run

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = run.load()


def test_there_are_entries():
    assert ENTRIES, "tests/mutations/*.toml hold no [[mutation]] entry"


@pytest.mark.parametrize("mutation", ENTRIES, ids=lambda m: f"{m.source}:{m.row[:40]}")
def test_each_entry_breaks_one_place_names_real_tests_and_one_row(mutation):
    text = (ROOT / mutation.file).read_text()
    assert text.count(mutation.find) == 1, f"{mutation.file} has `find` {text.count(mutation.find)} times, not once"
    assert mutation.replace != mutation.find
    assert set(mutation.backends) <= {"legacy", "firestore"} and mutation.backends
    for test in mutation.tests:
        path, _, name = test.partition("::")
        module = ast.parse((ROOT / path).read_text())
        defined = {node.name for node in module.body if isinstance(node, ast.FunctionDef)}
        assert not name or name.split("[")[0] in defined, f"{test} names no test function"
    rows = [line for line in (ROOT / "docs/guarantees.md").read_text().splitlines()
            if line.startswith(f"| {mutation.row}")]
    assert len(rows) == 1, f"{len(rows)} rows of docs/guarantees.md start with {mutation.row!r}"


def test_the_outcome_is_written_into_the_rows_checked_cell_only(tmp_path, monkeypatch):
    doc = tmp_path / "guarantees.md"
    doc.write_text("| guarantee | claimed | test | checked |\n|---|---|---|---|\n"
                   "| A thing holds | x.md | `t` | read |\n| Another | y.md | `u` | read |\n")
    monkeypatch.setattr(run, "DOC", doc)
    mutation = run.Mutation("A thing holds", "f.py", "a", "b", "its check removed", ["t"], ["legacy"], "x.toml")
    missing = run.write_doc([run.Outcome(mutation, "legacy", "killed", "assert 1 == 2 | twice")])
    lines = doc.read_text().splitlines()
    assert missing == []
    assert lines[2] == "| A thing holds | x.md | `t` | killed (legacy): its check removed: `assert 1 == 2 \\| twice` |"
    assert lines[3] == "| Another | y.md | `u` | read |"
    run.write_doc([run.Outcome(mutation, "legacy", "killed", "assert 0", "tests/test_x.py::test_holds[legacy]")])
    assert doc.read_text().splitlines()[2].endswith(" | killed (legacy) by `test_holds[legacy]`: its check removed: "
                                                    "`assert 0` |")  # which test caught it
    elsewhere = dataclasses.replace(mutation, row="Nowhere")
    assert run.write_doc([run.Outcome(elsewhere, "legacy", "killed", "x")]) == ["Nowhere"]


def test_changed_since_picks_the_entries_whose_file_tests_or_entry_changed(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    for name in ("a.py", "b.py", "tests/test_a.py", "tests/test_b.py", "m.toml", "n.toml"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "table written")
    monkeypatch.setattr(run, "ROOT", tmp_path)
    entry = run.Mutation("r", "a.py", "x", "y", "s", ["tests/test_a.py::test_x"], ["legacy"], "m.toml")
    others = [dataclasses.replace(entry, file="b.py", tests=["tests/test_b.py"], source="n.toml")]
    assert run.changed_since([entry, *others], "HEAD") == []
    for changed in ("a.py", "tests/test_a.py", "m.toml"):
        (tmp_path / changed).write_text("changed\n")
        assert run.changed_since([entry, *others], "HEAD") == [entry], changed
        git("checkout", "-q", "--", changed)
    (tmp_path / "tests/test_new.py").write_text("")  # a new file that no entry names changes none of them
    assert run.changed_since([entry, *others], "HEAD") == []
