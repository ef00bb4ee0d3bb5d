"""`make mutants --resume` (devstack/mutants.py): a run of many hours is made in parts only if each part keeps the
verdicts of the last and runs the mutants that have none. mutmut itself is not run here (the real run is hours);
its files are written as mutmut 3.8 writes them."""
import json

import pytest

from devstack import mutants


@pytest.fixture()
def work(tmp_path, monkeypatch):
    monkeypatch.setattr(mutants, "WORK", tmp_path / "mutants-run")
    monkeypatch.setattr(mutants, "FIRESTORE_WORK", tmp_path / "mutants-firestore")
    return tmp_path / "mutants-run"


def _meta(work, path, exit_codes):
    meta = work / "mutants" / f"{path}.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": exit_codes, "hash_by_function_name": {}}))


def test_a_resumed_run_keeps_the_verdicts_and_the_stats_and_writes_the_tree_again(work):
    """--resume keeps mutmut's .meta files, its stats and the sessions' timings; every other file of the scratch tree
    (a mutated module, an old source file) is written again from the commit."""
    _meta(work, "counters/simple.py", {"counters.simple.x_total__mutmut_1": 1})
    (work / "mutants" / "mutmut-stats.json").write_text("{}")
    (work / "mutants" / "counters" / "simple.py").write_text("# a mutated copy from the last run")
    (work / "sessions.jsonl").write_text('{"mutant": "stats", "exit": 0, "seconds": 1}\n')
    (work / "main.py").write_text("# an old source file")
    mutants.scratch_tree("HEAD", resume=True)
    assert json.loads((work / "mutants" / "counters" / "simple.py.meta").read_text())["exit_code_by_key"] == {
        "counters.simple.x_total__mutmut_1": 1}
    assert (work / "mutants" / "mutmut-stats.json").exists() and (work / "sessions.jsonl").exists()
    assert not (work / "mutants" / "counters" / "simple.py").exists()  # mutmut writes it again, keeping verdicts
    assert (work / "main.py").read_text() != "# an old source file"
    assert (work / "counters" / "simple.py").exists() and (work / ".venv").is_symlink()


def test_a_run_that_does_not_resume_starts_from_nothing(work):
    _meta(work, "counters/simple.py", {"counters.simple.x_total__mutmut_1": 1})
    (work / "sessions.jsonl").write_text("{}\n")
    mutants.scratch_tree("HEAD", resume=False)
    assert not (work / "mutants").exists() and not (work / "sessions.jsonl").exists()


def test_a_resumed_run_names_the_mutants_without_a_verdict_of_the_functions_asked_for(work):
    """Not run yet (None) and "no tests" (33: the stats of a narrower list of test files may have missed the
    function) are run again; killed (1), survived (0), timed out (36) are kept; core/identity.py's functions outside
    its session code are never named."""
    _meta(work, "counters/simple.py", {
        "counters.simple.x_total__mutmut_1": 1, "counters.simple.x_total__mutmut_2": 0,
        "counters.simple.x_total__mutmut_3": None, "counters.simple.x_total__mutmut_4": 33,
        "counters.simple.x_total__mutmut_5": 36})
    _meta(work, "core/identity.py", {"core.identity.x_sign_out__mutmut_1": None,
                                     "core.identity.x_display_name__mutmut_1": None})
    assert mutants.undecided(["counters/simple.py", "core/identity.py"]) == [
        "core.identity.x_sign_out__mutmut_1", "counters.simple.x_total__mutmut_3", "counters.simple.x_total__mutmut_4"]


def test_firestore_only_code_is_judged_by_the_firestore_run(work):
    """counters/writes.py's BlindShardWriter runs on Firestore only: the legacy run's verdicts on its mutants (tests
    reach it there without judging it) give way to the Firestore run's, or to "not run" before there is one; the rest
    of the module keeps the legacy run's."""
    blind, other = "counters.writes.xǁBlindShardWriterǁwrite__mutmut_1", "counters.writes.x_shard_writer__mutmut_1"
    _meta(work, "counters/writes.py", {blind: 0, other: 0})
    assert mutants.outcomes(["counters/writes.py"])["counters/writes.py"] == {blind: "not run", other: "survived"}
    assert "no run with DATASTORE=firestore yet" in mutants.firestore_run()
    _meta(mutants.FIRESTORE_WORK, "counters/writes.py", {blind: 1, other: 0})
    assert mutants.outcomes(["counters/writes.py"])["counters/writes.py"] == {blind: "killed", other: "survived"}
    assert mutants.firestore_only(blind) and not mutants.firestore_only(other)
    assert not mutants.firestore_only("counters.simple.xǁBlindShardWriterǁwrite__mutmut_1")


