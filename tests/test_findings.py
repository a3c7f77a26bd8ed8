"""The README's findings are prose a person writes (issue 77): every number in them is checked here
against the report.json it comes from, and the first three sentences answer in a practitioner's
words (issue 76): each under 40 words, none in the instrument's terms, each with a number and its
interval."""

import json
import re
from pathlib import Path

import pytest
from scipy.stats import beta

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "lab" / "results"
README = (REPO / "README.md").read_text()
FOUND = README.split("## What it found")[1].split("\n## ")[0]
TEXT = " ".join(FOUND.split())  # line breaks as spaces


def report(name: str) -> dict:
    return json.loads((RESULTS / name / "report.json").read_text())


def pair(name: str, factor: float) -> dict:
    rows = report("lr-multiples")["multiples"]["pairs"]
    return next(p for p in rows if p["pair"] == name and p["factor"] == factor)


def outcome(norm: str, placement: str, factor: float, **arm) -> dict:
    want = {"model.norm": norm, "model.placement": placement, "model.zero_mean_writers": False,
            "model.norm_impl": "fused", "optim.lr_factor": 1.0, **arm}  # fmt: skip
    rows = report("lr-multiples")["multiples"]["outcomes"]
    return next(o for o in rows if o["arm"] == want and o["factor"] == factor)


def critical(name: str, a: str, b: str) -> tuple[float, float, float]:
    """RMSNorm over LayerNorm's paired critical LR (the report keeps a / b): ratio, CI."""
    row = next(r for r in report(name)["critical"] if r["a"] == a and r["b"] == b)
    lo, hi = row["ci"]
    return 1 / row["ratio"], 1 / hi, 1 / lo


def nats(p: dict) -> str:
    return f"{p['mean']:+.3f} ({p['ci'][0]:+.3f}..{p['ci'][1]:+.3f})"


def test_the_sentences_numbers_are_the_reports():
    z = "zero_mean_writers=False"
    post = critical("critical-lr", f"layernorm/post/{z}", f"rmsnorm/post/{z}")
    again = critical("critical-lr-pystdlib", f"layernorm/post/{z}", f"rmsnorm/post/{z}")
    assert f"x{post[0]:.2f}, 95% CI {post[1]:.2f}-{post[2]:.2f}" in TEXT
    assert f"second corpus x{again[0]:.2f}, {again[1]:.2f}-{again[2]:.2f}" in TEXT
    pre = pair("pre-norm: RMSNorm - LayerNorm", 1.0)
    assert pre["verdict"] == "different" and pre["mean"] < 0
    assert (
        f"lowers pre-norm's final loss by {-pre['mean']:.3f} nats "
        f"({-pre['ci'][1]:.3f}-{-pre['ci'][0]:.3f})" in TEXT
    )
    # all runs of both post-norm arms at 5.6x collapsed; the interval of that share
    cells = [outcome(n, "post", 5.6234) for n in ("rmsnorm", "layernorm")]
    n, bad = sum(c["n"] for c in cells), sum(c["unstable"] for c in cells)
    assert n == bad and {k for c in cells for k in c["kinds"]} == {"collapsed"}
    low = 100 * beta.ppf(0.025, n, 1)
    assert f"all {n} runs at 5.6x its best learning rate (95% CI {low:.0f}-100%)" in TEXT
    for norm in ("rmsnorm", "layernorm"):  # pre-norm never unstable up to 10x (lr-multiples)
        for f in (1.0, 3.1623, 5.6234, 10.0):
            assert outcome(norm, "pre", f)["unstable"] == 0
    edge = report("pre-edge-length")["multiples"]["outcomes"]  # ... and 17.8x, in 300 steps
    short = [o for o in edge if o["arm"]["train.steps"] == 300]
    calm = max(f for f in {o["factor"] for o in short} if not any(
        o["unstable"] for o in short if o["factor"] <= f))  # fmt: skip
    assert calm == 17.783 and "never becomes unstable up to 17.8x in 300 steps" in TEXT
    e = outcome("rmsnorm", "pre", 1.0)
    energy = e["mean_energy"]
    assert (
        f"holds {100 * energy['mean']:.1f}% of its inputs' energy "
        f"({100 * energy['ci'][0]:.1f}-{100 * energy['ci'][1]:.1f}%), "
        f"what random directions hold at this width ({100 * e['chance']:.1f}%)" in TEXT
    )


