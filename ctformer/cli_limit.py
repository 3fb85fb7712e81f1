"""The ``ctformer limit`` and ``ctformer cluster`` commands (torch and HuggingFace).

``limit`` reports the discrete-limit check of MiniLM, or of a small random network of a
HuggingFace class; ``cluster`` reports, layer by layer, how MiniLM's tokens cluster on the
sphere, with an optional figure of the inner products, then the same mean inner products along
the continuous-depth refinement of a pre-norm model (``--no-refinement`` leaves it out).
"""
from __future__ import annotations

from pathlib import Path

from .cli_common import HF_PACKAGES, MINILM_PACKAGES, UserError, _have_matplotlib, _progress, \
    _require

def _hf_progress(args) -> None:
    """HuggingFace's weight-loading bar follows the same rule: a terminal only."""
    if _progress(args):
        return
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def _run_limit(args) -> int:
    _hf_progress(args)
    model = args.model
    if args.pretrained and model not in (None, "bert"):
        raise UserError(f"--pretrained applies to --model bert (MiniLM), not to --model {model}")
    if args.seed is not None and (model is None or args.pretrained):
        # the pretrained check has no random weights: refuse rather than ignore the seed
        raise UserError(f"--seed {args.seed} seeds the random weights of --model NAME; the MiniLM "
                        "check (no --model, or --pretrained) runs the pretrained weights: leave "
                        "--seed out")
    seed = 0 if args.seed is None else args.seed
    if model is None or args.pretrained:
        _require(MINILM_PACKAGES, "the MiniLM discrete-limit check")
    else:
        _require(HF_PACKAGES, f"ctformer limit --model {model}")
    from .bridges.hf import limit_report
    from .bridges.minilm import discrete_limit_report

    if model is None:
        print(discrete_limit_report())
        return 0
    try:
        print(limit_report(model, pretrained=args.pretrained, seed=seed))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return 0


_MINILM_POSITIONS = 512  # all-MiniLM-L6-v2's max_position_embeddings


def _cluster_lines(study) -> list[str]:
    stats = study.stats
    first, last = stats[0], stats[-1]
    lines = [
        f"Token clustering in {study.name}: {first.tokens} tokens, {len(stats) - 1} layers",
        "measured: each layer's hidden states h_i are put on the unit sphere, x_i = h_i / |h_i|, "
        "and the inner products <x_i, x_j> of all token pairs are summarized",
        "theory: attention moves tokens on the sphere towards each other, so with depth the "
        "inner products move towards 1 and tokens cluster (Geshkovski et al. 2025)",
        "",
        f"{'layer':>5} {'mean <x_i,x_j>':>15} {'median':>7} {'pairs > 0.9':>11} "
        f"{'clusters':>8} {'distance to one cluster':>24}",
    ]
    for s in stats:
        lines.append(f"{s.depth:5.0f} {s.mean_inner_product:15.4f} {s.median_inner_product:7.4f} "
                     f"{s.fraction_aligned:11.3f} {s.clusters:8d} "
                     f"{s.single_cluster_distance:24.3f}")
    trend = "rises" if last.mean_inner_product > first.mean_inner_product else "does not rise"
    lines.append("")
    lines.append(f"result: the mean inner product {trend} from {first.mean_inner_product:.3f} "
                 f"(layer 0) to {last.mean_inner_product:.3f} (layer {last.depth:.0f}) and the "
                 f"distance to one cluster falls from {first.single_cluster_distance:.3f} to "
                 f"{last.single_cluster_distance:.3f}"
                 if trend == "rises" else
                 f"result: the mean inner product {trend} ({first.mean_inner_product:.3f} at "
                 f"layer 0, {last.mean_inner_product:.3f} at layer {last.depth:.0f})")
    lines.append("(clusters: groups of tokens closer than 0.5; six layers are far from the "
                 "long-time limit of one cluster)")
    if first.tokens >= _MINILM_POSITIONS:  # the tokenizer cuts, silently: say so
        lines.append(f"note: MiniLM reads at most {_MINILM_POSITIONS} tokens ([CLS] and [SEP] "
                     f"included); a longer --text was cut to its first {_MINILM_POSITIONS}")
    return lines