def test_a_stopped_runs_score_counts_the_mutants_it_ran_and_says_how_many_are_left():
    """A mutant not run yet is neither killed nor survived: the score is over the ones run, and "not run" says how
    many a --resume has left; a mutant no test reaches still counts against the score."""
    tally = mutants.counts({"a": "killed", "b": "killed", "c": "timeout", "d": "survived", "e": "no tests",
                            "f": "not run", "g": "not run"})
    assert tally["not run"] == "2" and tally["mutants"] == "7"
    assert tally["score"] == "60.0%"  # (2 killed + 1 timeout) / 5 run


def test_each_mutant_is_placed_on_the_source_line_it_changes(work, monkeypatch):
    """docs/mutants.md's survivors and its rows beside the guarantees name the line a mutant changes: found from
    mutmut's own mutated copy of a module (written here by mutmut's generator), a function's and a method's."""
    from mutmut import configuration
    from mutmut.mutation.file_mutation import mutate_file_contents
    source = ('"""A module."""\n\n\ndef add(a, b):\n    total = a + b\n    return total\n\n\n'
              'class Box:\n    def __init__(self):\n        self.size = 2\n')
    (work / "mutants").mkdir(parents=True)
    (work / "box.py").write_text(source)
    (work / "setup.cfg").write_text("[mutmut]\nsource_paths =\n    box.py\n")  # mutmut's settings, as a run's
    monkeypatch.chdir(work)  # where mutmut reads them (else it guesses from the directory's name)
    monkeypatch.setattr(configuration, "_config", None)
    (work / "mutants" / "box.py").write_text(mutate_file_contents("box.py", source).code)
    changes = mutants.mutant_changes("box.py")
    assert changes and all(line for _, line in changes.values())
    lines = source.splitlines()
    for name, (change, line) in changes.items():
        before = change.partition(" / ")[0].removeprefix("- ")
        assert lines[line - 1].strip() == before, (name, change, line)
    assert {line for _, line in changes.values()} == {5, 11}  # `total = a + b` and `self.size = 2`
    assert any("Box" in name for name in changes)


def test_a_run_keeps_the_rows_of_the_modules_it_left_alone_and_drops_a_renamed_modules(tmp_path, monkeypatch):
    """A run over some modules keeps the other modules' rows of docs/mutants.md; a module no longer in MODULES (as
    mapper/handback.py, renamed mapper/unvisited.py) loses its rows, which would score code that is gone."""
    doc = tmp_path / "mutants.md"
    doc.write_text("# Mutants\n\n## Per module\n\n| module | lines |\n|---|---|\n"
                   "| `counters/simple.py` | 88 |\n| `comments/bookmarks.py` | 46 |\n| `mapper/handback.py` | 27 |\n"
                   "\n## Survivors\n\n| module | line |\n|---|---|\n| `mapper/handback.py` | 20 |\n")
    monkeypatch.setattr(mutants, "DOC", doc)
    assert mutants.rows_left_alone("Per module", ["comments/bookmarks.py"]) == ["| `counters/simple.py` | 88 |"]
    assert mutants.rows_left_alone("Survivors", ["comments/bookmarks.py"]) == []


