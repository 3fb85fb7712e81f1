"""Every goal of issue 25 on this CPU, in one run: the goal scripts one after another, and one
table at the end.

Run ``python benchmarks/goals.py`` (about 13 minutes on 2 cores; ``--quick`` passes
``--quick`` to every script: a smoke test of a few minutes, not a measurement, whose goals the
table marks not met: a goal is decided by medians of at least 5 rounds, with ctformer's
output equal to the peer's). It runs, each
in its own process and never two at once (their threads would share the cores and corrupt
each other's times),

* ``attention.py`` (attention against SDPA, extra memory),
* ``model.py`` (MiniLM, GPT-2 and Llama against HuggingFace),
* ``small_solve.py`` (a small solve against the plain NumPy loop),
* ``convolution.py`` (FFT convolution against numpy.fft),
* ``particle_batch.py`` (batched SA particles against the authors' torch loop),

with ``--repeats`` and ``--threads`` passed on, and ``--emulate avx2`` applied to every script
(each library of both sides limited to AVX2: another CPU kind, emulated on this one) (``small_solve.py`` runs on one thread: its
goal is the overhead of a small solve against a one-thread loop). Each script's output goes to
``--logs`` (one file per script, the header with the CPU and BLAS included); each script
also appends its goals to a JSON-lines file (``CTFORMER_GOALS_FILE``, set here), from which
the closing table is printed as Markdown: the CPU model, every goal with its median ratio,
quartiles and verdict (and, for the networks and attention without a mask, the floor: the
ratio the feature products alone, or attention's two products alone, would give), and the count met. A script that fails is named with its exit status
and the goals it did record; the others still run. Ctrl-C stops the run and still prints the
table of the goals recorded so far, naming the script it interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _environment import add_emulation_option, emulation_env

HERE = Path(__file__).resolve().parent
SCRIPTS = ("attention.py", "model.py", "small_solve.py", "convolution.py", "particle_batch.py")
ONE_THREAD = {"small_solve.py"}  # its goal is a one-thread solve against a one-thread loop


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="--quick for every script (a smoke test)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per script (their default: 5)")
    parser.add_argument("--threads", type=int, default=2, help="threads of each side")
    add_emulation_option(parser)
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=SCRIPTS, metavar="SCRIPT",
                        help=f"which scripts (default: all of {', '.join(SCRIPTS)})")
    parser.add_argument("--logs", type=Path, default=None, help="directory for the scripts' output "
                        "(default: a new temporary directory)")
    args = parser.parse_args(argv)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="ctformer-goals-"))
    logs.mkdir(parents=True, exist_ok=True)
    goals_file = logs / "goals.jsonl"
    goals_file.unlink(missing_ok=True)
    failed = {}
    try:
        for script in args.scripts:
            status = run_script(script, args, logs / f"{Path(script).stem}.log", goals_file)
            if status != 0:
                failed[script] = status
    except KeyboardInterrupt:  # the table of what finished is still worth printing
        failed[script] = "interrupted by Ctrl-C"
        print(f"\n{script}: interrupted; the goals below are those recorded before it", flush=True)
    print()
    print(table(read_goals(goals_file), failed))
    return 1 if failed else 0


def run_script(script: str, args, log: Path, goals_file: Path) -> int:
    """Run one goal script in its own process, its output to ``log``; its exit status."""
    command = [sys.executable, str(HERE / script)]
    command += ["--threads", str(args.threads)] if script not in ONE_THREAD else []
    command += ["--quick"] if args.quick else []
    command += ["--repeats", str(args.repeats)] if args.repeats is not None else []
    print(f"{script}: running ({' '.join(command[2:]) or 'defaults'}), output in {log}", flush=True)
    start = time.perf_counter()
    env = emulation_env(args.emulate) if args.emulate else dict(os.environ)
    with open(log, "w") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**env, "CTFORMER_GOALS_FILE": str(goals_file)}).returncode
    print(f"{script}: exit status {status} after {time.perf_counter() - start:.0f} s", flush=True)
    return status


def read_goals(path: Path) -> list[dict]:
    """The goals the scripts recorded, in order (none when the file is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(rows: list[dict], failed: dict) -> str:
    """The Markdown table of ``rows`` (as :func:`_environment.summary` writes them) for the
    closing note: the CPU and BLAS, each goal, and the count met; ``failed`` names scripts
    that stopped with an error."""
    cpus = sorted({r["cpu"] for r in rows})
    lines = [f"CPU: {', '.join(cpus) or 'none recorded'}"]
    for script in dict.fromkeys(r["script"] for r in rows):  # the BLAS each script ran with
        blas = next(r["blas"] for r in rows if r["script"] == script)
        lines.append(f"- {script}: {'; '.join(sorted(blas.split('; ')))}")
    lines += ["", "| script | goal | ratio | quartiles | goal | verdict | floor |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        quartiles = f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f}" if r["spread"] else ""
        figure = f"{r['ratio']:.3f}x" if r["unit"] == "x" else f"{r['ratio']:.4g} {r['unit']}"
        bound = f"<= {r['goal']:g}" + ("x" if r["unit"] == "x" else f" {r['unit']}")
        floor = f"{r['floor']:.2f}" if r.get("floor") is not None else ""
        lines.append(f"| {r['script']} | {r['name']} | {figure} | {quartiles} | {bound} | {r['verdict']} | {floor} |")
    met = sum(r["met"] for r in rows)
    lines += ["", f"{met} of {len(rows)} goals met"]
    lines += [f"{script} {status if isinstance(status, str) else f'stopped with exit status {status}'}: "
              "its goals above are those it recorded" for script, status in failed.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
