"""Write the README's Results blocks and the index of docs/results from the committed study reports, never by hand.

Each block sits between `<!-- results: PATH/report.md -->` and `<!-- /results -->`; it is replaced by the
report's opening line (runs, wall time), its per-arm table, a link to the stability map and every sentence of
its "What the numbers show" section, as the report states them (n, CI and verdict included). A block between
`<!-- claims: FOLDER -->` and `<!-- /claims -->` gets one line per claim of every report.json under FOLDER:
the paper, the claim, agrees / disagrees / cannot tell, and the paired difference, CI and n behind it. A block
between `<!-- headline: PATH/report.md -->` and `<!-- /headline -->` gets the README's headline: the report's
comparisons of arms that differ in the norm alone, and each arm's largest LR at which every seed trained. A block
between `<!-- bench: PATH.md -->` and `<!-- /bench -->` (docs/performance.md) gets a benchmark's saved output
(`--save PATH.md`: the command, the machine and its tables) as it was measured.

    python scripts/readme_results.py            # README.md, docs/performance.md, docs/results/README.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- (?P<kind>results|claims|headline|bench): (?P<path>\S+) -->\n)(?P<body>.*?)"
                   r"(<!-- /(?P=kind) -->)", re.S)


def section(report: str, title: str) -> list[str]:
    """The lines of a `## title` section of a report (without the heading)."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", report, re.S | re.M)
    return [line for line in (m.group(1).strip().splitlines() if m else [])]


