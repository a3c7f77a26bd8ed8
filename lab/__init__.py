"""The lab, a study as a pipeline; its modules by stage (tests/test_layout.py keeps this map true):

define    studyfile, design                                         schema, claims, its design
run       protocol, adaptive, runner, worker, submit, sweep, pack   stages, workers, the command
read      read, archive, history                                    run dirs, runs.json, git
analyse   arms, lr50, critical, centring, sensitivity, paired, multiples, claims, trend, result
render    text, findings, figures, precursors, record, report, compare, redecide, readme
"""