def test_a_run_keeps_the_rows_beside_the_guarantees_of_the_modules_it_left_alone(work, tmp_path, monkeypatch):
    """docs/mutants.md's rows beside the guarantees are kept per module as the tables above are: a run over some
    modules keeps the other modules' rows, drops a renamed module's (mapper/handback.py) and its own old ones, and
    puts every row in MODULES' order."""
    doc = tmp_path / "mutants.md"
    doc.write_text("# Mutants\n\n## Beside the guarantees\n\n| guarantee | break | lines | mutmut's mutants on them |\n"
                   "|---|---|---|---|\n| T | t | `mapper/tree.py`:5-5 | killed 2 |\n"
                   "| A | a | `counters/writes.py`:40-40 | killed 3 |\n"
                   "| B | b | `comments/bookmarks.py`:20-21 | killed 1 |\n"
                   "| C | c | `mapper/handback.py`:9-9 | none |\n")
    monkeypatch.setattr(mutants, "DOC", doc)
    source = (mutants.REPO / "comments" / "bookmarks.py").read_text()
    for copy in (work / "comments" / "bookmarks.py", work / "mutants" / "comments" / "bookmarks.py"):
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(source)
    rows = mutants.beside_guarantees({"comments/bookmarks.py": {}})  # the run's module, with no mutant: "none"
    assert rows[0] == "| A | a | `counters/writes.py`:40-40 | killed 3 |"
    assert rows[-1] == "| T | t | `mapper/tree.py`:5-5 | killed 2 |"
    assert len(rows) > 2 and all("| `comments/bookmarks.py`:" in row and row.endswith("| none |") for row in rows[1:-1])


def test_a_report_written_again_while_its_run_goes_on_replaces_that_runs_entry(tmp_path, monkeypatch):
    """`--report-only` during a run of hours writes the doc again; the run's entry under "Runs" is its newest state,
    once, while the earlier runs' entries stay as they were written."""
    doc = tmp_path / "mutants.md"
    doc.write_text("# Mutants\n\n## Runs\n\n### 2026-11-30 01:45 UTC: `a.py`\n\n- summary: 10\n\n"
                   "### 2026-11-29 22:47 UTC: `a.py`\n\n- summary: 5\n\n## Per module\n")
    monkeypatch.setattr(mutants, "DOC", doc)
    assert mutants.earlier_runs("2026-11-30 01:45 UTC") == ["### 2026-11-29 22:47 UTC: `a.py`", "", "- summary: 5", ""]
    assert len(mutants.earlier_runs("2026-11-30 09:00 UTC")) == 8


def test_a_run_a_kept_row_still_names_keeps_its_entry_however_old(tmp_path, monkeypatch):
    """Past the newest entries under "Runs", a run's entry stays while a module's row still comes from it (the date
    its last cell names)."""
    doc = tmp_path / "mutants.md"
    doc.write_text("# Mutants\n\n## Runs\n\n### 2026-11-30 23:52 UTC: `b.py`\n\n- new\n\n"
                   "### 2026-11-30 10:32 UTC: `c.py`\n\n- middle\n\n### 2026-11-30 08:49 UTC: `a.py`\n\n- old\n\n"
                   "## Per module\n")
    monkeypatch.setattr(mutants, "DOC", doc)
    row = "| `a.py` | 88 | 47 | 47 | 0 | 0 | 0 | 0 | 0 | 100.0% | 5.1 | 2026-11-30 08:49 UTC, 729622b79c93 |"
    assert mutants.run_of(row) == "2026-11-30 08:49 UTC"
    kept = mutants.earlier_runs("2026-12-01 00:12 UTC", named=[mutants.run_of(row)], keep=1)
    assert [line for line in kept if line.startswith("### ")] == ["### 2026-11-30 23:52 UTC: `b.py`",
                                                                  "### 2026-11-30 08:49 UTC: `a.py`"]


def test_a_trial_over_some_mutants_shows_those_and_a_resumed_run_shows_every_verdict(work):
    """`--mutants` alone is a trial: its report shows the mutants it named. With `--resume` the other verdicts were
    kept, so the report shows every mutant of the modules (not a table of the few named this time)."""
    _meta(work, "counters/simple.py", {"counters.simple.x_total__mutmut_1": 1, "counters.simple.x_total__mutmut_2": 0})
    trial = {"modules": ["counters/simple.py"], "mutants": ["counters.simple.x_total__mutmut_1"]}
    assert mutants.shown(trial) == {"counters/simple.py": {"counters.simple.x_total__mutmut_1": "killed"}}
    assert mutants.shown({**trial, "resume": True}) == {"counters/simple.py": {
        "counters.simple.x_total__mutmut_1": "killed", "counters.simple.x_total__mutmut_2": "survived"}}
