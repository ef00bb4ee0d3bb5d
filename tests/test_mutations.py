"""The entries of `make guarantees` (tests/mutations/*.toml) stay true to the code, the tests and docs/guarantees.md,
so that a break that no longer applies is caught here, on every run, and not only when someone runs the mutations."""
import ast
import dataclasses
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
    elsewhere = dataclasses.replace(mutation, row="Nowhere")
    assert run.write_doc([run.Outcome(elsewhere, "legacy", "killed", "x")]) == ["Nowhere"]
