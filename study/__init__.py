"""A study is a pipeline; its modules, stage by stage (tests/test_layout.py keeps this map true):

define    studyfile                                                 schema, claims, protocol
run       protocol, adaptive, runner, worker, cli                   stage runs; workers; commands
read      read, archive                                             run dirs, committed runs.json
analyse   arms, lr50, sensitivity, paired, claims, trend, result    LR50, sensitivity, claims
render    text, findings, figures, history, precursors, report, readme  sentences, plots, README
"""
