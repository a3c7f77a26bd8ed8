"""The docs quote the tree as it is: every file path and script they name exists, DESIGN.md's
layout lists every module and script, no page states a file's line count (a budget rewards packing
lines), and
every committed Markdown table has its header's columns in every row, and every link to a heading
lands on one."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")))]
PATH = re.compile(r"(?<![\w/.<>-])((?:[\w-]+/)*[\w-]+\.(?:py|yaml|md|cpp|h))\b")
LINES = re.compile(r"([\w/-]+\.py)\b[^\n]{0,40}?~?(\d+) lines")
# Names the pages give as examples, not as files of the tree: a run directory's config.yaml, the
# `base: other.yaml` of a config layered on another.
EXAMPLES = {"config.yaml", "other.yaml"}


def tracked() -> list[str]:
    """The repository's files, committed or not but never ignored (the checkout where no git)."""
    r = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if r.returncode == 0 and r.stdout:
        return r.stdout.split()
    return [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()]


def quoted(page: str) -> list[str]:
    """The file names a page quotes, less the run outputs and templates it names as examples."""
    text = (REPO / page).read_text()
    found = PATH.findall(text)
    return sorted(
        {f for f in found if not f.startswith(("runs/", "studies/", "exports/"))} - EXAMPLES
    )


@pytest.mark.parametrize("page", PAGES)
def test_every_file_a_page_names_exists(page):
    """A path is a file from the root or the page's folder; a bare name is some file's name."""
    files = set(tracked())
    names = {f.rsplit("/", 1)[-1] for f in files}
    here = str(Path(page).parent)
    missing = [
        f
        for f in quoted(page)
        if (f not in files and f"{here}/{f}" not in files if "/" in f else f not in names)
    ]
    assert not missing, f"{page} names files the tree does not have: {missing}"


def layout() -> dict[str, list[str]]:
    """DESIGN.md's layout block as {folder: its modules}: the lines under it, else the names its
    description lists (scripts/)."""
    text = (REPO / "docs" / "DESIGN.md").read_text()
    # the library's block, then the layout's
    block = (
        text.split("## The library")[1].split("```")[1] + text.split("## Layout")[1].split("```")[1]
    )
    modules: dict[str, list[str]] = {}
    named: dict[str, list[str]] = {}
    folder = ""
    for line in block.splitlines():
        head = re.match(r"(\S+/)\s", line)
        if head:
            folder = head.group(1)
            modules[folder], named[folder] = [], re.findall(r"\b([\w-]+\.py)\b", line)
        elif re.match(r"  \S+\.py\s", line):  # '  name.py   what it does': a module of the folder
            modules[folder].append(line.split()[0])
        elif folder:  # a continuation line of the folder's own description
            named[folder] += re.findall(r"\b([\w-]+\.py)\b", line)
    return {f: modules[f] or named[f] for f in modules}


@pytest.mark.parametrize(
    "folder", ["normlab/", "lab/", "training/", "model/", "data/", "scripts/", "bench/"]
)
def test_design_lists_every_module_of_each_package_and_no_other(folder):
    tree = layout()
    assert folder in tree, f"DESIGN.md's layout has no {folder}"
    listed = set(tree[folder])
    real = {p.name for p in (REPO / folder).glob("*.py") if p.name != "__init__.py"}
    assert listed == real, (
        f"{folder}: listed but absent {sorted(listed - real)}, present but unlisted "
        f"{sorted(real - listed)}"
    )


def test_the_layout_parser_reads_what_it_is_given():
    """The check above reads modules under their folder: one known module of each is found."""
    tree = layout()
    assert {"readme.py", "outcome.py", "norms.py", "loader.py", "bench_study.py"} <= {
        name for names in tree.values() for name in names
    }


@pytest.mark.parametrize("page", PAGES)
def test_no_page_states_a_files_line_count(page):
    assert not LINES.findall((REPO / page).read_text())


def test_the_line_count_pattern_finds_one():
    assert LINES.findall("train.py            main(argv) (~300 lines): parse") == [
        ("train.py", "300")
    ]


TABLE_RULE = re.compile(r"^\|( *:?-+:? *\|)+$")


def table_rows(text: str) -> list[tuple[int, int, int]]:
    """(line number, cells, the header's cells) of every row of every Markdown table in `text`; a
    pipe inside a code span or escaped (\\|) is not a cell border."""

    def cells(line: str) -> int:
        line = re.sub(r"`[^`]*`", "x", line.strip()).replace("\\|", "x")
        return line.strip("|").count("|") + 1

    lines, rows, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and TABLE_RULE.match(lines[i + 1]):
            header, j = cells(lines[i]), i + 1
            while j < len(lines) and lines[j].startswith("|"):
                rows.append((j + 1, cells(lines[j]), header))
                j += 1
            i = j
        else:
            i += 1
    return rows


def test_table_rows_are_counted_by_their_borders():
    text = "| a | b |\n|---|---|\n| 1 | `x|y` |\n| 1 |\n\n| c |\n| --- |\n| 2 \\| 3 |\n"
    assert table_rows(text) == [(2, 2, 2), (3, 2, 2), (4, 1, 2), (7, 1, 1), (8, 1, 1)]


def test_every_committed_table_has_its_headers_columns_in_every_row():
    """A generated table whose header names a column its rows never fill (critical-band.md had
    one: an empty column promising a figure never computed) or whose rows have a cell too many:
    every row of every table in the pages, the committed results and the benchmarks has as many
    cells as its header."""
    files = [
        *PAGES,
        *(str(p.relative_to(REPO)) for p in sorted((REPO / "lab" / "results").rglob("*.md"))),
        *(str(p.relative_to(REPO)) for p in sorted((REPO / "bench" / "results").glob("*.md"))),
    ]
    wrong = [
        f"{f}:{line} has {n} cells, its header {header}"
        for f in files
        for line, n, header in table_rows((REPO / f).read_text())
        if n != header
    ]
    assert len(files) > 40 and not wrong, wrong


LINK = re.compile(r"\]\(([^)\s]*?)#([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercased, punctuation but - and _ dropped,
    spaces to -, a repeated one suffixed -1, -2, ..."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    found, seen = set(), {}
    for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M):
        h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h.replace("`", ""))
        slug = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_the_anchor_rule_is_githubs(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# A run's outcome (training/run.py)\n## Setup\n## Setup\n```\n# no\n```\n")
    assert anchors(page) == {"a-runs-outcome-trainingrunpy", "setup", "setup-1"}


@pytest.mark.parametrize("page", PAGES)
def test_every_link_to_a_heading_lands_on_one(page):
    here = REPO / page
    broken = [
        f"{target}#{anchor}"
        for target, anchor in LINK.findall(here.read_text())
        if (here.parent / target if target else here).suffix == ".md"
        and anchor not in anchors(here.parent / target if target else here)
    ]
    assert not broken, f"{page} links to headings that do not exist: {broken}"
