"""The study: a grid of training runs and the report that compares them.

    grid.py     the study file and its grid -> runs (name, overrides), validated up front
    runner.py   workers, one train.py --resume process per run, sweep.json, skip / resume, clean stop
    runs.py     run directories -> Run (config, summary, metrics) -> arms
    stats.py    per-arm numbers (best LR, LR sensitivity, max LR that trains, outcomes)
    figures.py  one figure per function
    report.py   report.md from the numbers

scripts/sweep.py and scripts/compare.py are its command lines.
"""
