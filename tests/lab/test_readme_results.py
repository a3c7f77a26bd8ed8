"""lab/readme.py writes the results index from the committed report.json files: per study a row per
claim, critical-LR pair and pair at a multiple of the best LR, read at the longest budget."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.readme import at_longest, index

REPO = Path(__file__).resolve().parents[2]
KEYS = ["model.norm", "model.placement"]


def _run(results: Path):
    argv = [sys.executable, "-m", "lab.readme", "--results", str(results)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def _claim(metric, a, b, agreement, expect="same", ratio=None, ci=None, bounds=(None, None), **kw):
    c = {
        "paper": "P et al.",
        "says": "S",
        "metric": metric,
        "expect": expect,
        "A": a,
        "B": b,
        "agreement": agreement,
        "p": 0.01,
        "p_holm": 0.04,
    }
    if metric == "lr50":
        identified = ratio is not None
        c["lr50_ratio"] = {
            "ratio": ratio,
            "ci": ci,
            "bounds": list(bounds),
            "identified": identified,
        }
        c["lr50_ratio"] |= {"p": 0.01, "n": 40, "failed": 10}
    else:
        c["loss"] = {"n": 12, "mean": kw.get("mean", 0.01), "ci": [-0.01, 0.03]}
    return c


def _arm(lr50=None, ci=None, bounds=(None, None)):
    return {"lr50": lr50, "ci": ci, "bounds": list(bounds), "identified": lr50 is not None}


def _default(post="agrees", pre="agrees", post_ratio=1.0, pairs=None):
    """A constructed default study report: both placements, both norms, at one budget."""
    same_post = _claim(
        "lr50", "rmsnorm/post", "layernorm/post", post, ratio=post_ratio, ci=[0.7, 1.4]
    )
    if pairs:
        same_post["outcome_pairs"] = pairs
    return {
        "arm_keys": KEYS,
        "ratio_margin": 2.0,
        "read_at": 300,
        "claims": [
            same_post,
            _claim("lr50", "rmsnorm/pre", "layernorm/pre", pre, ratio=1.1, ci=[0.8, 1.5]),
            _claim("lr50", "layernorm/post", "layernorm/pre", "agrees", "lower", 0.13, [0.1, 0.18]),
            _claim("lr50", "rmsnorm/post", "rmsnorm/pre", "agrees", "lower", 0.12, [0.1, 0.17]),
        ],
        "per_arm": {
            "layernorm/post": _arm(0.04, [0.03, 0.05]),
            "rmsnorm/post": _arm(0.04, [0.03, 0.05]),
            "layernorm/pre": _arm(None, bounds=(0.1, 0.316)),
            "rmsnorm/pre": _arm(0.3, [0.25, 0.37]),
        },
        "comparisons": [],
    }


def _crit(post: str = "agrees", pre: str = "agrees") -> dict:
    """A critical-lr report.json: norm pairs per placement, the zero-mean control, placements."""
    keys = ["model.norm", "model.placement", "model.zero_mean_writers"]

    def row(a, b, key, ratio, lo, hi, verdict, p=0.5):
        return {
            "a": a, "b": b, "key": key, "n": 60, "margin": 1.1, "ratio": ratio, "ci": [lo, hi],
            "verdict": verdict, "p_tost": 0.01, "p": p, "bound": hi / ratio * 1.01,
        }  # fmt: skip

    z = "zero_mean_writers"
    return {
        "arm_keys": keys,
        "critical": [
            row(f"layernorm/post/{z}=False", f"rmsnorm/post/{z}=False", "model.norm",
                1 / 1.02, 0.93, 1.08, post),
            row(f"rmsnorm/pre/{z}=False", f"layernorm/pre/{z}=False", "model.norm",
                1.04, 0.96, 1.12, pre),
            row(f"layernorm/pre/{z}=True", f"rmsnorm/pre/{z}=True", "model.norm",
                1.0, 0.95, 1.05, "agrees"),
            row(f"layernorm/post/{z}=False", f"layernorm/pre/{z}=False", "model.placement",
                0.05, 0.04, 0.06, "differs", 1e-20),
            row(f"rmsnorm/pre/{z}=False", f"rmsnorm/post/{z}=False", "model.placement",
                20.0, 16.0, 25.0, "differs", 1e-21),
        ],
    }  # fmt: skip


def _control() -> dict:
    """A critical-lr-control report.json: plain over a known x1.3 LR factor, `differs`."""
    return {
        "arm_keys": ["optim.lr_factor"],
        "critical": [
            {
                "a": "lr_factor=1.0", "b": "lr_factor=1.3", "key": "optim.lr_factor", "n": 12,
                "margin": 1.1, "ratio": 1.244, "ci": [1.031, 1.501], "verdict": "differs",
                "known": 1.3, "p_tost": 0.9, "p": 0.027, "bound": 1.45,
            }
        ],
    }  # fmt: skip


@pytest.mark.slow
def test_the_committed_index_is_what_the_script_writes(tmp_path):
    import shutil

    results = tmp_path / "results"
    shutil.copytree(REPO / "lab" / "results", results)
    r = _run(results)
    assert r.returncode == 0, r.stderr
    assert (results / "README.md").read_text() == (
        REPO / "lab" / "results" / "README.md"
    ).read_text()


def test_a_study_with_budgets_is_read_at_its_longest_finished_one():
    def at(steps, agreement):
        tail = f"/schedule_steps={steps}/steps={steps}"
        return _claim("lr50", f"rmsnorm/post{tail}", f"rmsnorm/pre{tail}", agreement, "lower", 0.1)

    report = {
        "arm_keys": [*KEYS, "optim.schedule_steps", "train.steps"],
        "claims": [at(300, "agrees"), at(1000, "cannot tell"), at(3000, "running")],
        "running": {"3000": "adaptive"},
        "per_arm": {
            f"rmsnorm/{p}/schedule_steps={s}/steps={s}": s
            for p in ("pre", "post")
            for s in (300, 1000, 3000)
        },
    }
    got = at_longest(report)
    assert [c["agreement"] for c in got["claims"]] == ["cannot tell"] and got["read_at"] == 1000
    assert got["per_arm"] == {"rmsnorm/pre": 1000, "rmsnorm/post": 1000}
    assert got["arm_keys"] == KEYS


def test_a_claim_asked_only_at_a_shorter_budget_is_read_there():
    def c(a, b, steps, agreement):
        tail = f"/schedule_steps={steps}/steps={steps}"
        return _claim("common_loss", a + tail, b + tail, agreement)

    report = {
        "arm_keys": ["model.norm", "model.embed_scale", "optim.schedule_steps", "train.steps"],
        "claims": [
            c("dyt/sqrt_dim", "rmsnorm/sqrt_dim", 300, "disagrees"),
            c("dyt/sqrt_dim", "rmsnorm/sqrt_dim", 1200, "agrees"),
            c("dyt/none", "rmsnorm/none", 300, "cannot tell"),
        ],
        "per_arm": {},
    }
    got = at_longest(report)
    assert [(x["A"], x["agreement"]) for x in got["claims"]] == [
        ("dyt/sqrt_dim", "agrees"),
        ("dyt/none", "cannot tell"),
    ]


def test_the_index_has_a_row_per_claim_with_its_n_ci_and_holm_p(tmp_path):
    for name, claims in (("a", ["agrees", "cannot tell"]), ("b", [])):
        (tmp_path / name).mkdir()
        report = {
            "name": name,
            "about": f"Does {name} matter?",
            "runs": 8,
            "arm_keys": KEYS,
            "claims": [
                _claim("best_loss", "rmsnorm/pre", "layernorm/pre", v, mean=0.02) for v in claims
            ],
            "withdrawn": [{"paper": "Q", "says": "T", "why": "not testable here"}],
        }
        (tmp_path / name / "report.json").write_text(json.dumps(report))
    text = index(tmp_path)
    assert text.count("\n## [") == 2 and "Does a matter? (8 runs)" in text
    row = "| S (P et al.) | rmsnorm vs layernorm (pre) | **agrees** | +0.020 (-0.010..+0.030) nats "
    assert row + "| 12 seeds | 0.04 |" in text
    assert text.count("withdrawn: T (Q): not testable here") == 2


def test_the_index_says_when_a_result_is_an_earlier_form_of_its_study(tmp_path):
    """A committed study.yaml copy that is not the study file's text: results of an earlier form
    (a pilot, a redesign still running), said so beside the study's size."""
    results, studies = tmp_path / "results", tmp_path / "studies"
    for name, now in (("same", "a: 1\n"), ("redesigned", "a: 2\n")):
        (results / name).mkdir(parents=True)
        (results / name / "report.json").write_text(
            json.dumps({"name": name, "about": f"{name}?", "runs": 8, "arm_keys": KEYS})
        )
        (results / name / "study.yaml").write_text("a: 1\n")
        studies.mkdir(exist_ok=True)
        (studies / f"{name}.yaml").write_text(now)
    text = index(results)
    assert "redesigned? (8 runs; an earlier form of studies/redesigned.yaml" in text
    assert "same? (8 runs)" in text


