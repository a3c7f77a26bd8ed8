"""Write the README's Results blocks from the committed study reports, never by hand.

    python scripts/readme_results.py            # README.md in place

Each block sits between `<!-- results: PATH/report.md -->` and `<!-- /results -->`; it is replaced by the
report's opening line (runs, wall time), its per-arm table, a link to the stability map and every sentence of
its "What the numbers show" section, as the report states them (n, CI and verdict included).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- results: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


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


def update(readme: Path) -> int:
    text = readme.read_text()
    blocks = list(BLOCK.finditer(text))
    if not blocks:
        raise ValueError(f"{readme} has no <!-- results: PATH --> ... <!-- /results --> block")
    for m in reversed(blocks):
        path = (readme.parent / m.group("path")).resolve()
        if not path.is_file():
            raise ValueError(f"{readme}: the results block names {m.group('path')}, which does not exist")
        text = text[: m.start("body")] + block(path) + text[m.end("body"):]
    readme.write_text(text)
    return len(blocks)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--readme", type=Path, default=REPO / "README.md")
    a = p.parse_args(argv)
    try:
        n = update(a.readme)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{a.readme}: {n} results block(s) written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
