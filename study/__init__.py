"""A study is a pipeline; its modules, stage by stage (tests/test_layout.py keeps this map true):

define   studyfile                                          the study file: schema, claims, protocol
run      protocol, runner, worker, cli                      each stage's runs; workers; the commands
read     read, archive                                      run directories, or a study's runs.json
analyse  arms, lr50, sensitivity, paired, claims, trend, result   LR50, sensitivity, claims, trends
render   text, findings, figures, history, report, readme   numbers, sentences, plots, reports
"""
