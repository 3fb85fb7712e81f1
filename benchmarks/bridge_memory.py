"""Benchmark: the memory a converted HuggingFace network holds, against the module's own weights.

Run ``python benchmarks/bridge_memory.py`` (about a minute; ``--width half`` or ``quarter``
for a smaller machine). Each case runs in a fresh Python process, which

1. builds the HuggingFace module with random weights (``MistralModel`` with one layer of the
   Mistral-7B width: hidden 4096, intermediate 14336, 32 heads, 8 key-value heads, head
   dimension 128, vocabulary 256 so that the embedding table does not count; and GPT-2 small:
   12 layers, width 768, 12 heads), in float32 and in float64;
2. resets the peak resident set size (``echo 5 > /proc/self/clear_refs``) and starts
   :mod:`tracemalloc` (NumPy reports its array allocations to it);
3. runs ``from_hf(model).run(x)`` on one batch of 64 tokens, keeping the converted model;
4. prints the module's parameter bytes P, the process's peak resident memory (``VmHWM``, which
   includes the module itself and about 0.45 GiB of imported libraries), its growth over the
   resident memory before the conversion, the :mod:`tracemalloc` peak (NumPy arrays and Python
   objects) and the NumPy arrays still held after ``run``, as multiples of P.

A warm-up conversion of a small network of the same class runs first, so that imports,
compiled loops and the library's caches are not counted.

A converted model holds one float64 copy of each weight: for a float64 module the operators
share the module's tensors (views, no copy: held NumPy bytes ~ 0 P) and for a float32 module
it owns one float64 conversion (2 P, twice the bytes of float32). The goal of the design
(one copy) for a float64 module: peak resident memory <= 1.3 P plus activations.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import header, summary, verdict  # noqa: E402

WIDTHS = {  # hidden, intermediate, heads, key-value heads (head dimension 128 at every width)
    "full": (4096, 14336, 32, 8),
    "half": (2048, 7168, 16, 4),
    "quarter": (1024, 3584, 8, 2),
}

_CHILD = r"""
import gc, json, os, sys, tracemalloc
import numpy as np, torch
import transformers
from ctformer.bridges import from_hf

case, width, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)

def network(sizes, layers=12):
    if case == "mistral":
        hidden, inter, heads, kv = sizes
        cfg = transformers.MistralConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                                         num_key_value_heads=kv, head_dim=128, num_hidden_layers=1,
                                         vocab_size=256, sliding_window=None)
        return transformers.MistralModel(cfg).to(getattr(torch, dtype)).eval()
    cfg = transformers.GPT2Config(vocab_size=256, n_layer=layers, n_embd=sizes[0], n_head=sizes[2])
    return transformers.GPT2Model(cfg).to(getattr(torch, dtype)).eval()


# warm up: the imports, compiled loops and caches of a first conversion are not the model's
small = network((256, 512, 2, 1), layers=1)
from_hf(small).run(np.ones((1, 8, 256)))
del small
model = network(json.loads(sys.argv[4]) if case == "mistral" else (768, 3072, 12, 12))
for p in model.parameters():
    p.requires_grad_(False)
params = sum(p.numel() * p.element_size() for p in model.parameters())
d = model.config.hidden_size if case == "mistral" else model.config.n_embd
x = np.random.default_rng(0).standard_normal((1, 64, d))
gc.collect()

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

rss0 = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
tracemalloc.start()
net = from_hf(model)
y = net.run(x)
y = net.run(x)  # a second call builds nothing new
numpy_peak = tracemalloc.get_traced_memory()[1]
gc.collect()
only_numpy = [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]
numpy_held = sum(s.size for s in tracemalloc.take_snapshot().filter_traces(only_numpy).statistics("filename"))
tracemalloc.stop()
hwm = status("VmHWM")
out = dict(params=params, rss_before=rss0, hwm=hwm, numpy_peak=numpy_peak, numpy_held=numpy_held,
           model_numbers=sum(v.size for v in net.parameters().values()),
           module_numbers=sum(p.numel() for p in model.parameters()))
print(json.dumps(out))
"""


def measure(case: str, width: str, dtype: str) -> dict:
    """One case in a fresh process: the numbers of the module docstring (bytes)."""
    env = dict(os.environ, CTFORMER_NUM_THREADS="2", OMP_NUM_THREADS="2")
    args = [sys.executable, "-c", _CHILD, case, width, dtype, json.dumps(WIDTHS[width])]
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"{case} {width} {dtype} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", choices=sorted(WIDTHS), default="full", help="the Mistral layer's width")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--cases", nargs="+", default=["mistral", "gpt2"])
    args = parser.parse_args(argv)
    gib = 2.0**30
    import numpy  # noqa: F401  (the header names its BLAS; the measurements run in child processes)

    header(f"memory of a converted network: width {args.width}, each case in a fresh process")
    print(f"{'case':<22}{'dtype':<9}{'P GiB':>8}{'peak RSS GiB':>14}{'(peak-RSS0)/P':>15}"
          f"{'peak/P':>8}{'numpy peak/P':>14}{'numpy held/P':>14}")
    for case in args.cases:
        for dtype in args.dtypes:
            r = measure(case, args.width, dtype)
            p = r["params"]
            name = f"mistral-{args.width}" if case == "mistral" else "gpt2-small"
            print(f"{name:<22}{dtype:<9}{p / gib:>8.3f}{r['hwm'] / gib:>14.3f}{(r['hwm'] - r['rss_before']) / p:>15.2f}"
                  f"{r['hwm'] / p:>8.2f}{r['numpy_peak'] / p:>14.2f}{r['numpy_held'] / p:>14.2f}", flush=True)
            if dtype == "float64":
                total = 1.0 + (r["hwm"] - r["rss_before"]) / p
                verdict(f"{name} float64 module and converted model at the peak / P", total, 1.3)
    summary()


if __name__ == "__main__":
    main()
