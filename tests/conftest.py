import json
import os
import random

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")  # tests never reach the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

WORDS = ("the a norm layer model train loss grad step rate mean scale root square token batch stable "
         "spike learn weight decay warm cosine head block residual stream value key query attention "
         "of to and in is for with on by as it at from that this be are was").split()


def write_corpus(path, paragraphs: int = 300, seed: int = 0) -> str:
    """A deterministic pseudo-English corpus: blank-line separated paragraphs of random words."""
    rng = random.Random(seed)
    paras = []
    for _ in range(paragraphs):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "."
                 for _ in range(rng.randint(1, 4))]
        paras.append("\n".join(lines))
    text = "\n\n".join(paras) + "\n"
    path.write_text(text)
    return text


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    write_corpus(path)
    return path


@pytest.fixture(scope="session")
def prepared(corpus_file, tmp_path_factory):
    """A small prepared dataset (vocab 320) shared by the data, training and study tests."""
    from data.prepare import prepare

    return prepare(f"text:{corpus_file}", vocab_size=320, val_fraction=0.1,
                   root=tmp_path_factory.mktemp("prepared"), verbose=False)


@pytest.fixture
def data_args(prepared):
    """Overrides that point a run at the session's small prepared corpus (a cache hit)."""
    meta = json.loads((prepared / "meta.json").read_text())
    return [f"data.source={meta['source']}", f"data.root={prepared.parent}", "data.vocab_size=320",
            "data.val_fraction=0.1"]