def test_the_tables_numbers_are_the_reports():
    rows = {
        line.split("|")[1].strip(): line for line in FOUND.splitlines() if line.startswith("| ")
    }
    table = rows["RMSNorm - LayerNorm at the best LR (nats)"]
    for name in ("pre-norm: RMSNorm - LayerNorm", "post-norm: RMSNorm - LayerNorm"):
        p = pair(name, 1.0)
        assert f"{nats(p)}, {'differs' if p['verdict'] == 'different' else 'equivalent'}" in table
    ident = rows["two identical computations at the best LR (nats)"]
    for name in (
        "pre-norm: identical (zero-mean writers)",
        "post-norm: identical (fused - reference)",
    ):
        p = pair(name, 1.0)
        assert p["verdict"].startswith("equivalent") and nats(p).replace(
            "+0.000 (", "-0.000 ("
        ) in (ident.replace("+0.000 (", "-0.000 ("))
    control = pair("control: Pre-LN at x1.3 LR - Pre-LN", 1.0)
    assert (
        control["verdict"] == "different"
        and nats(control) in rows["a known x1.3 LR change at the best LR (nats)"]
    )
    counts = rows["unstable runs at 5.6x / 10x the best LR"]
    for placement in ("pre", "post"):
        cells = [
            [outcome(n, placement, f) for n in ("rmsnorm", "layernorm")] for f in (5.6234, 10.0)
        ]
        shown = " / ".join(
            f"{sum(c['unstable'] for c in x)} of {sum(c['n'] for c in x)}" for x in cells
        )
        assert shown in counts
    spread = pair("pre-norm: RMSNorm - LayerNorm", 1.0)["spread"]
    assert spread["verdict"] == "more than identical"
    assert f"x{spread['ratio']:.2f}, {spread['ci'][0]:.2f}-{spread['ci'][1]:.2f}" in TEXT
    edges = json.loads((RESULTS / "speed-free.json").read_text())
    pre = next(r for r in edges if r["study"] == "critical-lr")["placements"]["pre"]
    assert f"{pre['new']['slow']} of its {pre['edge_runs']} edge runs were slow" in TEXT


# the instrument's words a practitioner would have to decode
JARGON = (
    "critical",
    "TOST",
    "zero-mean",
    "mean-energy",
    "writers",
    "LR50",
    "1/32",
    "unigram",
    "Holm",
)


def test_the_answer_is_three_short_sentences_in_a_practitioners_words():
    paragraphs = [p for p in FOUND.strip().split("\n\n")][:3]
    sentences = [
        s for p in paragraphs for s in re.split(r"(?<=[.])\s+(?=[A-Z])", " ".join(p.split()))
    ]
    assert len(sentences) == 3, sentences
    for s in sentences:
        assert len(s.split()) < 40, s
        assert not [w for w in JARGON if w.lower() in s.lower()], s
        assert re.search(r"\d.*\(\d|\(.*\d-\d", s), s  # a number and its interval


@pytest.mark.parametrize("word", ["RMSNorm", "LayerNorm", "post-norm", "pre-norm"])
def test_the_answer_names_what_it_compares(word):
    assert word in " ".join(FOUND.split("\n\n")[:3])


def test_the_edges_sentence_is_the_speed_free_rejudging():
    """Pre-norm's old edges were slow runs, post-norm's collapses; post-norm's LR50 ratio judged
    speed-free: the numbers of lab/results/speed-free.json."""
    (crit,) = [s for s in json.loads((RESULTS / "speed-free.json").read_text())
               if s["study"] == "critical-lr"]  # fmt: skip
    pre, post = crit["placements"]["pre"], crit["placements"]["post"]
    assert f"{pre['new']['slow']} of its {pre['edge_runs']} edge runs were slow" in TEXT
    assert f"collapses ({post['new']['collapsed']} of {post['edge_runs']})" in TEXT
    z = "zero_mean_writers=False"
    (r,) = [r for r in crit["ratios"] if r["a"] == f"rmsnorm/post/{z}"]
    free = r["speed-free"]
    assert free["identified"]
    lo, hi = free["ci"]
    assert f"LR50 over LayerNorm's is x{free['ratio']:.2f} ({lo:.2f}-{hi:.2f})" in TEXT