def block(report_path: Path) -> str:
    """The README text for one report."""
    report = report_path.read_text()
    lines = report.splitlines()
    opening = next((line for line in lines[1:] if line.strip()), "")
    start = next(i for i, line in enumerate(lines) if line.startswith("| arm |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rel = report_path.relative_to(REPO) if report_path.is_relative_to(REPO) else report_path
    return "\n".join([opening, "", *lines[start:end], "", f"![stability map]({rel.parent / 'stability_map.png'})", "",
                      f"What the numbers show (generated from [the report]({rel})):", "",
                      *section(report, "What the numbers show"), ""])


# a paired comparison sentence of a report's "What the numbers show" section
COMPARISON = re.compile(r"^- (?P<a>\S+) - (?P<b>\S+) \(differ in (?P<keys>[^)]*)\) at lr (?P<lr>\S+): "
                        r"(?P<mean>[-+]\d\.\d+) nats \(95% CI (?P<ci>\S+), n = (?P<n>\d+) seeds\): "
                        r"(?P<verdict>[^;]*); minimum detectable difference at 80% power (?P<mde>\S+)\.$")


def table(report: str) -> list[dict]:
    """The report's per-arm table (the one whose header starts `| arm |`) as one dict per row, keyed by column."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| arm |"))
    rows = [line for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start:])]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True)) for row in rows[2:]]


def headline(report_path: Path, page_dir: Path = REPO) -> str:
    """The README's top finding, generated from the report: per placement, the loss difference between the norms
    (paired by seed, with CI, n and verdict), then the largest LR at which each arm's seeds all trained."""
    report = report_path.read_text()
    norm_pairs = [m for m in map(COMPARISON.match, section(report, "What the numbers show"))
                  if m and m["keys"] == "model.norm"]
    if not norm_pairs:
        raise ValueError(f"{report_path} compares no arms that differ in the norm alone")
    lines = []
    for m in norm_pairs:
        placement = m["a"].split("/", 1)[1] + "-norm" if "/" in m["a"] else "Final val loss"
        verdict = m["verdict"].strip()
        if verdict.startswith("inconclusive"):
            verdict += f"; the smallest difference {m['n']} seeds could detect is {m['mde']} nats"
        lines.append(f"- **{placement}**: {m['a'].split('/')[0]} - {m['b'].split('/')[0]} = {m['mean']} nats of "
                     f"final val loss at lr {m['lr']} (the pair's best), 95% CI {m['ci']}, n = {m['n']} paired "
                     f"seeds: {verdict}.")
    edge = ", ".join(f"{r['arm']} {r['max LR with all seeds ok']}" for r in table(report))
    grid = re.search(r"learning rates ([\d., e-]+);", report)
    top = f" (the grid's largest: {grid.group(1).split(', ')[-1]})" if grid else ""
    lines.append(f"- **Largest learning rate at which every seed trained**: {edge}{top}.")
    rel = Path(os.path.relpath(report_path, page_dir))  # links work from the page the block is in
    return "\n".join([*lines, "", f"![stability map]({rel.parent / 'stability_map.png'})", ""])


def bench(path: Path) -> str:
    """A saved benchmark output, its headings demoted below the page's own."""
    return re.sub(r"^(#+) ", r"#\1 ", path.read_text(), flags=re.M).rstrip("\n") + "\n"


def claim_line(study: str, c: dict) -> str:
    """One claim's result as the report decided it: paper, claim, verdict, with its difference, CI and n."""
    ci = f", 95% CI {c['ci'][0]:+.3f}..{c['ci'][1]:+.3f}" if c.get("ci") else ""
    diff = f" ({c['A']} - {c['B']} = {c['mean']:+.3f}{ci}, n = {c['n']}, {c['verdict']})" \
        if c.get("mean") is not None else ""
    return f"**{study}**, {c['paper']}: {c['says']} ({c['metric']}): **{c['agreement']}**{diff}"


def claims(results: Path) -> str:
    """Every study's claims, one line each (the body of a `<!-- claims: FOLDER -->` block)."""
    lines = [f"- {claim_line(path.parent.name, c)}" for path in sorted(results.glob("*/report.json"))
             for c in json.loads(path.read_text()).get("claims", [])]
    return "\n".join(lines) + "\n"


def index(results: Path) -> str:
    """docs/results/README.md: one line per study (a folder with report.json): what it asks, its size and wall
    time, and how its claims came out."""
    lines = ["# Results", "", "Every committed study, one line each (generated by scripts/readme_results.py from "
             "each folder's report.json; the report.md beside it has the numbers, figures and every run).", ""]
    for path in sorted(results.glob("*/report.json")):
        r = json.loads(path.read_text())
        counts = {}
        for c in r.get("claims", []):
            counts[c["agreement"]] = counts.get(c["agreement"], 0) + 1
        claims = ("; claims: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))) if counts else ""
        size = f"{r['runs']} runs" + (f" of {r['steps']} steps" if r.get("steps") else "") \
            + (f", {r['wall_min']} min" if r.get("wall_min") else "")
        lines.append(f"- [{path.parent.name}]({path.parent.name}/report.md): {r.get('about') or r['name']} "
                     f"({size}{claims})")
        lines += [f"  - {claim_line(path.parent.name, c)}" for c in r.get("claims", [])]
    return "\n".join(lines) + "\n"


def update(readme: Path) -> int:
    text = readme.read_text()
    blocks = list(BLOCK.finditer(text))
    if not blocks:
        raise ValueError(f"{readme} has no generated block (<!-- results|claims|headline|bench: PATH --> ... "
                         f"<!-- /KIND -->)")
    for m in reversed(blocks):
        path = Path(os.path.abspath(readme.parent / m.group("path")))  # not resolved: links stay page-relative
        if not path.exists():
            raise ValueError(f"{readme}: the {m.group('kind')} block names {m.group('path')}, which does not exist")
        kind = m.group("kind")
        body = headline(path, Path(os.path.abspath(readme.parent))) if kind == "headline" else \
            {"results": block, "claims": claims, "bench": bench}[kind](path)
        text = text[: m.start("body")] + body + text[m.end("body"):]
    readme.write_text(text)
    return len(blocks)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--readme", type=Path, nargs="+", default=[REPO / "README.md", REPO / "docs" / "performance.md"],
                   help="the pages whose generated blocks to rewrite")
    p.add_argument("--results", type=Path, default=REPO / "docs" / "results", help="folder of the study reports")
    a = p.parse_args(argv)
    for page in a.readme:
        try:
            n = update(page)
        except (ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{page}: {n} generated block(s) written")
    if a.results.is_dir():
        (a.results / "README.md").write_text(index(a.results))
        print(f"{a.results / 'README.md'}: index written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
