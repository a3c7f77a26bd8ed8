"""study/readme.py (scripts/readme_results.py) writes the README's generated blocks from the
reports."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import TINY, write_corpus

from study.text import g, steps_of

REPO = Path(__file__).resolve().parent.parent

REPORT = """# Stability report: s

Wall time: 1.5 min from the first run's start to the last run's end. 4 runs in 2 arms \
(arms differ in: model.norm).

Outcomes, judged on the whole val curve: ...

| arm | best LR | v at best LR, per seed | max LR with all seeds ok |
|---|---|---|---|
| rmsnorm | 0.003 | 3.000, 3.100 | 0.01 |
| layernorm | 0.003 | 3.010, 3.090 | 0.01 |

## Paired comparisons

| A | B | differ in | lr | n | A - B |
|---|---|---|---|---|---|
| layernorm | rmsnorm | model.norm | 0.003 | 2 | +0.000 |

## What the numbers show

- layernorm - rmsnorm (differ in model.norm) at lr 0.003: +0.000 nats (95% CI -0.1..+0.1, \
n = 2 seeds): inconclusive.

## Figures
"""


def _run(readme, results=None):
    results = results or readme.parent / "results"  # never the repository's docs/results
    return subprocess.run(
        [
            sys.executable,
            "scripts/readme_results.py",
            "--readme",
            str(readme),
            "--results",
            str(results),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_report_is_one_line(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- claims: nope -->\n<!-- /claims -->\n")
    r = _run(readme)
    assert (
        r.returncode == 2
        and r.stderr.strip().startswith("error:")
        and len(r.stderr.strip().splitlines()) == 1
    )


def test_the_readme_results_are_what_the_script_writes(tmp_path):
    """The committed README holds exactly what the script generates from the committed reports."""
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    (tmp_path / "docs").symlink_to(REPO / "docs")
    assert _run(readme, tmp_path / "none").returncode == 0
    assert readme.read_text() == (REPO / "README.md").read_text()
    # docs/performance.md's benchmark tables are the committed benchmark outputs, as saved
    (tmp_path / "perf").mkdir()
    perf = tmp_path / "perf" / "performance.md"
    perf.write_text((REPO / "docs" / "performance.md").read_text())
    (tmp_path / "perf" / "results").symlink_to(REPO / "docs" / "results")
    assert _run(perf, tmp_path / "none").returncode == 0
    assert perf.read_text() == (REPO / "docs" / "performance.md").read_text()
    from study.readme import index

    assert (REPO / "docs" / "results" / "README.md").read_text() == index(REPO / "docs" / "results")


def test_results_index_has_one_line_per_study_with_its_claims(tmp_path):
    (tmp_path / "README.md").write_text("<!-- claims: results -->\n<!-- /claims -->\n")
    loss = {"n": 5, "mean": 0.1, "ci": [0.05, 0.15], "verdict": "different"}
    for name, claims in (("a", ["agrees", "cannot tell", "agrees"]), ("b", [])):
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "report.md").write_text(REPORT)
        (tmp_path / "results" / name / "study.yaml").write_text(
            f"name: {name}\nabout: does {name} matter\n"
        )
        (tmp_path / "results" / name / "report.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "about": f"does {name} matter",
                    "runs": 4,
                    "steps": 300,
                    "wall_min": 2.5,
                    "claims": [
                        {
                            "agreement": c,
                            "paper": "P",
                            "says": "S",
                            "metric": "best_loss",
                            "A": "x",
                            "B": "y",
                            "loss": loss,
                            "p": 0.01,
                            "p_holm": 0.03,
                        }
                        for c in claims
                    ],
                }
            )
        )
    assert _run(tmp_path / "README.md").returncode == 0
    lines = (tmp_path / "results" / "README.md").read_text().splitlines()
    # one short line per claim of the study file: its arm pairs' verdicts and numbers, grouped
    assert (
        lines[-3]
        == "- [a](a/report.md): does a matter (4 runs of 300 steps, 2.5 min; claims: 2 agrees, "
        "1 cannot tell)"
    )
    assert lines[-2] == (
        "  - S (P): x: **agrees**, +0.100 nats (+0.050..+0.150), n = 5, Holm p = 0.03; x: **cannot "
        "tell**, +0.100 nats (+0.050..+0.150), n = 5, Holm p = 0.03; x: **agrees**, +0.100 nats "
        "(+0.050..+0.150), n = 5, Holm p = 0.03"
    )
    assert lines[-1] == "- [b](b/report.md): does b matter (4 runs of 300 steps, 2.5 min)"
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- claims: results -->\nold\n<!-- /claims -->\n")
    assert _run(readme).returncode == 0
    assert readme.read_text().splitlines()[2] == lines[-2][2:]


def test_a_bench_block_is_the_saved_benchmark_output(tmp_path):
    (tmp_path / "bench.md").write_text(
        "`python scripts/bench_norms.py` on 2026-01-01\n\nMachine: X\n\n## Norms\n\n"
        "| a | b |\n|---|---|\n| 1 | 2 |\n"
    )
    page = tmp_path / "performance.md"
    page.write_text("# P\n\n## Norms\n\n<!-- bench: bench.md -->\nstale\n<!-- /bench -->\n")
    assert _run(page).returncode == 0
    assert page.read_text() == (
        "# P\n\n## Norms\n\n<!-- bench: bench.md -->\n`python scripts/bench_norms.py` on "
        "2026-01-01\n\nMachine: X\n\n### Norms\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
        "<!-- /bench -->\n"
    )


def test_a_trends_block_states_each_fitted_slope_with_its_ci_and_links_the_figure(tmp_path):
    """The slope and its CI come from the report.json's numbers (study/trend.py fitted them); a
    trend without a slope says why; the index lists the same lines under its study."""
    trend = {
        "what": "loss difference",
        "pair": "layernorm - rmsnorm at placement=post",
        "axis": "model.dim",
        "per_doubling": True,
        "points": [
            [64, 0.01, [-0.03, 0.05]],
            [128, 0.02, [-0.02, 0.06]],
            [256, 0.03, [-0.01, 0.07]],
        ],
        "slope": 0.01,
        "ci": [-0.025, 0.045],
        "used": 3,
    }
    open_ratio = {
        **trend,
        "what": "LR50 ratio",
        "pair": "layernorm / rmsnorm at placement=pre",
        "points": [[64, None, None], [128, 0.3, None]],
        "slope": None,
        "ci": None,
        "used": 0,
    }
    (tmp_path / "results" / "w").mkdir(parents=True)
    (tmp_path / "results" / "w" / "report.md").write_text(REPORT)
    (tmp_path / "results" / "w" / "report.json").write_text(
        json.dumps({"name": "w", "runs": 4, "trends": [trend, open_ratio]})
    )
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- trends: results -->\nold\n<!-- /trends -->\n")
    assert _run(readme).returncode == 0
    lines = readme.read_text().splitlines()[2:4]
    assert lines[0] == (
        "- **w** ([figure](results/w/trend.png)): loss difference layernorm - rmsnorm at "
        "placement=post, in nats, by model.dim: 64: +0.010 (-0.030..+0.050); 128: +0.020 "
        "(-0.020..+0.060); 256: +0.030 (-0.010..+0.070); slope +0.010 per doubling of model.dim "
        "(Knapp-Hartung 95% CI -0.025..+0.045, from 3 of 3 points; model.dim 64..256 only)"
    )
    assert lines[1].endswith(
        "64: -; 128: +0.300 ('-': no estimate: an arm's LR50 is only bounded); no slope (0 "
        "of 2 points have a two-sided CI)"
    )
    index = (tmp_path / "results" / "README.md").read_text()
    assert "  - trend: " + lines[0].split("): ", 1)[1] in index


def _claim(metric, a, b, agreement, expect="same", **numbers):
    c = {
        "paper": "P",
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
        c["lr50_ratio"] = {
            "ratio": numbers.get("ratio"),
            "ci": numbers.get("ci"),
            "bounds": numbers.get("bounds", [None, None]),
            "identified": numbers.get("ratio") is not None,
            "p": 0.01,
            "n": 40,
            "failed": 10,
        }
    else:
        c["loss"] = {
            "n": 12,
            "mean": numbers.get("mean", 0.01),
            "ci": [-0.01, 0.03],
            "verdict": "equivalent",
        }
    return c


def test_what_it_found_is_generated_from_the_default_studys_claims(tmp_path):
    """Constructed report.json files: the placement sentence states each norm's LR50 ratio (a bound
    where only a bound is identified); the norm sentence says per placement what its claims'
    verdicts say, in plain words; the count covers every report; the table has one row per question
    with its verdicts and numbers."""
    place_ln = _claim(
        "lr50", "layernorm/post", "layernorm/pre", "agrees", "lower", bounds=[None, 0.03]
    )
    place_rms = _claim(
        "lr50", "rmsnorm/post", "rmsnorm/pre", "agrees", "lower", ratio=0.01, ci=[0.002, 0.05]
    )
    place_rms["rules"] = {
        "lenient": {"ratio": 0.05, "identified": True, "bounds": [0.01, 0.1], "p": 1e-6},
        "instability alone": {
            "ratio": None,
            "penalised_ratio": 0.07,
            "identified": False,
            "bounds": [0.01, 0.1],
            "p": 1e-5,
        },
    }
    common_pre = _claim("common_loss", "rmsnorm/pre", "layernorm/pre", "disagrees", mean=0.05)
    common_pre.update(
        lrs=[0.001, 0.001],
        gaps=[["rmsnorm/pre", 0.001, 1.0, 0.0], ["layernorm/pre", 0.00316, 0.316, 0.54]],
    )
    default = {
        "name": "norm-placement-lr",
        "runs": 100,
        "claims": [
            place_ln,
            place_rms,
            _claim("lr50", "rmsnorm/post", "layernorm/post", "agrees", ratio=1.1, ci=[0.8, 1.5]),
            _claim("lr_sensitivity", "rmsnorm/post", "layernorm/post", "agrees"),
            _claim("common_loss", "rmsnorm/post", "layernorm/post", "agrees"),
            _claim("lr50", "rmsnorm/pre", "layernorm/pre", "cannot tell", bounds=[0.3, None]),
            _claim("lr_sensitivity", "rmsnorm/pre", "layernorm/pre", "agrees"),
            common_pre,
        ],
        "withdrawn": [{"paper": "W", "says": "X", "why": "Y"}],
    }
    other = {
        "name": "other",
        "runs": 10,
        "claims": [_claim("best_loss", "a", "b", "cannot tell", "higher")],
    }
    for name, r in (("norm-placement-lr", default), ("other", other)):
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "report.json").write_text(json.dumps(r))
    (tmp_path / "results" / "questions.yaml").write_text(
        "- {question: Q1?, study: norm-placement-lr, claims: {metric: lr50, expect: lower}}\n"
        "- {question: Q2?, study: other, claims: {metric: best_loss}}\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- found: results -->\nold\n<!-- /found -->\n")
    assert _run(readme).returncode == 0, _run(readme).stderr
    text = readme.read_text()
    # the ratio as the range over the rules that identify it, brackets where they do not; never a
    # penalised point
    assert (
        "**Placement decides stability.** Post-LN's LR50 is below Pre-LN's "
        "by more than 33x (brackets only) with LayerNorm and 20-100x (2 of 3 rules; 1 only "
        "brackets it) with "
        "RMSNorm (Holm p <= 0.04; ranges over the pre-registered failure rules)."
    ) in text
    assert (
        "14" not in text.split("**The norm")[0]
    )  # 1 / 0.07, the instability fit's penalised point
    norm = next(line for line in text.splitlines() if line.startswith("**The norm**"))
    assert norm == (
        "**The norm**: As stable as LayerNorm (LR50 within x2): agrees in post, cannot tell "
        "in pre (LR50 ratio post 1.1 (0.8..1.5), pre > 0.3 (brackets only), Holm p 0.04, 0.04). "
        "As good at an LR safe for both (within 0.02 nats): agrees in post, disagrees in pre "
        "(loss post +0.010 (-0.010..+0.030), pre +0.050 (-0.010..+0.030) nats, n = 12, Holm p "
        "0.04, 0.04; pre at x0.316 its best LR). RMSNorm is as sensitive to the LR (within 0.1 "
        "nats) in both placements (sensitivity post +0.010 (-0.010..+0.030), pre +0.010 "
        "(-0.010..+0.030) nats, n = 12, Holm p 0.04, 0.04)."
    )
    assert (
        "2 studies, 10 claims of the literature (6 agrees, 2 cannot tell, 1 disagrees, 1 withdrawn)"
        in text
    )
    assert (
        "trained for minutes on one corpus: what these" in text
    )  # no study.yaml: the default corpus
    (
        tmp_path / "results" / "other" / "study.yaml"
    ).write_text(  # the other study ran on a second corpus
        f"name: other\nabout: x\nconfig: {TINY}\noverrides: {{data: {{source: pystdlib}}}}\ngrid: "
        f"{{lr: [0.1]}}\n"
    )
    (tmp_path / "results" / "replication.md").write_text("x\n")
    assert _run(readme).returncode == 0, _run(readme).stderr
    assert "trained for minutes on 2 corpora (pydocs, pystdlib): what these" in readme.read_text()
    rows = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines() if "| Q" in line}
    # the placement claims' sub-tests are the block norm: each norm's column has its verdict and
    # ratio (a bracket where not identified), the effect column both with their CIs
    assert rows["| Q1?"][1:3] == ["agrees, ratio 0.01", "agrees, ratio < 0.03 (bracket)"]
    assert rows["| Q1?"][3].startswith("layernorm: LR50 ratio < 0.03 (brackets only), Holm p = ")
    assert rows["| Q1?"][4] == "layernorm: agrees; rmsnorm: agrees"
    assert rows["| Q2?"][3:] == [
        "+0.010 nats (-0.010..+0.030), n = 12, Holm p = 0.04",
        "cannot tell",
        "[other](results/other/report.md) |",
    ]


def test_a_common_lr_away_from_an_arms_best_is_stated_above_it_as_below_it():
    """The common-LR cell gives the common LR's distance from the arm's own best LR in both
    directions (a largest-safe common LR often sits above pre-norm's best), also when the report is
    read at its longest budget (the gaps' labels lose the budget with the claim's)."""
    from study.readme import _measured, at_longest

    claims = []
    for steps in (300, 3000):
        c = _claim(
            "common_loss", f"rmsnorm/pre/steps={steps}", f"layernorm/pre/steps={steps}", "agrees"
        )
        c.update(
            lrs=[0.1, 0.1],
            gaps=[
                [f"rmsnorm/pre/steps={steps}", 0.01, 10.0, 0.5],
                [f"layernorm/pre/steps={steps}", 0.1, 1.0, 0.0],
            ],
        )
        claims.append(c)
    report = at_longest({"claims": claims, "per_arm": {}, "arm_keys": ["train.steps"]})
    (c,) = report["claims"]
    assert c["gaps"][0][0] == "rmsnorm/pre"
    assert _measured(report, c, "rmsnorm/pre") == "lr 0.1 (x10 its best, +0.50 nats)"
    assert _measured(report, c, "layernorm/pre") == "lr 0.1 (its best)"


def _arm(lr50=None, ci=None, bounds=(None, None), sensitivity=None, penalised=None):
    return {
        "lr50": lr50,
        "ci": ci,
        "penalised_lr50": penalised or lr50,
        "bounds": list(bounds),
        "identified": lr50 is not None,
        "sensitivity": sensitivity,
    }


def test_the_norm_columns_hold_each_norms_own_numbers(tmp_path):
    """Constructed report.json files: a claim between the norms puts each arm's own LR50 (its
    bracket where not identified), sensitivity or loss LR in its norm's column; a claim within one
    block norm puts that norm's verdict and ratio there; a study that ran one norm fills that norm's
    column with both arms' numbers and leaves the other '—'."""
    sens = {"mean": 1.5, "ci": [1.4, 1.6], "n": 3}
    place = {
        "rmsnorm/post": _arm(0.01, [0.005, 0.02], sensitivity=sens),
        "rmsnorm/pre": _arm(bounds=(0.1, 0.3), penalised=0.177, sensitivity=sens),
        "layernorm/post": _arm(0.012, [0.006, 0.024], sensitivity=sens),
        "layernorm/pre": _arm(0.14, [0.07, 0.28], sensitivity=sens),
    }
    common = _claim("common_loss", "rmsnorm/pre", "layernorm/pre", "agrees", mean=0.001)
    common.update(lrs=[0.001, 0.001], gaps=[["rmsnorm/pre", 0.00316, 0.316, 0.56]])
    reports = {
        "norm-placement-lr": {
            "arm_keys": ["model.norm", "model.placement"],
            "per_arm": place,
            "claims": [
                _claim("lr50", "rmsnorm/post", "layernorm/post", "agrees", ratio=0.83, ci=[0.5, 1]),
                _claim("lr50", "rmsnorm/pre", "layernorm/pre", "cannot tell", bounds=[0.3, 3]),
                _claim("lr_sensitivity", "rmsnorm/post", "layernorm/post", "cannot tell"),
                common,
            ],
        },
        "att": {
            "arm_keys": ["model.norm", "model.dim", "model.qk_norm"],
            "per_arm": {},
            "claims": [
                _claim(
                    "lr50",
                    f"{n}/dim=32/qk_norm=layernorm",
                    f"{n}/dim=32/qk_norm=none",
                    agreement,
                    "higher",
                    **numbers,
                )
                for n, agreement, numbers in (
                    ("layernorm", "agrees", {"ratio": 4.0, "ci": [2.0, 8.0]}),
                    ("rmsnorm", "cannot tell", {"bounds": [1.0, 30.0]}),
                )
            ],
        },
        "one": {
            "arm_keys": ["model.placement"],
            "per_arm": {
                "deepnorm": _arm(0.006, [0.004, 0.009]),
                "post": _arm(bounds=(0.001, 0.003)),
            },
            "claims": [
                _claim("lr50", "deepnorm", "post", "agrees", "higher", ratio=2.0, ci=[1, 3])
            ],
        },
    }
    for name, r in reports.items():
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "report.json").write_text(
            json.dumps({"name": name, "runs": 4, **r})
        )
    (tmp_path / "results" / "one" / "study.yaml").write_text(  # the norm no arm field names
        f"name: one\nabout: x\nconfig: {TINY}\noverrides: {{model: {{norm: layernorm}}}}\n"
        "grid: {lr: [0.1]}\n"
    )
    (tmp_path / "results" / "questions.yaml").write_text(
        "- {question: Same LR50?, study: norm-placement-lr, claims: {metric: lr50}}\n"
        "- {question: Sensitivity?, study: norm-placement-lr, claims: {metric: lr_sensitivity}}\n"
        "- {question: Common loss?, study: norm-placement-lr, claims: {metric: common_loss}}\n"
        "- {question: qk-norm?, study: att, claims: {metric: lr50}}\n"
        "- {question: DeepNorm?, study: one, claims: {metric: lr50}}\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- found: results -->\nold\n<!-- /found -->\n")
    r = _run(readme)
    assert r.returncode == 0, r.stderr
    lines = readme.read_text().splitlines()
    assert "| question | RMSNorm | LayerNorm | effect and 95% CI | verdict | study |" in lines
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines if "?" in line[:20]}
    assert all(len(row) == 6 for row in rows.values())
    assert rows["Same LR50?"][1:3] == [
        "post: LR50 0.01 (0.005..0.02); pre: 0.1 < LR50 < 0.3",
        "post: LR50 0.012 (0.006..0.024); pre: LR50 0.14 (0.07..0.28)",
    ]
    assert "0.177" not in readme.read_text()  # the unidentified arm's penalised point
    assert rows["Same LR50?"][4] == "post: agrees; pre: cannot tell"
    assert rows["Sensitivity?"][1] == "sensitivity 1.50 nats (1.40..1.60)"
    assert rows["Common loss?"][1:3] == [
        "lr 0.001 (x0.316 its best, +0.56 nats)",
        "lr 0.001 (its best)",
    ]
    assert rows["qk-norm?"][1:3] == [
        "dim=32: cannot tell, ratio in 1..30 (bracket)",
        "dim=32: agrees, ratio 4",
    ]
    assert rows["DeepNorm?"][1:3] == [
        "—",
        "deepnorm: LR50 0.006 (0.004..0.009); post: 0.001 < LR50 < 0.003",
    ]