def test_the_spread_above_the_best_lr_is_the_reports():
    """Pre-norm's RMSNorm - LayerNorm at 3.2x and 5.6x: its sd against 1x's, undecided; at 10x
    its difference, neither different nor equivalent."""
    at = {f: pair("pre-norm: RMSNorm - LayerNorm", f) for f in (1.0, 3.1623, 5.6234, 10.0)}
    assert all(at[f]["verdict"] == "cannot tell" for f in (3.1623, 5.6234, 10.0))
    sds = f"sd {at[3.1623]['sd']:.2f} and {at[5.6234]['sd']:.2f} nats, against {at[1.0]['sd']:.2f}"
    assert sds in TEXT
    assert f"at 10x it is {nats(at[10.0])}" in TEXT


def test_where_pre_norm_becomes_unstable_is_the_reports():
    """pre-edge-length's numbers in the statistics: counts from report.json, the paired test from
    the committed runs judged by the study's rule, Fisher's test from the counts."""
    from scipy.stats import binomtest

    from lab.archive import archived_runs
    from lab.multiples import kind_of
    from lab.read import judge
    from lab.studyfile import load_study

    rows = report("pre-edge-length")["multiples"]["outcomes"]

    def cells(factor, steps=(300, 1000), norm=None):
        return [
            o
            for o in rows
            if o["factor"] == factor and o["arm"]["train.steps"] in steps
            and norm in (None, o["arm"]["model.norm"])
        ]  # fmt: skip

    calm = cells(10.0) + cells(17.783)
    n = sum(c["n"] for c in calm)
    assert sum(c["unstable"] for c in calm) == 0
    high = 100 * beta.ppf(0.975, 1, n)
    assert f"none of {n} runs was unstable in 300 or 1000 steps (95% CI 0-{high:.1f}%)" in TEXT
    study = RESULTS.parent / "studies" / "pre-edge-length.yaml"
    runs = judge(archived_runs(RESULTS / "pre-edge-length", study), load_study(study).rule)
    (unigram,) = {round(r.summary["unigram_entropy"], 2) for r in runs}
    finals = sorted(c["median_final"] for c in cells(10.0, (1000,)))
    assert (
        f"(median {finals[0]:.2f}-{finals[-1]:.2f} nats, word frequencies alone {unigram:.2f})"
        in TEXT
    )
    assert finals[-1] > unigram - 0.25  # not learned past them: within the study's learn margin
    short, long = (sum(c["unstable"] for c in cells(31.623, (s,))) for s in (300, 1000))
    assert f"{short} of 32 in 300 steps and {long} of 32 in 1000" in TEXT
    unstable = {}
    for r in runs:
        if r.config["optim.lr"] == 0.999:
            seed = (r.config["model.norm"], r.config["train.seed"])
            unstable.setdefault(seed, {})[r.config["train.steps"]] = kind_of(r) not in (
                "slow",
                "trained",
            )
    both = sum(v[300] and v[1000] for v in unstable.values())
    only_long = sum(v[1000] and not v[300] for v in unstable.values())
    only_short = sum(v[300] and not v[1000] for v in unstable.values())
    assert (only_long + both, only_short + both) == (long, short)  # the report's counts, paired
    p = binomtest(only_long, only_long + only_short, 0.5).pvalue  # McNemar's exact test
    assert f"{only_long} only in the longer run, {only_short} only in the shorter" in TEXT
    assert f"exact paired p = {p:.3f}, not decided" in TEXT and p >= 0.05
    rms, ln = (cells(31.623, (1000,), norm)[0]["unstable"] for norm in ("rmsnorm", "layernorm"))
    by_norm = {}  # the two norms on the same seeds, 1000 steps: paired too
    for r in runs:
        if r.config["optim.lr"] == 0.999 and r.config["train.steps"] == 1000:
            failed = kind_of(r) not in ("slow", "trained")
            by_norm.setdefault(r.config["train.seed"], {})[r.config["model.norm"]] = failed
    only_rms = sum(v["rmsnorm"] and not v["layernorm"] for v in by_norm.values())
    only_ln = sum(v["layernorm"] and not v["rmsnorm"] for v in by_norm.values())
    p = binomtest(only_rms, only_rms + only_ln, 0.5).pvalue
    assert (
        f"({rms} and {ln} of 16 in 1000 steps; on the same seeds {only_rms} only with RMSNorm, "
        in TEXT
    )
    assert f"{only_ln} only with LayerNorm: exact paired p = {p:.2f})" in TEXT and p >= 0.05
