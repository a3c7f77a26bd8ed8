"""The machinery train.py drives: config, optimizer and schedule, metrics, monitor, logger,
checkpoints, distributed helpers. Plain functions and small classes."""
