"""lab/history.py against a real git repository: the lines a report prints about a study file
changed after its results, read again after every commit."""

import os
import subprocess

from lab.history import edits


def _commit(repo, minute, message, files):
    """Commit `files` ({path: text}) at a time `minute` minutes into the history (commits in one
    second would tie: history orders them by commit time)."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    date = f"{1_700_000_000 + 60 * minute} +0000"
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    for args in (["add", "-A"], ["commit", "-q", "-m", message]):
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
        subprocess.run(git, check=True, capture_output=True, env=env)


def test_a_study_file_changed_after_its_results_is_named_after_every_commit(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert edits("s", tmp_path) == []  # no commit yet
    _commit(tmp_path, 1, "study", {"lab/studies/s.yaml": "name: s\ngrid: {lr: [0.1]}\n"})
    assert edits("s", tmp_path) == []  # no results yet
    _commit(tmp_path, 2, "results", {"lab/results/s/report.md": "# s\n"})
    assert edits("s", tmp_path) == []  # nothing changed since
    _commit(tmp_path, 3, "wider grid", {"lab/studies/s.yaml": "name: s\ngrid: {lr: [0.1, 1]}\n"})
    first = edits("s", tmp_path)
    assert len(first) == 2 and "the study file changed since" in first[0]
    assert "changed grid.lr: wider grid" in first[1]
    more = "name: s\ngrid: {lr: [0.1, 1]}\nx: 1\n"
    _commit(tmp_path, 4, "more seeds", {"lab/studies/s.yaml": more})
    second = edits("s", tmp_path)  # the new commit is read, not the first answer again
    assert len(second) == 3 and "changed x: more seeds" in second[1] and second[2] == first[1]
    assert edits("other", tmp_path) == []
