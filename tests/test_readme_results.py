"""scripts/readme_results.py writes the README's Results blocks from the study reports (never by hand)."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import TINY, write_run

REPO = Path(__file__).resolve().parent.parent

REPORT = """# Stability report: s

Wall time: 1.5 min from the first run's start to the last run's end. 4 runs in 2 arms (arms differ in: model.norm).

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

- layernorm - rmsnorm (differ in model.norm) at lr 0.003: +0.000 nats (95% CI -0.1..+0.1, n = 2 seeds): inconclusive.

## Figures
"""


def _run(readme, results=None):
    results = results or readme.parent / "results"  # never the repository's docs/results
    return subprocess.run([sys.executable, "scripts/readme_results.py", "--readme", str(readme), "--results",
                           str(results)], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_missing_report_is_one_line(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- claims: nope -->\n<!-- /claims -->\n")
    r = _run(readme)
    assert r.returncode == 2 and r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1


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
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from readme_results import index
    finally:
        sys.path.pop(0)
    assert (REPO / "docs" / "results" / "README.md").read_text() == index(REPO / "docs" / "results")


def test_results_index_has_one_line_per_study_with_its_claims(tmp_path):
    (tmp_path / "README.md").write_text("<!-- claims: results -->\n<!-- /claims -->\n")
    loss = {"n": 5, "mean": 0.1, "ci": [0.05, 0.15], "verdict": "different"}
    for name, claims in (("a", ["agrees", "cannot tell", "agrees"]), ("b", [])):
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "report.md").write_text(REPORT)
        (tmp_path / "results" / name / "study.yaml").write_text(f"name: {name}\nabout: does {name} matter\n")
        (tmp_path / "results" / name / "report.json").write_text(json.dumps(
            {"name": name, "about": f"does {name} matter", "runs": 4, "steps": 300, "wall_min": 2.5,
             "claims": [{"agreement": c, "paper": "P", "says": "S", "metric": "best_loss", "A": "x", "B": "y",
                         "loss": loss, "p": 0.01, "p_holm": 0.03} for c in claims]}))
    assert _run(tmp_path / "README.md").returncode == 0
    lines = (tmp_path / "results" / "README.md").read_text().splitlines()
    assert lines[-5] == "- [a](a/report.md): does a matter (4 runs of 300 steps, 2.5 min; claims: 2 agrees, " \
        "1 cannot tell)"
    assert lines[-4] == ("  - **a**, P: S (best_loss): **agrees** (x - y = +0.100 nats (95% CI +0.050..+0.150, "
                         "n = 5 seeds, different), Holm-adjusted p = 0.03)")
    assert lines[-1] == "- [b](b/report.md): does b matter (4 runs of 300 steps, 2.5 min)"
    readme = (tmp_path / "README.md")
    readme.write_text("x\n<!-- claims: results -->\nold\n<!-- /claims -->\n")
    assert _run(readme).returncode == 0
    assert readme.read_text().splitlines()[2:5] == [line[2:] for line in lines[-4:-1]]


def test_the_headline_states_the_norm_comparisons_of_the_report(tmp_path):
    """A report made from constructed runs (4 arms, 3 LRs, seeds 0-1 choose, 2-3 test): post-norm fails at 0.1
    in both norms, pre-norm nowhere; LayerNorm's loss is RMSNorm's + 0.05 on every seed. The headline states the
    LR50 ratio and the nested loss difference of each norm pair, from report.json, and every arm's LR50."""
    from study.report import write_report

    root = tmp_path / "r"
    for norm, extra in (("rmsnorm", 0.0), ("layernorm", 0.05)):
        for placement in ("pre", "post"):
            for lr in (1e-3, 1e-2, 1e-1):
                for seed in range(4):
                    fails = placement == "post" and lr == 1e-1
                    write_run(root, f"{norm}-{placement}-{lr}-{seed}", norm, lr, seed,
                              "collapsed" if fails else "ok", 5.9 if fails else 3.0 + extra + seed / 10
                              + (0 if lr == 1e-2 else 0.3), placement=placement)
    (root / "study.yaml").write_text(f"name: r\nconfig: {TINY}\ngrid: {{norm: [rmsnorm, layernorm], placement: "
                                     "[pre, post], lr: [0.001, 0.01, 0.1]}\nprotocol: {selection_seeds: [0, 1], "
                                     "test_seeds: [2, 3]}\n")
    write_report([root], root)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- headline: r/report.md -->\nold\n<!-- /headline -->\n")
    assert _run(readme).returncode == 0
    text = readme.read_text()
    post = next(line for line in text.splitlines() if line.startswith("- **post-norm**"))
    pre = next(line for line in text.splitlines() if line.startswith("- **pre-norm**"))
    assert "stability, LR50 of layernorm/post / rmsnorm/post = 1 (95% CI" in post  # the same edge in both norms
    assert "at each one's best LR (0.01, 0.01, chosen on seeds 0, 1) on the test seeds = +0.050 nats" in post
    assert "n = 2 seeds" in post and "not estimable (0 of 24 runs failed)" in pre
    arms = next(line for line in text.splitlines() if line.startswith("- **LR50 per arm**"))
    assert "layernorm/pre above 0.1 (no run failed)" in arms and "rmsnorm/post 0.0" in arms
    assert "![stability map](r/stability_map.png)\n<!-- /headline -->" in text
    assert "differ in model.placement" not in text and "layernorm - layernorm" not in text  # norm pairs only
    report = json.loads((root / "report.json").read_text())
    report["comparisons"] = [c for c in report["comparisons"] if c["key"] != "model.norm"]
    (root / "report.json").write_text(json.dumps(report))
    r = _run(readme)
    assert r.returncode == 2 and "compares no arms that differ in the norm alone" in r.stderr