def test_a_bynorm_block_says_per_intervention_what_each_block_norm_got(tmp_path):
    """A constructed report.json (arms norm x dim x qk_norm): the claims tested under both block
    norms are grouped by what their arms differ in and where; a context where the norms' verdicts
    differ is spelled out per norm and counted; a claim between the norms themselves is not an
    intervention and is left out; only LR-sensitivity slopes with a CI are stated, with the widths
    measured."""
    keys = ["model.norm", "model.dim", "model.qk_norm"]
    claims = [
        _claim(
            "lr50",
            f"{n}/dim=32/qk_norm=layernorm",
            f"{n}/dim=32/qk_norm=none",
            "agrees",
            "higher",
            ratio=r,
            ci=[r / 2, r * 2],
        )
        for n, r in (("layernorm", 4.0), ("rmsnorm", 8.0))
    ]
    claims += [
        _claim(
            "lr_sensitivity",
            "layernorm/dim=32/qk_norm=layernorm",
            "layernorm/dim=32/qk_norm=none",
            "agrees",
            "lower",
            mean=-0.2,
        ),
        _claim(
            "lr_sensitivity",
            "rmsnorm/dim=32/qk_norm=layernorm",
            "rmsnorm/dim=32/qk_norm=none",
            "cannot tell",
            "lower",
            mean=-0.1,
        ),
        _claim("lr50", "rmsnorm/dim=32/qk_norm=none", "layernorm/dim=32/qk_norm=none", "agrees"),
    ]
    trend = {
        "what": "LR sensitivity",
        "pair": "norm=rmsnorm, qk_norm=none",
        "axis": "model.dim",
        "per_doubling": True,
        "points": [[32, 0.5, [0.4, 0.6]], [64, 0.6, [0.5, 0.7]], [96, 0.7, [0.6, 0.8]]],
        "slope": 0.12,
        "ci": [0.01, 0.23],
        "used": 3,
    }
    report = {
        "name": "att",
        "runs": 60,
        "arm_keys": keys,
        "claims": claims,
        "ratio_margin": 2.0,
        "trends": [trend, {**trend, "pair": "norm=layernorm, qk_norm=none", "ci": None}],
    }
    (tmp_path / "results" / "att").mkdir(parents=True)
    (tmp_path / "results" / "att" / "report.json").write_text(json.dumps(report))
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- bynorm: results/att -->\nold\n<!-- /bynorm -->\n")
    assert _run(readme).returncode == 0, _run(readme).stderr
    text = readme.read_text().splitlines()[2]
    assert text == (
        "[att](results/att/report.md) (P): RMSNorm and LayerNorm blocks got the same verdict in 1 "
        "of 2 tests asked "
        "of both (a different verdict is not a shown difference between the norms: no test here "
        "compares them): "
        "qk_norm=layernorm (vs none), a higher LR50: agrees at dim=32 (layernorm: LR50 ratio 4 "
        "(2..8), "
        "Holm p = 0.04; rmsnorm: LR50 ratio 8 (4..16), Holm p = 0.04); qk_norm=layernorm (vs "
        "none), a lower LR "
        "sensitivity: at dim=32, agrees under layernorm (-0.200 nats (-0.010..+0.030), n = 12, "
        "Holm p = 0.04), "
        "cannot tell under rmsnorm (-0.100 nats (-0.010..+0.030), n = 12, Holm p = 0.04); LR "
        "sensitivity per "
        "doubling of dim (32..96 only): norm=rmsnorm, qk_norm=none: +0.120 nats (+0.010..+0.230)."
    )
    # decided again with each arm's own L*: a verdict that moves is named with its new estimate and
    # Holm p
    claims[2]["own_l_star"] = {"agreement": "cannot tell", "estimate": -0.05, "p_holm": 0.3}
    claims[3]["own_l_star"] = {"agreement": "cannot tell", "estimate": -0.02, "p_holm": 0.5}
    (tmp_path / "results" / "att" / "report.json").write_text(json.dumps(report))
    assert _run(readme).returncode == 0, _run(readme).stderr
    assert (
        readme.read_text()
        .splitlines()[2]
        .endswith(
            "; with L* each arm's own best (Wortsman et al.'s definition) 1 of the 2 "
            "LR-sensitivity verdicts change "
            "(qk_norm=layernorm (vs none) at dim=32 under layernorm: agrees -> cannot tell (-0.050 "
            "nats, Holm p = "
            "0.3))."
        )
    )


