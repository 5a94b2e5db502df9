"""The benchmarks' measured ratios as one markdown table and PNG plots.

    python benchmarks/report.py                 # every benchmark below, full size
    python benchmarks/report.py --quick         # smaller runs, for a first look
    python benchmarks/report.py --only train_pss,table_scale
    python benchmarks/report.py --from DIR      # render again from the JSON a run saved

Runs each benchmark script in turn, each in its own process, and saves the JSON lines it
prints to OUT/<name>.jsonl. Then writes OUT/report.md: one row per summary line (what it
compares, its measured ratio or value, whether the target was met) under the machine it
ran on; and OUT/<name>.png: each summary's ratio as a bar, beside 1.0 (parity with what it
compares against). The README's benchmark table is a selection of this file's rows.
A benchmark that fails stops the report; its partial output is kept as <name>.failed.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# name: (arguments of a full run, arguments of a --quick run)
BENCHMARKS = {
    "train_pss": ([], ["--steps", "200", "--repeats", "2", "--traffic_steps", "50"]),
    "table_ops": ([], ["--quick", "--rounds", "1"]),
    "table_scale": ([], ["--sizes", "1,4", "--dims", "16,64", "--memory_million_rows", "2"]),
    "metrics": ([], []),
}
# The field a summary line gives its measured figure in, in order of preference.
FIGURE_FIELDS = ("ratio", "ratio_net_of_harness", "mean_ratio", "bytes_ratio", "mean_difference", "max_call_ms", "bytes",
                 "budget", "returned_fraction")


def run_benchmark(name, quick, out_dir):
    full, short = BENCHMARKS[name]
    command = [sys.executable, os.path.join(HERE, f"{name}.py")] + (short if quick else full)
    print(f"report: running {' '.join(command[1:])}", file=sys.stderr, flush=True)
    out = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    # A failed run's lines are no result: --from must not render them as one.
    suffix = "jsonl" if out.returncode == 0 else "failed"
    with open(os.path.join(out_dir, f"{name}.{suffix}"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if out.returncode != 0:
        raise SystemExit(f"report: {name} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


def read_records(out_dir, name):
    path = os.path.join(out_dir, f"{name}.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def figure_of(summary):
    """(field, value) of a summary line's measured figure, or (None, None)."""
    for field in FIGURE_FIELDS:
        if isinstance(summary.get(field), (int, float)) and not isinstance(summary.get(field), bool):
            return field, summary[field]
    return None, None


def markdown(results):
    """results: {name: records}. The report's markdown text."""
    lines = ["# Benchmark report", ""]
    machines = {json.dumps(r["machine"], sort_keys=True) for records in results.values()
                for r in records if "machine" in r}
    for machine in sorted(machines):
        m = json.loads(machine)
        lines.append(f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, Python {m.get('python', '?')}.")
    lines += ["", "| benchmark | what is compared | figure | value | target met |", "| --- | --- | --- | --- | --- |"]
    for name, records in results.items():
        for summary in (r for r in records if "summary" in r):
            field, value = figure_of(summary)
            extras = {k: v for k, v in summary.items() if k in ("dim", "keys")}
            what = summary["summary"] + (f" ({', '.join(f'{k} {v}' for k, v in extras.items())})" if extras else "")
            met = {True: "yes", False: "**no**"}.get(summary.get("met"), "")
            lines.append(f"| {name} | {what} | {field or ''} | {value if value is not None else ''} | {met} |")
    return "\n".join(lines) + "\n"


def plot(name, records, path):
    """A PNG of the ratios of `name`'s summary lines, one bar each, beside parity."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bars = []
    for summary in (r for r in records if "summary" in r):
        field, value = figure_of(summary)
        if field is not None and "ratio" in field:
            label = summary["summary"] + "".join(f" {k}={summary[k]}" for k in ("dim", "keys") if k in summary)
            bars.append((label, value, summary.get("met")))
    if not bars:
        return False
    figure, axes = plt.subplots(figsize=(9, 0.45 * len(bars) + 1.2))
    colors = ["tab:green" if met else "tab:red" if met is False else "tab:gray" for _, _, met in bars]
    axes.barh(range(len(bars)), [value for _, value, _ in bars], color=colors)
    axes.set_yticks(range(len(bars)), [label[:70] for label, _, _ in bars], fontsize=7)
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.invert_yaxis()
    axes.set_xlabel("ratio (green: target met, red: not met)")
    axes.set_title(name)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "report"))
    parser.add_argument("--only", help=f"comma-separated, of {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--from", dest="from_dir", help="a directory of saved <name>.jsonl to render")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(BENCHMARKS)
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        parser.error(f"--only: unknown benchmarks {sorted(unknown)}; known: {', '.join(BENCHMARKS)}")
    out_dir = args.from_dir or args.out
    os.makedirs(out_dir, exist_ok=True)
    if not args.from_dir:
        for name in names:
            run_benchmark(name, args.quick, out_dir)
    results = {name: records for name in names if (records := read_records(out_dir, name)) is not None}
    if not results:
        raise SystemExit(f"report: no saved results (<name>.jsonl) in {out_dir}")
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(markdown(results))
    plots = [name for name, records in results.items() if plot(name, records, os.path.join(out_dir, f"{name}.png"))]
    print(json.dumps({"report": os.path.join(out_dir, "report.md"), "plots": plots}))


if __name__ == "__main__":
    main()
