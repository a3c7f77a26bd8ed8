"""The figures' axes and styles, read from matplotlib's own objects: panels that plot one quantity
share a y axis, a norm keeps its colour and a placement its line style in every panel and figure."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

import lab.figures as figures  # noqa: E402
from lab.arms import Arm  # noqa: E402
from lab.read import Run  # noqa: E402


def _run(norm, placement, lr, seed, final, eps=1e-5):
    config = {
        "model.norm": norm,
        "model.placement": placement,
        "model.norm_eps": eps,
        "optim.lr": lr,
        "train.seed": seed,
    }
    summary = {"status": "ok", "final_val_loss": final}
    records = [{"step": 0, "val/loss": 5.0}] + [
        {"step": s, "train/loss": 5.0 - s * 0.1, "val/loss": final} for s in (1, 2, 3)
    ]
    return Run(f"{norm}-{placement}-{lr}-{seed}", None, config, summary, records)


def _result(arms):
    """A StudyResult's fields the figures read, over real Arms: post arms far above the pre ones, so
    panels with their own y axes would differ."""
    built = {}
    for label, (norm, placement, eps) in arms.items():
        base = 3.0 if placement == "pre" else 4.5
        runs = [
            _run(norm, placement, lr, seed, base + 0.1 * i + 0.01 * seed, eps)
            for i, lr in enumerate((1e-3, 1e-2))
            for seed in (0, 1)
        ]
        built[label] = Arm(label, runs, best_lr=1e-3)
    return SimpleNamespace(arms=built, keys=["model.norm", "model.placement"], sensitivity={})


@pytest.fixture
def drawn(monkeypatch):
    """The figures drawn, kept open: {file name: Figure}."""
    kept = {}

    def save(fig, path, made, caption):
        kept[path.name] = fig
        made.append((path.name, caption))

    monkeypatch.setattr(figures, "_save", save)
    yield kept
    plt.close("all")


ARMS = {
    "norm=rmsnorm placement=pre": ("rmsnorm", "pre", 1e-5),
    "norm=layernorm placement=pre": ("layernorm", "pre", 1e-5),
    "norm=rmsnorm placement=post": ("rmsnorm", "post", 1e-5),
    "norm=layernorm placement=post": ("layernorm", "post", 1e-5),
}


def _scatter_colors(ax) -> dict:
    """{legend label: face colour} of a panel's labelled scatters."""
    return {
        c.get_label(): tuple(c.get_facecolor()[0])
        for c in ax.collections
        if not c.get_label().startswith("_")
    }


def test_loss_vs_lr_panels_share_a_y_axis_and_colour_by_norm(tmp_path, drawn):
    res = _result(ARMS)
    figures.loss_vs_lr(plt, res, figures.arm_styles(res.arms), tmp_path, [])
    axes = drawn["loss_vs_lr.png"].axes
    assert len(axes) == 2  # one panel per placement
    assert axes[0].get_shared_y_axes().joined(axes[0], axes[1])
    assert axes[0].get_ylim() == axes[1].get_ylim()
    # every point of both panels inside the shared limits (post's losses sit above pre's)
    lo, hi = axes[0].get_ylim()
    for ax in axes:
        for c in ax.collections:
            ys = c.get_offsets()[:, 1]
            assert lo <= ys.min() and ys.max() <= hi
    pre, post = (_scatter_colors(ax) for ax in axes)
    for norm in ("rmsnorm", "layernorm"):
        want = to_rgba(figures.NORM_COLORS[norm])
        assert pre[f"norm={norm} placement=pre"] == want
        assert post[f"norm={norm} placement=post"] == want
    # the mean lines: solid for pre, dashed for post
    assert {line.get_linestyle() for line in axes[0].lines} == {"-"}
    assert {line.get_linestyle() for line in axes[1].lines} == {"--"}


def test_a_norm_keeps_its_colour_across_figures_and_loss_curve_panels(tmp_path, drawn):
    res = _result(ARMS)
    styles = figures.arm_styles(res.arms)
    figures.loss_curves(plt, res.arms, styles, tmp_path, [])
    figures.final_losses(plt, res, styles, tmp_path, [])
    curves = drawn["loss_curves.png"].axes
    assert len(curves) == 2 and curves[0].get_shared_y_axes().joined(curves[0], curves[1])
    assert curves[0].get_ylim() == curves[1].get_ylim()
    for ax in curves:  # one line per seed: its colour the norm's, its style the placement's
        by_norm = {}
        for line in ax.lines:
            by_norm.setdefault(to_rgba(line.get_color()), set()).add(line.get_linestyle())
        assert set(by_norm) == {to_rgba(figures.NORM_COLORS[n]) for n in ("rmsnorm", "layernorm")}
        assert all(styles_ == {"-", "--"} for styles_ in by_norm.values())
    final = _scatter_colors(drawn["final_loss.png"].axes[0])
    for label, (norm, _, _) in ARMS.items():
        assert final[label] == to_rgba(figures.NORM_COLORS[norm])


def test_style_registry_fixed_by_name_with_a_fallback_that_does_not_depend_on_order():
    assert figures.norm_color("rmsnorm") != figures.norm_color("layernorm")
    assert figures.placement_style("pre") == "-" and figures.placement_style("post") == "--"
    other = figures.norm_color("brand-new-norm")
    assert other in figures.OTHER_COLORS and other == figures.norm_color("brand-new-norm")
    assert figures.placement_style("sandwich") in figures.OTHER_STYLES
    assert figures.placement_style("peri") not in ("-", "--")
    # arms that share a norm and a placement (here: eps) differ by marker; order does not recolour
    res = _result(
        {
            "a": ("rmsnorm", "pre", 1e-8),
            "b": ("rmsnorm", "pre", 1e-5),
            "c": ("layernorm", "pre", 1e-5),
        }
    )
    st = figures.arm_styles(res.arms)
    assert st["a"]["color"] == st["b"]["color"] != st["c"]["color"]
    assert st["a"]["marker"] != st["b"]["marker"] and st["a"]["variant"]
    assert not st["c"]["variant"]
    flipped = figures.arm_styles(dict(reversed(list(res.arms.items()))))
    assert all(flipped[k]["color"] == st[k]["color"] for k in st)


def test_curve_figures_draw_at_most_eight_panels_the_lrs_with_most_runs(tmp_path, drawn):
    """A bisection leaves hundreds of one-run LRs: the curves keep the LRs with most runs."""
    res = _result(ARMS)
    label, arm = next(iter(res.arms.items()))
    extra = [_run("rmsnorm", "pre", 0.05 * 1.01**k, 9, 5.0) for k in range(20)]
    res.arms[label] = Arm(label, [*arm.runs, *extra], best_lr=1e-3)
    made = []
    figures.loss_curves(plt, res.arms, figures.arm_styles(res.arms), tmp_path, made)
    titles = [ax.get_title() for ax in drawn["loss_curves.png"].axes]
    assert len(titles) == figures.MAX_PANELS == 8
    assert titles[:2] == ["lr 0.001", "lr 0.01"]  # the grid's LRs, every seed and arm
    assert made[0][1].endswith("(the 8 of 22 LRs with most runs)")