def _refinement_lines(refined) -> list[str]:
    """The continuous-depth refinement: mean pairwise inner product at the layer boundaries
    for each number of steps per layer, and the observed order of the Lie scheme in the step
    (from the largest change over the boundaries between successive step counts)."""
    import math

    steps = sorted(refined)
    means = {k: [s.mean_inner_product for s in refined[k].stats] for k in steps}
    layers = len(means[steps[0]]) - 1
    lines = [
        "",
        f"Continuous-depth refinement of a pre-norm model (random weights, {layers} layers, "
        "32 tokens x 32 features, no final LayerNorm), solved by lie with "
        f"{', '.join(map(str, steps))} steps per layer (1 step per layer is the discrete network)",
        f"measured: the mean <x_i, x_j> at the layer boundaries t = 0..{layers}",
        f"{'steps/layer':>11} " + " ".join(f"{'t=' + str(t):>7}" for t in range(layers + 1)),
    ]
    # rows named "k = 1": no row of this table reads as a MiniLM layer row ("  1  0.0527")
    lines += [f"{'k = ' + str(k):>11} " + " ".join(f"{m:7.4f}" for m in means[k]) for k in steps]
    changes = [max(abs(a - b) for a, b in zip(means[k], means[j])) for k, j in zip(steps, steps[1:])]
    orders = [math.log(c0 / c1) / math.log(j / k) if c0 > 0 and c1 > 0 else math.nan
              for c0, c1, k, j in zip(changes, changes[1:], steps, steps[1:])]
    lines.append("result: successive step counts change the means by at most "
                 f"{', '.join(f'{c:.2e}' for c in changes)}: observed order "
                 f"{', '.join(f'{p:.2f}' for p in orders)} (lie is first order in the step; with "
                 "random weights this model need not cluster)")
    return lines


def _cluster_figure(study, path):
    import matplotlib.pyplot as plt
    import numpy as np

    from .studies.plotting import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    centers = (study.edges[:-1] + study.edges[1:]) / 2
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(study.stats)))
    for s, color in zip(study.stats, colors):
        axes[0].plot(centers, s.histogram, color=color, label=f"layer {s.depth:g}")
    axes[0].set(xlabel=r"$\langle x_i, x_j\rangle$", ylabel="density",
                title=f"{study.name}: pairwise inner products")
    axes[0].legend(fontsize=7)
    depth = [s.depth for s in study.stats]
    axes[1].plot(depth, [s.mean_inner_product for s in study.stats], "o-", label="mean")
    axes[1].plot(depth, [s.median_inner_product for s in study.stats], "s--", label="median")
    axes[1].set(xlabel="layer", ylabel=r"$\langle x_i, x_j\rangle$",
                title="towards 1 with depth: tokens cluster")
    axes[1].legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _run_cluster(args) -> int:
    if args.text is not None and not args.text.strip():  # before torch and the weights load
        raise UserError("--text is empty; give the text to encode, or leave --text out for the "
                        "built-in paragraph")
    if args.plot is not None:
        target = Path(args.plot)
        if target.is_dir():
            raise UserError(f"--plot {args.plot!r} is a directory; give a file name such as "
                            "clusters.png")
        if target.suffix.lower() not in (".png", ".pdf", ".svg"):
            raise UserError(f"--plot {args.plot!r}: the file name must end in .png, .pdf or .svg")
        # checked before the model runs: the figure is the last thing written
        if not target.absolute().parent.is_dir():
            raise UserError(f"--plot {args.plot!r}: the directory {str(target.parent)!r} does "
                            "not exist; create it first or give a file in an existing directory")
    _require(MINILM_PACKAGES, "the clustering report")  # the demo extra brings matplotlib too
    if args.plot is not None and not _have_matplotlib():  # before the model runs, as above
        raise UserError(f"--plot {args.plot!r} needs matplotlib, which is not installed: "
                        "pip install matplotlib (or leave --plot out)")
    _hf_progress(args)
    from .particles.minilm import continuous_model_clustering, minilm_clustering

    study = minilm_clustering(args.text)
    lines = _cluster_lines(study)
    if not args.no_refinement:  # about 2 s: the layer count of MiniLM, its own grids
        lines += _refinement_lines(continuous_model_clustering(layers=len(study.stats) - 1))
    print("\n".join(lines))
    if args.plot is not None:
        _cluster_figure(study, args.plot)
        print(f"wrote {args.plot}")
    return 0
