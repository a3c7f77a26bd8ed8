"""lab/readme.py writes the README's answer and the results index from the committed report.json
files: short, answer first, one number and its CI per cell, sentences that follow the verdicts."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.readme import at_longest, found, index, norm_sentence, placement_sentence, table
from lab.text import g

REPO = Path(__file__).resolve().parents[2]
KEYS = ["model.norm", "model.placement"]


def _run(readme: Path, results: Path):
    argv = [sys.executable, "-m", "lab.readme", "--readme", str(readme), "--results", str(results)]
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


@pytest.mark.slow
def test_the_committed_readme_and_index_are_what_the_script_writes(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    r = _run(readme, REPO / "lab" / "results")
    assert r.returncode == 0, r.stderr
    assert readme.read_text() == (REPO / "README.md").read_text()
    assert (REPO / "lab" / "results" / "README.md").read_text() == index(REPO / "lab" / "results")


def test_the_readme_answers_on_its_first_screen_and_briefly():
    """The answer within the first 25 lines; <= 1,000 words outside code; no line over 300
    characters; the table <= 6 rows, every cell <= 80 characters with one number and its CI."""
    text = (REPO / "README.md").read_text()
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("**RMSNorm"))
    assert first < 25
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    assert len(prose.split()) <= 1000
    assert max(len(line) for line in lines) <= 300
    block = text.split("<!-- found: lab/results -->")[1].split("<!-- /found -->")[0]
    rows = [line for line in block.splitlines() if line.startswith("|")][2:]
    assert 1 <= len(rows) <= 6
    for row in rows:
        for cell in row.strip("|").split("|")[1:]:
            assert len(cell.strip()) <= 80
            # one estimate and the two ends of its interval at most
            assert len(re.findall(r"[-+]?\d+\.?\d*(?:e-?\d+)?", cell)) <= 3, cell
    paragraphs = [p for p in block.split("\n\n") if p.strip().startswith("**")]
    # the norm, the placement, where the stream carries a mean (once centring is committed), the
    # settings
    assert len(paragraphs) == 3 + (REPO / "lab" / "results" / "centring" / "report.json").is_file()
    sentences = [x for p in paragraphs for x in re.split(r"(?<=\.)\s+(?=[A-Z*])", p)]
    assert max(len(x.split()) for x in sentences) <= 60


@pytest.mark.slow
def test_a_missing_report_is_one_line(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- found: results -->\n<!-- /found -->\n")
    (tmp_path / "results").mkdir()
    r = _run(readme, tmp_path / "results")
    assert r.returncode == 2 and r.stderr.startswith("error:") and r.stderr.count("\n") == 1


def test_the_norm_sentence_follows_the_verdicts():
    both = norm_sentence(_default())
    assert both.startswith("**RMSNorm is as stable as LayerNorm** (LR50 within x2)")
    assert "x1.00 (0.700-1.40) in post-norm" in both and "x1.10 (0.800-1.50) in pre-norm" in both
    assert "Holm p 0.04, 0.04" in both and "40 and 40 runs at 300 steps" in both
    mixed = norm_sentence(_default(pre="cannot tell"))
    assert mixed.startswith("**Is RMSNorm as stable as LayerNorm (LR50 within x2)?**")
    assert "post-norm: agrees, pre-norm: cannot tell" in mixed
    assert "as stable as LayerNorm**" not in mixed


def test_equal_lr50s_are_explained_only_by_the_runs_pairs():
    """Two equal LR50s read as a copy bug unless the report says why: every (LR, seed) pair had
    the same outcome under both norms. Said only when the pairs show it."""
    why = "had the same outcome under both norms (51 of 51"
    assert why in norm_sentence(_default(pairs={"n": 51, "same": 51}))
    assert "same outcome" not in norm_sentence(_default(pairs={"n": 51, "same": 49}))
    assert "same outcome" not in norm_sentence(_default(post_ratio=1.2, pairs={"n": 4, "same": 4}))


def test_the_placement_sentence_names_its_paper_as_the_verdicts_say():
    text = placement_sentence(_default())
    assert text.startswith("**Placement decides stability**: post-norm's LR50 is pre-norm's")
    assert "x0.130 (0.100-0.180) with LayerNorm" in text and "agrees with P et al." in text
    report = _default()
    report["claims"][2]["agreement"] = "cannot tell"
    text = placement_sentence(report)
    assert "Placement decides" not in text and "agrees with" not in text and "asking P" in text


def test_the_table_has_one_number_and_its_ci_per_cell():
    """LR50s where identified, brackets where not (never Firth's penalised point); a comparison
    stored LayerNorm first is turned into RMSNorm - LayerNorm."""
    report = _default()
    report["comparisons"] = [
        {
            "A": "layernorm/pre/steps=300",
            "B": "rmsnorm/pre/steps=300",
            "key": "model.norm",
            "loss": {"n": 4, "mean": 0.05, "ci": [0.01, 0.09]},
        }
    ]
    rows = {r.split(" | ")[0].strip("| "): r for r in table(report, None)[2:]}
    assert rows["LR50, LayerNorm"] == "| LR50, LayerNorm | 0.0400 (0.0300-0.0500) | in 0.1-0.316 |"
    assert "1.00 (0.700-1.40) | 1.10 (0.800-1.50)" in rows["LR50 ratio, RMSNorm / LayerNorm"]
    best = next(r for name, r in rows.items() if name.startswith("loss at each one's best LR"))
    assert "nats, 4 seeds" in best and "| -0.050 (-0.090..-0.010) |" in best
    assert "... on the stdlib source" not in rows  # no replication: no row of dashes


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


def test_the_readme_prints_no_lr50_its_data_do_not_identify():
    """Firth's penalised point of an arm whose LR50 is only bracketed is never printed."""
    text = found(REPO / "lab" / "results", "lab/results")
    default = at_longest(
        json.loads((REPO / "lab/results/norm-placement-lr/report.json").read_text())
    )
    shown = {g(a["lr50"]) for a in default["per_arm"].values() if a.get("lr50")}
    hidden = [
        a["penalised_lr50"]
        for a in default["per_arm"].values()
        if not a["identified"] and a.get("penalised_lr50")
    ]
    for x in hidden:
        assert g(x) in shown or f"{x:#.3g} (" not in text


def test_the_readme_names_the_confidence_of_intervals_widened_to_their_looks():
    from lab.readme import confidence

    plain = {"lr50_ratio": {"ratio": 1.0, "ci": [0.8, 1.2]}}
    widened = {"lr50_ratio": {"ratio": 1.0, "ci": [0.7, 1.4], "level": 1 - 0.05 / 6}}
    assert confidence([plain, {"loss": {}}]) == "95% CI"
    assert confidence([widened]).startswith("99.2% CI, 1 - 0.05 / looks")


def test_the_critical_lr_row_is_rmsnorm_over_layernorm_and_skips_the_control():
    """From report.json's `critical`: a pair stored LayerNorm first is inverted (ratio and CI), the
    zero-mean-writer pair (the control) and pairs that differ in another field are left out."""
    from lab.readme import critical_cells

    keys = ["model.norm", "model.placement", "model.zero_mean_writers"]
    row = {"key": "model.norm", "n": 60, "bound": 1.12}
    crit = {
        "arm_keys": keys,
        "critical": [
            row
            | {
                "a": "layernorm/post/zero_mean_writers=False",
                "b": "rmsnorm/post/zero_mean_writers=False",
                "ratio": 1.25,
                "ci": [1.0, 1.6],
            },
            row
            | {
                "a": "rmsnorm/pre/zero_mean_writers=False",
                "b": "layernorm/pre/zero_mean_writers=False",
                "ratio": 1.04,
                "ci": [0.95, 1.14],
            },
            row
            | {
                "a": "layernorm/pre/zero_mean_writers=True",
                "b": "rmsnorm/pre/zero_mean_writers=True",
                "ratio": 9.0,
                "ci": [8.0, 10.0],
            },
            row
            | {
                "a": "layernorm/pre/zero_mean_writers=False",
                "key": "model.zero_mean_writers",
                "b": "layernorm/pre/zero_mean_writers=True",
                "ratio": 9.0,
                "ci": [8.0, 10.0],
            },
        ],
    }
    name, cells = critical_cells(crit)
    assert name == "critical LR ratio, RMSNorm / LayerNorm (paired, 60 / 60 seeds)"
    assert cells == ["0.800 (0.625-1.00)", "1.04 (0.950-1.14)"]
    assert critical_cells({"arm_keys": keys}) is None
    rows = table(_default(), None, crit)[2:]
    assert rows[0].startswith("| critical LR ratio") and len(rows) <= 6
    assert not any(r.startswith("| LR50, ") for r in rows)


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


def test_the_critical_sentences_follow_the_pairs_and_their_controls():
    """The answer on paired critical LRs: RMSNorm / LayerNorm per placement (a pair stored the other
    way inverted), the verdicts at the margin, what the seeds rule out, both controls; the placement
    sentence as post / pre with the default study's paper where every pair differs below 1."""
    from lab.readme import critical_placement_sentence, critical_sentence

    control = _control()
    both = critical_sentence(_crit(), control)
    assert both.startswith(
        "**RMSNorm is as stable as LayerNorm** (per-seed critical LR within x1.1)"
    )
    assert "LayerNorm's x1.02 (0.926-1.08; agrees) in post-norm" in both
    assert "x1.04 (0.960-1.12; agrees) in pre-norm" in both
    assert "paired over 60 and 60 seeds" in both
    assert "zero-mean writers) x1.00 (0.952-1.05; agrees, 60 seeds)" in both
    assert "a known x1.3 LR change x1.24 (1.03-1.50; differs, 12 seeds)" in both
    mixed = critical_sentence(_crit(pre="inconclusive"), None)
    assert mixed.startswith(
        "**RMSNorm against LayerNorm, seed by seed** (critical LR, TOST at x1.1)"
    )
    assert "inconclusive) in pre-norm" in mixed and "known" not in mixed
    unearned = _crit()
    unearned["critical"][2] |= {"ratio": 0.9, "ci": [0.83, 0.99], "verdict": "differs"}
    failed = critical_sentence(unearned, control)  # the identical pair did not agree
    assert failed.startswith("**RMSNorm against LayerNorm, seed by seed**")
    assert "zero-mean writers) x1.11 (1.01-1.20; differs, 60 seeds)" in failed
    assert critical_sentence({"arm_keys": [], "critical": []}, control) == ""
    default = _default()
    place = critical_placement_sentence(_crit(), default)
    assert place.startswith(
        "**Placement decides stability**: post-norm's critical LR is pre-norm's"
    )
    assert (
        "x0.0500 (0.0400-0.0600) with LayerNorm and x0.0500 (0.0400-0.0625) with RMSNorm" in place
    )
    wrong = _crit()
    wrong["critical"][3] |= {"ratio": 1.5, "ci": [1.2, 1.9]}
    assert critical_placement_sentence(wrong, default).startswith("**Does post-norm fail below")
    words = [len(x.split()) for x in re.split(r"(?<=\.)\s+(?=[A-Z*])", both + " " + place)]
    assert max(words) <= 60


def test_the_replication_on_the_second_corpus_joins_the_answer_and_can_withhold_its_headline():
    """critical-lr-pystdlib's norm pairs: a sentence and a row beneath critical-lr's (in place of
    the LR50 replication's), and "as stable as" only where they agree too."""
    from lab.readme import critical_sentence

    control = _control()
    again = _crit(pre="inconclusive")
    for r in again["critical"]:
        r["n"] = 24
    both = critical_sentence(_crit(), control, again)
    assert both.startswith("**RMSNorm against LayerNorm, seed by seed**")  # not replicated
    assert both.endswith(
        "On the standard library's source: x1.02 (0.926-1.08; agrees) in post-norm and x1.04 "
        "(0.960-1.12; inconclusive) in pre-norm (24 and 24 seeds; its identical computations "
        "x1.00 (0.952-1.05; agrees))."
    )
    replicated = critical_sentence(_crit(), control, _crit())
    assert replicated.startswith("**RMSNorm is as stable as LayerNorm**")
    assert critical_sentence(_crit(), control).startswith("**RMSNorm is as stable as LayerNorm**")
    rows = table(_default(), None, _crit(), again)[2:]
    assert rows[0].startswith("| critical LR ratio, RMSNorm / LayerNorm (paired, 60 / 60 seeds)")
    assert rows[1] == (
        "| ... on the stdlib source (paired, 24 / 24 seeds) | 1.02 (0.926-1.08) "
        "| 1.04 (0.960-1.12) |"
    )
    assert rows[2].startswith("| LR50 ratio") and len(rows) <= 6
    assert not any(r.startswith("| ... on the stdlib source |") for r in rows)


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


def _centring_row(regime, ratio, ci, verdict, ends=None, n=24, loss=None):
    return {
        "regime": regime,
        "ratio": ratio,
        "ci": ci,
        "n": n,
        "verdict": verdict,
        "p_tost": 0.01,
        "p": 0.5,
        "energy_rmsnorm": [0.8, ends[0]] if ends else None,
        "energy_layernorm": [0.8, ends[1]] if ends else None,
        **({"loss": loss} if loss else {}),
    }


def _loss(mean, lo, hi, verdict):
    return {"mean": mean, "ci": [lo, hi], "n": 16, "verdict": verdict}


def test_the_centring_sentence_reads_each_regime_and_the_width_axis():
    """centring's report.json rows: one ratio and verdict per regime in words, the loss differences
    and where each norm's inputs end, the width axis where committed, the papers only where the
    verdicts say so; nothing without the study."""
    from lab.readme import centring_sentence

    study = REPO / "lab" / "studies" / "centring.yaml"  # pre-norm, d 32
    plain, bias, mean = (
        "init_embedding_mean=0.0, linear_bias=False",
        "init_embedding_mean=0.0, linear_bias=True",
        "init_embedding_mean=0.4525, linear_bias=False",
    )
    rows = [
        _centring_row(
            plain,
            0.98,
            [0.88, 1.09],
            "inconclusive",
            (0.031, 0.004),
            loss=_loss(-0.001, -0.017, 0.016, "equivalent"),
        ),
        _centring_row(
            mean,
            1.3,
            [1.15, 1.47],
            "differs",
            (0.62, 0.11),
            loss=_loss(0.19, 0.17, 0.21, "different"),
        ),
        _centring_row(
            bias,
            1.02,
            [0.99, 1.05],
            "agrees",
            (0.05, 0.006),
            loss=_loss(0.01, -0.013, 0.034, "inconclusive"),
        ),
    ]
    text = centring_sentence({"centring": rows}, study)
    assert text.startswith(
        "**Where the stream carries a mean** (pre-norm, 24 paired seeds): RMSNorm's critical LR "
        "over LayerNorm's is x0.980 (0.880-1.09; inconclusive) with no added mean, x1.30 "
        "(1.15-1.47; differs) with an embedding mean of 0.4525, x1.02 (0.990-1.05; agrees) with "
        "linear biases."
    )
    assert (
        "At each one's best LR RMSNorm's loss minus LayerNorm's is -0.001 (-0.017..+0.016; "
        "equivalent), +0.190 (+0.170..+0.210; different), +0.010 (-0.013..+0.034; inconclusive) "
        "nats in that order (16 seeds), its norm inputs ending with a mean-energy fraction of "
        "0.031, 0.62, 0.05 against LayerNorm's 0.004, 0.11, 0.006 (1/32 by chance)."
    ) in text.replace("\n", " ")
    # a critical LR that differs: the loss is named, stability is not said to be spared
    assert text.endswith(
        "Centring pays in loss where the stream carries a mean (an embedding mean of 0.4525), as "
        "Jiang et al. 2023's exact swap implies; without one it is dispensable, as Zhang & "
        "Sennrich 2019 found."
    )
    rows[1]["verdict"] = "inconclusive"
    assert "Centring pays in loss, not in the critical LR, where" in centring_sentence(
        {"centring": rows}, study
    )
    rows[0]["loss"] = _loss(0.03, 0.01, 0.05, "different")  # no mean and still apart: no papers
    assert "Centring pays" not in centring_sentence({"centring": rows}, study)
    del rows[2]["loss"]
    assert "RMSNorm's loss" not in centring_sentence({"centring": rows}, study)
    wide = [  # report.json's order (d 128 sorts first as text): read in order of width
        _centring_row("dim=128, n_heads=8, n_kv_heads=4", 1.5, [1.2, 1.8], "differs", n=20),
        _centring_row("dim=64, n_heads=4, n_kv_heads=2", 1.1, [0.9, 1.3], "inconclusive", n=20),
    ]
    both = centring_sentence({"centring": rows}, study, {"centring": wide})
    assert "(pre-norm, 20 / 24 paired seeds)" in both
    assert "With width (the width init): x1.10 (0.900-1.30; inconclusive) at d 64, x1.50" in both
    # the width axis with its losses and where the inputs end, against chance at each width
    rows[2]["loss"] = _loss(0.01, -0.013, 0.034, "inconclusive")
    wide = [
        _centring_row(
            "dim=64, n_heads=4, n_kv_heads=2",
            1.02,
            [0.95, 1.09],
            "agrees",
            (0.021, 0.0031),
            n=24,
            loss=_loss(0.002, -0.012, 0.016, "equivalent"),
        ),
        _centring_row(
            "dim=128, n_heads=8, n_kv_heads=4",
            0.97,
            [0.88, 1.07],
            "inconclusive",
            (0.012, 0.0016),
            n=24,
            loss=_loss(-0.004, -0.019, 0.011, "equivalent"),
        ),
    ]
    rows[0]["loss"] = _loss(-0.001, -0.017, 0.016, "equivalent")
    # the budget per width, in tokens per non-embedding parameter (the wider model has more)
    budgets = [
        {"steps": 300, "non_embedding_parameters": [n, n], "per_non_embedding": per}
        for n, per in ((738432, "0.42"), (197184, "1.6"))
    ]
    both = centring_sentence({"centring": rows}, study, {"centring": wide, "budgets": budgets})
    assert (
        "With width (the width init; 300 steps, 1.6 and 0.42 tokens per non-embedding parameter): "
        "x1.02 (0.950-1.09; agrees) at d 64, x0.970 (0.880-1.07; "
        "inconclusive) at d 128; loss differences +0.002 (-0.012..+0.016; equivalent), -0.004 "
        "(-0.019..+0.011; equivalent) nats (16 seeds); mean-energy fractions 0.021 / 0.0031, "
        "0.012 / 0.0016 (RMSNorm / LayerNorm; 1/64, 1/128 by chance)."
    ) in both
    assert both.endswith("as Zhang & Sennrich 2019 found.")
    # after the regimes' loss sentence, whose "in that order" names the regimes only
    assert both.index("in that order") < both.index("With width")
    assert max(len(x.split()) for x in re.split(r"(?<=\.)\s+(?=[A-Z*])", both)) <= 60
    # a width without an added mean whose loss or critical LR is apart: centring is not shown
    # dispensable, so the papers' clause goes
    wide[1]["loss"] = _loss(0.03, 0.01, 0.05, "different")
    assert "Centring pays" not in centring_sentence({"centring": rows}, study, {"centring": wide})
    wide[1]["loss"] = _loss(-0.004, -0.019, 0.011, "equivalent")
    wide[0]["verdict"] = "differs"
    assert "Centring pays" not in centring_sentence({"centring": rows}, study, {"centring": wide})
    del wide[0]["loss"]
    assert "Centring pays" not in centring_sentence({"centring": rows}, study, {"centring": wide})
    assert "nats (16 seeds); mean-energy" not in centring_sentence(
        {"centring": rows}, study, {"centring": wide}
    )
    assert centring_sentence(None, study) == "" and centring_sentence({"centring": []}, study) == ""
    words = [len(x.split()) for x in re.split(r"(?<=\.)\s+(?=[A-Z*])", text + " " + both)]
    assert max(words) <= 60