def test_a_replication_block_puts_two_corpora_side_by_side_in_bits_per_byte(tmp_path, corpus_file):
    """Two constructed report.json files of one study on two corpora (two local text files): the
    common-LR loss difference is converted to bits per byte by each study's eval-set factor (tokens
    / bytes / ln 2, computed here by hand from the prepared data), and the sentence sorts the claims
    into both / one only."""
    import math

    from data.prepare import prepare
    from data.tokenizer import Tokenizer

    other = tmp_path / "other.txt"
    write_corpus(other, seed=7)
    claim = {
        "paper": "P",
        "says": "S",
        "A": "rmsnorm/post",
        "B": "layernorm/post",
        "p": 0.01,
        "p_holm": 0.02,
    }
    folders = []
    for name, corpus, agreement, mean in (
        ("a", corpus_file, "agrees", 0.01),
        ("b", other, "cannot tell", 0.05),
    ):
        f = tmp_path / "results" / name
        f.mkdir(parents=True)
        (f / "study.yaml").write_text(
            f"name: {name}\nconfig: {TINY}\noverrides: {{data: {{source: 'text:{corpus}', "
            f"vocab_size: 320, root: '{tmp_path / 'prepared'}'}}, train: {{seq_len: 16, "
            f"eval_tokens: 1024}}}}\ngrid: {{lr: [0.01]}}\n"
        )
        (f / "report.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "runs": 1,
                    "per_arm": {},
                    "claims": [
                        {
                            **claim,
                            "metric": "common_loss",
                            "expect": "same",
                            "agreement": agreement,
                            "lrs": [0.01, 0.01],
                            "loss": {
                                "n": 12,
                                "mean": mean,
                                "ci": [mean - 0.01, mean + 0.01],
                                "verdict": "x",
                            },
                        },
                        {
                            **claim,
                            "metric": "lr50",
                            "expect": "same",
                            "agreement": "agrees",
                            "says": "T",
                            "lr50_ratio": {
                                "ratio": 1.2,
                                "ci": [0.8, 1.6],
                                "identified": True,
                                "p": 0.01,
                                "n": 30,
                                "failed": 9,
                                "bounds": [None, None],
                            },
                        },
                    ],
                }
            )
        )
        folders.append(f)
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- replication: results/a,results/b -->\nold\n<!-- /replication -->\n")
    r = _run(readme)
    assert r.returncode == 0, r.stderr
    text = readme.read_text()
    prepared = prepare(f"text:{other}", vocab_size=320, root=tmp_path / "prepared", verbose=False)
    tokens = np.fromfile(prepared / "val.bin", dtype=np.uint16)
    n = min(1024 // 16, (len(tokens) - 1) // 16)
    targets = tokens[1 : n * 16 + 1].astype(np.int64)
    k = (
        len(targets)
        / int(Tokenizer(prepared / "tokenizer.model").token_bytes()[targets].sum())
        / math.log(2)
    )
    assert (
        f"**cannot tell**: {0.05 * k:+.4f} bpb ({0.04 * k:+.4f}..{0.06 * k:+.4f}), n = 12 at lr "
        "0.01" in text
    )
    assert text.splitlines()[2].startswith(
        "Holds on both corpora: rmsnorm/post vs layernorm/post (LR50: agrees). "
        "On one only: rmsnorm/post vs layernorm/post (loss at a common safe LR: "
        "agrees / cannot tell)."
    )


def test_the_readme_prints_no_lr50_the_committed_data_do_not_identify():
    """Every LR50 or ratio in the committed reports that is not identified (report.json `identified:
    false`) has a penalised point from Firth's fit; the README's generated "What it found" prints
    none of them, as an LR50, a ratio or its inverse, and gives such a claim as its brackets (a
    study asked at several budgets is read at its longest decided one: its claims there)."""
    from study.readme import at_longest

    readme = (REPO / "README.md").read_text()
    found = readme.split("<!-- found: docs/results -->")[1].split("<!-- /found -->")[0]
    unidentified = []
    for path in sorted((REPO / "docs" / "results").glob("*/report.json")):
        r = json.loads(path.read_text())
        for c in r.get("claims", []):
            fits = [c["lr50_ratio"], *c.get("rules", {}).values()] if "lr50_ratio" in c else []
            unidentified += [
                f["penalised_ratio"]
                for f in fits
                if not f["identified"] and f.get("penalised_ratio")
            ]
        for c in at_longest(r).get("claims", []):  # the claims the README's row reads
            if (
                "lr50_ratio" in c
                and not c["lr50_ratio"]["identified"]
                and f"| [{r['name']}]" in found
            ):
                row = next(
                    (
                        line
                        for line in found.splitlines()
                        if f"[{r['name']}](" in line and c["agreement"] in line
                    ),
                    "",
                )
                assert (
                    not row
                    or "LR50 ratio in " in row
                    or "(brackets only)" in row
                    or "LR50" not in row
                )
        running = r.get("running") or {}
        for label, a in r.get("per_arm", {}).items():
            if steps_of(label) is not None and any(float(b) == steps_of(label) for b in running):
                continue  # an arm of a budget still running: the README reads none of it
            if not a["identified"] and a.get("penalised_lr50"):
                unidentified.append(a["penalised_lr50"])
    assert (
        unidentified
    )  # the committed studies have separated arms: the check has something to find
    identified = set()  # what the README may print: a penalised point that reads the same is
    for path in sorted((REPO / "docs" / "results").glob("*/report.json")):  # not told apart
        r = json.loads(path.read_text())
        for c in r.get("claims", []):
            f = c.get("lr50_ratio") or {}
            if f.get("identified") and f.get("ratio"):
                identified |= {g(f["ratio"]), f"{1 / f['ratio']:.1f}"}
        identified |= {g(a["lr50"]) for a in r.get("per_arm", {}).values() if a.get("lr50")}
    for x in unidentified:
        if g(x) in identified or f"{1 / x:.1f}" in identified:
            continue
        for text in (f"ratio {g(x)} (", f"LR50 {g(x)} (", f" {1 / x:.1f}x", f"-{1 / x:.1f}x"):
            assert text not in found, (x, text)


def test_the_readme_answers_in_a_few_short_generated_sentences():
    """The generated "What it found" is short: <= 250 words outside its table, no sentence over 60
    words, the stability map shown, and every verdict cell of a multi-test row names its
    sub-test."""
    import re

    found = (
        (REPO / "README.md")
        .read_text()
        .split("<!-- found: docs/results -->")[1]
        .split("<!-- /found -->")[0]
    )
    prose = [
        line for line in found.splitlines() if line.strip() and not line.startswith(("|", "!["))
    ]
    assert len(" ".join(prose).split()) <= 250
    for sentence in re.split(r"(?<=[.;])\s+", " ".join(prose)):
        assert len(sentence.split()) <= 60, sentence
    assert "stability_map.png)" in found
    for row in [line for line in found.splitlines() if line.startswith("| ") and "---" not in line][
        1:
    ]:
        verdict = row.split(" | ")[4]
        assert ";" not in verdict or all(":" in part for part in verdict.split(";")), row


def test_a_default_study_with_budgets_is_read_at_its_longest_and_says_what_changes(tmp_path):
    """Constructed: the default study's claims at 300 and 3000 steps (arm labels carry the budget).
    The headline and the table read the 3000-step claims only, with labels without the budget; a
    sentence says which verdicts hold at every budget (with their Holm p at each) and which change,
    with the budgets in tokens per non-embedding parameter."""

    def at(steps, c):
        tail = f"/schedule_steps={steps}/steps={steps}"
        return {**c, "A": c["A"] + tail, "B": c["B"] + tail, "p_holm": 0.001 * steps}

    claims = []
    for steps, sens in ((300, "disagrees"), (3000, "agrees")):
        claims += [
            at(steps, _claim("lr50", "rmsnorm/post", "rmsnorm/pre", "agrees", "lower", ratio=0.1)),
            at(
                steps,
                _claim("lr50", "layernorm/post", "layernorm/pre", "agrees", "lower", ratio=0.2),
            ),
            at(steps, _claim("lr_sensitivity", "rmsnorm/pre", "layernorm/pre", sens)),
        ]
    report = {
        "name": "norm-placement-lr",
        "runs": 10,
        "claims": claims,
        "budgets": [
            {"steps": 300, "per_non_embedding": "6.2"},
            {"steps": 3000, "per_non_embedding": "62"},
        ],
    }
    (tmp_path / "results" / "norm-placement-lr").mkdir(parents=True)
    (tmp_path / "results" / "norm-placement-lr" / "report.json").write_text(json.dumps(report))
    (tmp_path / "results" / "questions.yaml").write_text(
        "- {question: Q1?, study: norm-placement-lr, claims: {metric: lr_sensitivity}}\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- found: results -->\nold\n<!-- /found -->\n")
    r = _run(readme)
    assert r.returncode == 0, r.stderr
    text = readme.read_text()
    assert "with RMSNorm" in text and "steps=" not in text.split("**By budget**")[0]
    assert "0.3" not in text.split("**By budget**")[0]  # no 300-step Holm p in the headline
    assert (
        "**By budget**: asked at 300 and 3000 steps (6.2 and 62 tokens per non-embedding "
        "parameter); the sentences above read the 3000-step runs. These change with the budget: LR "
        "sensitivity, rmsnorm/pre vs layernorm/pre (disagrees at 300, agrees at 3000); the other 2 "
        "hold at every budget."
    ) in text
    row = next(line for line in text.splitlines() if line.startswith("| Q1?"))
    assert "| agrees |" in row and "disagrees" not in row  # the 3000-step verdict alone


def test_a_budget_still_running_is_named_and_the_longest_finished_one_is_read():
    """An interim default study (its 3000-step stages still running): the sentence sets the
    finished budgets side by side and names the one still running; the headline reads 1000."""
    from study.readme import at_longest, budget_sentence

    def at(steps, agreement):
        tail = f"/schedule_steps={steps}/steps={steps}"
        c = _claim("lr50", "rmsnorm/post", "rmsnorm/pre", agreement, "lower", ratio=0.1)
        return {**c, "A": c["A"] + tail, "B": c["B"] + tail, "p_holm": 0.001 * steps}

    report = {
        "claims": [at(300, "agrees"), at(1000, "cannot tell"), at(3000, "running")],
        "budgets": [{"steps": s, "per_non_embedding": str(s)} for s in (300, 1000, 3000)],
        "running": {"3000": "adaptive"},
        "per_arm": {
            f"rmsnorm/{p}/schedule_steps={s}/steps={s}": s
            for p in ("pre", "post")
            for s in (300, 1000, 3000)
        },
    }
    got = at_longest(report)
    assert [c["agreement"] for c in got["claims"]] == ["cannot tell"]
    assert got["per_arm"] == {"rmsnorm/pre": 1000, "rmsnorm/post": 1000}
    sentence = budget_sentence(report)
    assert sentence.startswith(
        "**By budget**: asked at 300 and 1000 steps (300 and 1000 tokens per non-embedding "
        "parameter; 3000 still running); the sentences above read the 1000-step runs."
    )
    assert "running at" not in sentence and "agrees at 300" in sentence


def test_a_claim_asked_only_at_a_shorter_budget_is_read_there():
    """at_longest keeps each claim at the longest budget it was asked at (a study may carry only
    some of its arms to the longest budget, as the DyT study its scalar pair)."""
    from study.readme import at_longest

    def c(a, b, steps, agreement):
        tail = f"/schedule_steps={steps}/steps={steps}"
        return {**_claim("common_loss", a + tail, b + tail, agreement), "p_holm": steps / 1e4}

    report = {
        "claims": [
            c("dyt/sqrt_dim", "rmsnorm/sqrt_dim", 300, "disagrees"),
            c("dyt/sqrt_dim", "rmsnorm/sqrt_dim", 1200, "agrees"),
            c("dyt/none", "rmsnorm/none", 300, "cannot tell"),
        ],
        "per_arm": {
            "dyt/none/schedule_steps=300/steps=300": 1,
            "dyt/sqrt_dim/steps=1200": 2,
            "dyt/sqrt_dim/steps=300": 3,
        },
    }
    got = at_longest(report)
    assert [(x["A"], x["agreement"]) for x in got["claims"]] == [
        ("dyt/sqrt_dim", "agrees"),
        ("dyt/none", "cannot tell"),
    ]
    assert got["per_arm"] == {"dyt/none": 1, "dyt/sqrt_dim": 2}


def test_a_replication_of_two_designs_says_it_waits_for_one(tmp_path):
    """Two reports that ask no claim in common (one corpus rerun on a redesigned study, the other
    not yet): the block says so instead of setting unlike claims side by side."""
    from study.readme import replication

    for name, label in (("a", "rmsnorm/post/steps=300"), ("b", "rmsnorm/post")):
        f = tmp_path / name
        f.mkdir()
        (f / "study.yaml").write_text(f"name: {name}\nconfig: {TINY}\ngrid: {{lr: [0.01]}}\n")
        claim = _claim("lr50", label, label.replace("rmsnorm", "layernorm"), "agrees", ratio=1.0)
        (f / "report.json").write_text(json.dumps({"name": name, "claims": [claim]}))
    text = replication(f"{tmp_path / 'a'},{tmp_path / 'b'}")
    assert text.startswith("The reports ask no claim in common: a and b were run on different")
    assert "|" not in text


def test_a_replication_leaves_a_budget_still_running_out_of_its_lists(tmp_path):
    """One corpus has finished its 1000-step budget, the other not: that claim's row says running
    and it is in neither list; the 300-step claim both decided holds on both."""
    from study.readme import replication

    def at(steps, agreement):
        c = _claim("lr50", "rmsnorm/post", "layernorm/post", agreement, ratio=1.0, ci=[0.8, 1.2])
        return {**c, "A": f"{c['A']}/steps={steps}", "B": f"{c['B']}/steps={steps}"}

    for name, late, running in (("a", "cannot tell", {}), ("b", "running", {"1000": "adaptive"})):
        f = tmp_path / name
        f.mkdir()
        (f / "study.yaml").write_text(f"name: {name}\nconfig: {TINY}\ngrid: {{lr: [0.01]}}\n")
        report = {"name": name, "claims": [at(300, "agrees"), at(1000, late)], "per_arm": {}}
        (f / "report.json").write_text(json.dumps({**report, "running": running}))
    text = replication(f"{tmp_path / 'a'},{tmp_path / 'b'}")
    assert text.startswith(
        "Holds on both corpora: rmsnorm/post/steps=300 vs layernorm/post/steps=300 (LR50: "
        "agrees). On one only: none."
    )
    row = next(x for x in text.splitlines() if x.startswith("| rmsnorm/post/steps=1000"))
    assert row.endswith("| **cannot tell**: LR50 ratio 1 (0.8..1.2), Holm p = 0.04 | running |")


def test_an_ordering_verdict_says_under_how_many_failure_rules_it_holds():
    """A higher/lower LR50 verdict that only some of the study's failure rules support says how
    many (the controls' qk-norm and gating verdicts rest on runs too slow under the main rule, not
    on instability); one every rule supports, a `same` claim and a `cannot tell` say nothing."""
    from study.readme import _cell, rule_support

    def fit(p, ratio=None, bounds=(None, None)):
        return {"p": p, "ratio": ratio, "identified": ratio is not None, "bounds": list(bounds)}

    c = _claim("lr50", "gate/pre", "none/pre", "agrees", expect="higher", bounds=[1.0, 9.99])
    c["rules"] = {
        "best + 1 nat": fit(0.002, bounds=(1.0, 9.99)),  # orders them
        "lenient": fit(0.98, bounds=(None, 3.16)),  # no order
        "instability alone": fit(0.001, bounds=(None, 9.99)),  # p small, bracket straddles 1
    }
    assert rule_support(c) == " (2 of 4 failure rules)"
    assert _cell([c]) == "agrees (2 of 4 failure rules)"
    c["rules"]["lenient"] = fit(0.01, ratio=2.5)
    c["rules"]["instability alone"] = fit(0.03, bounds=(1.0, None))
    assert rule_support(c) == "" and _cell([c]) == "agrees"
    c["rules"]["lenient"] = fit(0.01, ratio=0.5)  # ordered the other way: not support
    assert rule_support(c) == " (3 of 4 failure rules)"
    # a disagrees on a `higher` claim is supported by rules that order A below B
    d = _claim("lr50", "hyb/pre", "none/pre", "disagrees", expect="higher", bounds=[0.01, 0.1])
    d["rules"] = {"lenient": fit(0.001, bounds=(0.01, 0.316)), "other": fit(0.2, ratio=0.3)}
    assert rule_support(d) == " (2 of 3 failure rules)"
    for other in (
        _claim("lr50", "a", "b", "agrees", expect="same", ratio=1.1, ci=[0.8, 1.4]),
        _claim("lr50", "a", "b", "cannot tell", expect="higher", bounds=[0.3, 3.0]),
        _claim("best_loss", "a", "b", "agrees", expect="lower"),
    ):
        other["rules"] = {"lenient": fit(0.9)}
        assert rule_support(other) == ""