def test_the_index_lists_each_paired_critical_lr_finding():
    """A study without claims but with paired critical LRs shows them in the index: one row per
    pair as stored (a / b), its verdict, ratio and CI, seeds and both p; undecided pairs not."""
    from lab.readme import critical_rows

    report = _crit(pre="inconclusive")
    report["critical"].append({"a": "x", "b": "y", "key": "model.norm", "error": "no seeds"})
    rows = critical_rows(report)
    table_rows = [r for r in rows if r.startswith("| ") and not r.startswith("| pair")]
    assert len(table_rows) == 5 and "TOST at x1.1" in rows[1]
    assert table_rows[1] == (
        "| rmsnorm/pre/zero_mean_writers=False / layernorm/pre/zero_mean_writers=False | norm | "
        "**inconclusive** | 1.04 (0.960-1.12) | 60 | 0.01 / 0.5 |"
    )
    assert critical_rows({"critical": []}) == [] and critical_rows({}) == []
    known = _control()["critical"][0] | {"ratio": 1.3, "ci": [1.13, 1.49], "p_tost": 0.99}
    assert (
        "| lr_factor; known x1.3 | **differs** | 1.30 (1.13-1.49) | 12 |"
        in critical_rows({"critical": [known]})[-1]
    )


def test_a_claim_decided_again_shows_which_verdict_stands(tmp_path):
    """decided-again.yaml names an older claim a later study decides again: before the later
    report the older verdict is marked not to be relied on; after it, both studies show both
    verdicts and the later one stands."""
    import yaml

    def study(name, agreement, mean):
        (tmp_path / name).mkdir()
        c = _claim("best_loss", "hybrid", "pre", agreement, expect="lower", mean=mean)
        r = {"name": name, "about": f"{name}?", "runs": 8, "arm_keys": ["model.placement"]}
        (tmp_path / name / "report.json").write_text(json.dumps(r | {"claims": [c]}))

    study("old", "agrees", -0.02)
    entry = {"old": "old", "new": "new", "says": "S", "why": "a seed was left out"}
    (tmp_path / "decided-again.yaml").write_text(yaml.safe_dump([entry]))
    text = index(tmp_path)
    assert "- 'S' is being decided again in new (a seed was left out)" in text
    assert "not to be relied on" in text
    study("new", "cannot tell", 0.001)
    text = index(tmp_path)
    new_part, old_part = text.split("## [old]")  # sorted by name: new first
    assert "was decided again in [new](new/report.md)" in old_part
    assert (
        "**cannot tell**, +0.001 (-0.010..+0.030) nats, 12 seeds. That verdict stands" in old_part
    )
    assert "decides again [old](old/report.md)'s claim, which said **agrees**" in new_part
    (tmp_path / "decided-again.yaml").write_text(yaml.safe_dump([entry | {"says": "T"}]))
    r = _run(tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "decided-again.yaml: new reports no claim 'T'" in r.stderr


def test_the_committed_decided_again_entries_name_real_claims():
    """Every committed entry names an older study's reported claim and a later study file that
    asks the same claim in the same words."""
    import yaml

    results = REPO / "lab" / "results"
    entries = yaml.safe_load((results / "decided-again.yaml").read_text())
    assert len(entries) == 4
    for e in entries:
        old = json.loads((results / e["old"] / "report.json").read_text())
        assert e["says"] in [c["says"] for c in old["claims"]]
        new = yaml.safe_load((REPO / "lab" / "studies" / f"{e['new']}.yaml").read_text())
        assert e["says"] in [c["says"] for c in new["claims"]]


def test_a_multiples_study_without_pairs_lists_its_runs_by_kind():
    from lab.readme import multiples_rows

    def outcome(factor, kinds):
        n = sum(kinds.values())
        arm = {"model.norm": "rmsnorm", "train.steps": 300}
        return {"arm": arm, "factor": factor, "lr": 0.0316 * factor, "n": n, "kinds": kinds,
                "unstable": n - kinds.get("slow", 0) - kinds.get("trained", 0),
                "median_final": 5.8}  # fmt: skip

    report = {"multiples": {"pairs": [], "outcomes": [
        outcome(10.0, {"slow": 16}), outcome(31.623, {"blew up": 4, "collapsed": 1, "slow": 11})
    ]}}  # fmt: skip
    rows = [r for r in multiples_rows(report) if r.startswith("| norm=")]
    assert rows == [
        "| norm=rmsnorm, steps=300 | 10 | 0.316 | 16 | 0 | 16 | 0 | 5.800 |",
        "| norm=rmsnorm, steps=300 | 31.623 | 0.999 | 16 | 4 blew up, 1 collapsed | 11 | 0 "
        "| 5.800 |",
    ]
    assert multiples_rows({}) == [] and multiples_rows({"multiples": {"pairs": []}}) == []