def test_a_bench_block_is_the_saved_benchmark_output(tmp_path):
    (tmp_path / "bench.md").write_text("`python scripts/bench_norms.py` on 2026-01-01\n\nMachine: X\n\n## Norms\n\n"
                                       "| a | b |\n|---|---|\n| 1 | 2 |\n")
    page = tmp_path / "performance.md"
    page.write_text("# P\n\n## Norms\n\n<!-- bench: bench.md -->\nstale\n<!-- /bench -->\n")
    assert _run(page).returncode == 0
    assert page.read_text() == ("# P\n\n## Norms\n\n<!-- bench: bench.md -->\n`python scripts/bench_norms.py` on "
                                "2026-01-01\n\nMachine: X\n\n### Norms\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
                                "<!-- /bench -->\n")


def test_a_trends_block_states_each_fitted_slope_with_its_ci_and_links_the_figure(tmp_path):
    """The slope and its CI come from the report.json's numbers (study/trend.py fitted them); a trend without a
    slope says why; the index lists the same lines under its study."""
    trend = {"what": "loss difference", "pair": "layernorm - rmsnorm at placement=post", "axis": "model.dim",
             "per_doubling": True, "points": [[64, 0.01, [-0.03, 0.05]], [128, 0.02, [-0.02, 0.06]],
                                              [256, 0.03, [-0.01, 0.07]]],
             "slope": 0.01, "ci": [-0.025, 0.045], "used": 3}
    open_ratio = {**trend, "what": "LR50 ratio", "pair": "layernorm / rmsnorm at placement=pre",
                  "points": [[64, None, None], [128, 0.3, None]], "slope": None, "ci": None, "used": 0}
    (tmp_path / "results" / "w").mkdir(parents=True)
    (tmp_path / "results" / "w" / "report.md").write_text(REPORT)
    (tmp_path / "results" / "w" / "report.json").write_text(json.dumps(
        {"name": "w", "runs": 4, "trends": [trend, open_ratio]}))
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- trends: results -->\nold\n<!-- /trends -->\n")
    assert _run(readme).returncode == 0
    lines = readme.read_text().splitlines()[2:4]
    assert lines[0] == ("- **w** ([figure](results/w/trend.png)): loss difference layernorm - rmsnorm at "
                        "placement=post, in nats, by model.dim: 64: +0.010 (-0.030..+0.050); 128: +0.020 "
                        "(-0.020..+0.060); 256: +0.030 (-0.010..+0.070); slope +0.010 per doubling of model.dim "
                        "(95% CI -0.025..+0.045, from 3 of 3 points; model.dim 64..256 only)")
    assert lines[1].endswith("64: -; 128: +0.300 ('-': no estimate: no run of either arm failed, or only a "
                             "bound); no slope (0 of 2 points have a two-sided CI)")
    index = (tmp_path / "results" / "README.md").read_text()
    assert "  - trend: " + lines[0].split("): ", 1)[1] in index
