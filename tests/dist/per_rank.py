"""train.py with extra arguments for some ranks, under torchrun: PER_RANK='{"1": ["log.out_dir=X"]}'
gives rank 1 a run directory of its own (a node without the shared file system), as two machines
would differ."""

import json
import os
import runpy
import sys

sys.argv = [
    sys.argv[1],
    *sys.argv[2:],
    *json.loads(os.environ.get("PER_RANK", "{}")).get(os.environ["RANK"], []),
]
runpy.run_path(sys.argv[0], run_name="__main__")
