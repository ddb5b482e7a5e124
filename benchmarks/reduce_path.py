#!/usr/bin/env python
"""What the sp fix costs on ZeRO-3's reduce path (``__avg_scatter_grads`` before/after in a real engine) and its
ULP errors against a float64 oracle. Target: after/before <= 1.02 on many small parameters; writes
results/benchmarks/reduce_path.json and .md, last line ``after/before = R``. Method: docs/code/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, default_python, environment, write_result  # noqa: E402
from patch_and_test.review.benchmark_reports import (  # noqa: E402
    Bucket, LaunchInfo, NumericsLaunch, ReducePath, Spread, TimingLaunch)
from patch_and_test.core.series import series_for_version  # noqa: E402
from repro.harness.cli import gpu_count, main_guard, resolve_backend  # noqa: E402
from repro.harness.launch import remove_shm_buffers  # noqa: E402

# The fix patch of the series that serves the installed release (on 0.19.8 the pull request's own patch 1).
RECOMMENDED = "divisor"
TARGET = 1.02
TARGET_CASE = "many_small"
AA = "before-again"
PATCHED_FILES = ("deepspeed/runtime/zero/stage3.py", "deepspeed/runtime/comm/coalesced_collectives.py")
DEFAULT_CASES = ("many_small=512x4096", "few_large=4x2097152")
DEFAULT_TOPOLOGIES = ("2:2", "4:2", "4:4", "3:3")
METRICS = {"wall": "step_times_s", "cpu": "cpu_times_s"}
SPREAD = tuple(Spread.model_fields)
LAUNCHES = {"timing": TimingLaunch, "numerics": NumericsLaunch}


def launch_main(argv: list[str]) -> int:
    """``--phase timing|numerics``: one multi-rank launch through repro.harness.launch (also run by each rank)."""
    from repro.harness import launch

    import _reduce_path_ranks as ranks

    def add(parser) -> None:
        parser.add_argument("--phase", choices=list(LAUNCHES), required=True)
        parser.add_argument("--impl", action="append", default=[], metavar="NAME=DIR")
        parser.add_argument("--case", action="append", default=[], metavar="LABEL=COUNTxNUMEL")
        parser.add_argument("--dtypes", default="fp32,bf16")
        parser.add_argument("--kinds", default="exact,random,small")
        parser.add_argument("--warmup", type=int, default=5)
        parser.add_argument("--iters", type=int, default=30)

    def run(args) -> int:
        x = args.extra
        impl_spec = dict(_pair(s) for s in x["impl"])
        if "before" not in impl_spec:
            print("error: --impl before=DIR is required", file=sys.stderr)
            return 2
        dtypes = tuple(x["dtypes"].split(","))
        if x["phase"] == "timing":
            cases = {}
            for label, spec in map(_pair, x["case"] or DEFAULT_CASES):
                if not (m := re.fullmatch(r"(\d+)x(\d+)", spec)):
                    raise SystemExit(f"error: a case is COUNTxNUMEL, got {spec!r}")
                cases[label] = int(m.group(1)), int(m.group(2))
            program = ranks.timing_program(impl_spec, dtypes, cases, x["warmup"], x["iters"])
        else:
            program = ranks.numerics_program(impl_spec, dtypes, tuple(x["kinds"].split(",")))

        def sink(report: dict, wall: float) -> None:
            report.update(world_size=args.world_size, sp=args.sp, dp=args.dp, backend=args.backend,
                          wall_s=round(wall, 2), load_average_at_end=os.getloadavg())
            if args.json:
                LAUNCHES[x["phase"]].model_validate(report).write(args.json)

        return launch.run(args, program, sink)

    return main_guard("reduce_path: one launch", run, add, argv)


def _shown(path: Path) -> str:
    """A path as results record it: relative to the repository where it lies inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise SystemExit(f"error: expected NAME=VALUE, got {text!r}")
    return name, value


def prepare_impls(python: str, patches: dict[str, Path], workdir: Path) -> dict[str, str]:
    """before = the installed package; NAME = a scratch copy of its two reduce-path files + FILE."""
    out = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('deepspeed').submodule_search_locations[0])"],
        capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"error: {python} cannot import deepspeed (give --python an interpreter with torch and "
                         "DeepSpeed installed)")
    installed = Path(out.stdout.strip())
    impls = {"before": str(installed)}
    for name, patch in patches.items():
        touched = re.findall(r"^diff --git a/(\S+) b/", patch.read_text(), flags=re.M)
        code = {t for t in touched if t.startswith("deepspeed/")}
        if not code or not code <= set(PATCHED_FILES):
            raise SystemExit(f"error: {patch} changes {sorted(code) or 'no DeepSpeed file'}; this benchmark "
                             f"loads only {', '.join(PATCHED_FILES)}")
        tree = workdir / name
        for rel in PATCHED_FILES:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(installed.parent / rel, tree / rel)
        proc = subprocess.run(["git", "apply", *[f"--include={rel}" for rel in PATCHED_FILES],
                               str(patch.resolve())], cwd=tree, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: {patch.name} does not apply to the installed DeepSpeed ({installed}):\n"
                             f"{proc.stderr.strip()}")
        impls[name] = str(tree / "deepspeed")
    return impls


def run_launch(python: str, phase: str, world: int, sp: int, backend: str, impls: dict[str, str], out: Path,
               extra: list[str], timeout: float) -> TimingLaunch | NumericsLaunch | None:
    """One launch; its report (also left in ``out``), or None when it failed (the reason printed)."""
    flags = dict(phase=phase, world_size=world, sp=sp, backend=backend, json=out, timeout=timeout)
    argv = [python, str(Path(__file__).resolve())]
    argv += [x for k, v in flags.items() for x in ("--" + k.replace("_", "-"), str(v))] + extra
    argv += [a for name, path in impls.items() for a in ("--impl", f"{name}={path}")]
    load, start = os.getloadavg(), time.monotonic()
    # The ranks' folders live under this run's own folder: another job's /tmp cleanup cannot pull them away.
    env = dict(os.environ, TMPDIR=str(out.parent))
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout + 60, env=env)
    if proc.returncode != 0 or not out.exists():
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-3000:])
        print(
            f"error: {phase} launch (world {world}, sp {sp}) failed with exit code {proc.returncode} after "
            f"{time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        return None
    report = LAUNCHES[phase].load(out)
    addr, port = report.master_addr, report.master_port
    report = report.model_copy(
        update=dict(shm_buffers_removed=remove_shm_buffers(addr, port) if addr and port else 0,
                    load_average_at_start=list(load), driver_wall_s=round(time.monotonic() - start, 2)))
    report.write(out)
    return report


def _quantiles(values: list[float]) -> dict:
    v = sorted(values)
    q = statistics.quantiles(v, n=20, method="inclusive") if len(v) > 1 else v * 19
    return {"median": statistics.median(v), "p25": q[4], "p75": q[14], "p10": q[1], "p90": q[17], "n": len(v)}


def summarize_timing(launches: list[dict], impl_names: list[str]) -> list[dict]:
    """Pool every launch's rounds per (case, dtype); ratios paired per round (wall: slowest rank; cpu: all ranks)."""
    groups: dict = {}  # (case, dtype) -> [(the case, its largest bucket) per launch]
    for case in (case for launch in launches for case in launch["cases"]):
        bucket = max(case["buckets"], key=lambda b: b["bucket_elements"])
        groups.setdefault((case["case"], case["dtype"]), []).append((case, bucket))
    return [_summarize_row(group, impl_names) for group in groups.values()]


def _summarize_row(group: list[tuple[dict, dict]], impl_names: list[str]) -> dict:
    others = [n for n in impl_names if n != "before"]
    case, buckets = group[0][0], [bucket for _, bucket in group]
    b = {k: buckets[-1][k] for k in Bucket.model_fields}
    summary = {k: case[k] for k in ("case", "dtype", "params", "numel_each")}
    summary.update(buckets=len(case["buckets"]), bucket=b)
    before = {}  # metric -> the median unpatched call, s
    for metric, field in METRICS.items():
        series = {n: [bk[field][n] for bk in buckets] for n in impl_names}  # per launch, per round
        pooled = {n: [x for launch in series[n] for x in launch] for n in impl_names}
        before[metric] = statistics.median(pooled["before"])
        summary[f"{metric}_ms"] = {n: _quantiles(v) for n, v in pooled.items()}
        for q in summary[f"{metric}_ms"].values():  # in ms; n stays a count
            q.update({k: round(1e3 * x, 3) for k, x in q.items() if k != "n"})
        ratios = summary[f"{metric}_ratio_vs_before"] = {}
        for n in others:
            q = _quantiles([a / c for la, lb in zip(series[n], series["before"]) for a, c in zip(la, lb)])
            per_launch = [statistics.median(la) / statistics.median(lb) for la, lb in zip(series[n], series["before"])]
            ratios[n] = {k: round(q[k], 4) for k in SPREAD}
            ratios[n].update(median_paired=round(q["median"], 4), rounds=q["n"],
                             ratio_of_medians=round(statistics.median(pooled[n]) / before[metric],
                                                    4), per_launch_ratio_of_medians=[round(x, 4) for x in per_launch])
    isolated = [max(r["wall_median_s"] for r in bk["isolated_post_scale"]) for bk in buckets]
    iso_wall = statistics.median(isolated)
    iso_cpu = statistics.median([sum(r["cpu_median_s"] for r in bk["isolated_post_scale"]) for bk in buckets])
    before_wall, before_cpu = before["wall"], before["cpu"]
    summary["isolated_post_scale"] = dict(
        what="[g.mul(sp) for g in this rank's partitions], alone, no collective: the work rescale adds",
        wall_ms_slowest_rank=round(1e3 * iso_wall, 3), cpu_ms_all_ranks=round(1e3 * iso_cpu, 3),
        share_of_before_wall=round(iso_wall / before_wall, 4), share_of_before_cpu=round(iso_cpu / before_cpu, 4),
        per_launch_wall_ms=[round(1e3 * x, 3) for x in isolated])
    scale_runs = b["sequence_parallel_size"] != 1
    allocations = [bk["allocations"][0] for bk in buckets]  # rank 0's
    alloc0 = allocations[0]
    a0 = alloc0["before"]
    summary["bytes_rank0"] = {}
    for n in impl_names:
        a = alloc0[n]
        summary["bytes_rank0"][n] = dict(allocated=a["bytes"], allocating_events=a["count"], peak=a["peak_bytes"],
                                         extra_vs_before=a["bytes"] - a0["bytes"],
                                         extra_events_vs_before=a["count"] - a0["count"],
                                         extra_peak_vs_before=a["peak_bytes"] - a0["peak_bytes"])
    summary["bytes_method"] = a0["method"]
    summary["analytic_extra_bytes_rank0"] = dict(
        rescale=buckets[-1]["partition_elements"][0] * b["itemsize"] if scale_runs else 0,
        rescale_new_tensors=b["bucket_params"] if scale_runs else 0, divisor=0, divisor_new_tensors=0,
        formula="sum over the bucket's parameters of this rank's partition elements x itemsize of the "
        "communication dtype (one g.mul(scale) output each); 0 for divisor (the scale is folded "
        "into the existing in-place pre-divide)")
    summary["allocations_same_in_every_launch"] = all(a == alloc0 for a in allocations)
    summary["checks"] = buckets[0]["checks"]
    summary["checks_same_in_every_launch"] = all(bk["checks"] == buckets[0]["checks"] for bk in buckets)
    return summary


def _row(*cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def _table(title: str, *head: str) -> list[str]:
    return [title, "", _row(*head), "|" + "---|" * len(head)]


def timing_markdown(rows: list[dict], impl_names: list[str]) -> str:
    others = [n for n in impl_names if n != "before"]
    out = []
    for metric, title in (("wall", "Wall time per call (slowest rank)"),
                          ("cpu", "CPU time per call (all ranks, all threads)")):
        lines = _table(f"{title}; ratios are per round, same bucket, random order each round:", "case", "precision",
                       "bucket (comm dtype)", *[f"{n} ms (median)" for n in impl_names],
                       *[f"{n}/before: paired median [p25, p75]; per launch" for n in others])
        for r in rows:
            cells = [
                r["case"], r["dtype"], f"{r['params']} x {r['numel_each']} ({r['bucket']['communication_dtype']})"
            ]
            cells += [f"{r[f'{metric}_ms'][n]['median']:.2f}" for n in impl_names]
            cells += [
                f"{q['median_paired']:.3f} [{q['p25']:.3f}, {q['p75']:.3f}]; " +
                ", ".join(f"{x:.3f}" for x in q["per_launch_ratio_of_medians"])
                for q in (r[f"{metric}_ratio_vs_before"][n] for n in others)
            ]
            lines.append(_row(*cells))
        out.append("\n".join(lines))
    lines = _table(
        "The rescale form's added work alone (`[g.mul(sp) for g in partitions]` on the same partitions, "
        "no collective), against the median unpatched call:", "case", "precision",
        "post-scale pass, ms (slowest rank)", "share of the call (wall)", "CPU ms (all ranks)",
        "share of the call (CPU)")
    for r in rows:
        iso = r["isolated_post_scale"]
        lines.append(f"| {r['case']} | {r['dtype']} | {iso['wall_ms_slowest_rank']:.3f} | "
                     f"{100 * iso['share_of_before_wall']:.2f}% | {iso['cpu_ms_all_ranks']:.3f} | "
                     f"{100 * iso['share_of_before_cpu']:.2f}% |")
    out.append("\n".join(lines))
    lines = _table("Extra memory allocated by one call on rank 0, against before:", "case", "precision", "method",
                   *[f"{n}: extra bytes measured / analytic, extra alloc events" for n in others])
    for r in rows:
        an, b = r["analytic_extra_bytes_rank0"], r["bytes_rank0"]
        cells = [
            f"{b[n]['extra_vs_before']} / {an.get(n, 0)} ({an.get(n + '_new_tensors', 0)} tensors), "
            f"{b[n]['extra_events_vs_before']:+d} events, peak {b[n]['extra_peak_vs_before']:+d}" for n in others
        ]
        lines.append(_row(r["case"], r["dtype"], r["bytes_method"], *cells))
    out.append("\n".join(lines))
    return "\n\n".join(out)


def _per_kind(launches: list[dict]):
    """(the row's layout, dtype and input kind; that kind's data) for every result of every numerics launch."""
    for launch in launches:
        for res in launch["results"]:
            for kind, data in res["kinds"].items():
                yield dict(world=launch["world_size"], sp=launch["sp"], dp=launch["dp"],
                           dtype=res["communication_dtype"], kind=kind), data


def numerics_rows(launches: list[dict]) -> list[dict]:
    return [{**head, "path": path, **st} for head, data in _per_kind(launches) for path, st in data["paths"].items()]


def numerics_flags(launches: list[dict]) -> list[dict]:
    flags = []
    for head, data in _per_kind(launches):
        pairs = data["bitwise_equal_all_ranks"].items()
        flags.append(head | {p: v for p, v in pairs if "contiguous" in p or ("rescale" in p and "divisor" in p)})
    return flags


def numerics_markdown(rows: list[dict], flags: list[dict]) -> str:
    lines = _table(
        "ULP errors in the communication format against the float64 oracle (sum over sp, mean over dp), "
        "over every rank's partition; max/mean over the elements whose oracle is not 0; 'oracle 0, path not' "
        "counts elements where the ranks' gradients cancel exactly and the path does not give 0.", "world", "sp", "dp",
        "comm dtype", "inputs", "path", "max ULP", "mean ULP", "exact", "<= 0.5 ULP", "oracle 0, path not", "scale")
    layout = ("world", "sp", "dp", "dtype", "kind")
    for r in rows:
        scale = "-" if r["scale"] is None else format(r["scale"], ".4g")
        lines.append(
            _row(*[r[k] for k in layout], r["path"], f"{r['max_ulp']:.3g}", f"{r['mean_ulp']:.3g}",
                 f"{100 * r['exact_fraction']:.1f}%", f"{100 * r['correctly_rounded_fraction']:.1f}%",
                 f"{r['zero_oracle_missed']}/{r['zero_oracle']}", scale))
    pairs = sorted({k for f in flags for k in f if "==" in k})
    lines += ["", *_table("Bitwise equal on every rank:", "world", "sp", "dp", "comm dtype", "inputs", *pairs)]
    lines += [_row(*[f[k] for k in layout], *["yes" if f.get(p) else "no" for p in pairs]) for f in flags]
    return "\n".join(lines)


def markdown(payload: dict) -> str:
    """reduce_path.md: the run's tables and its conclusion."""

    def run_line(info: dict) -> str:
        start, end = ("/".join(f"{x:.2f}" for x in load) if load else "?"
                      for load in (info["load_average_at_start"], info.get("load_average_at_end")))
        return (f"Run {info['started']}; load average (1/5/15 min) at start {start}, at end {end}; "
                f"{os.cpu_count()} CPUs.")

    md = ["# ZeRO-3 reduce path: cost and numerics of the sp fix", "", f"Tree: {payload['tree']}.", ""]
    if "timing" in payload:
        md += ["## Time of `__avg_scatter_grads` (2 ranks, sp=2, dp=1)", "", run_line(payload["timing_run"]), ""]
        md += [timing_markdown(payload["timing"], list(payload["timing"][0]["wall_ms"])), ""]
    if "numerics" in payload:
        md += ["## Numerics against the float64 oracle", "", run_line(payload["numerics_run"]), ""]
        md += [numerics_markdown(payload["numerics"], payload["numerics_bitwise"]), ""]
    return "\n".join(md + [payload["conclusion"], ""])


def driver_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--python", default=default_python(), help="interpreter with torch + the DeepSpeed to patch")
    add(
        "--patch", action="append", default=None, metavar="NAME=FILE",
        help="another implementation to time beside the installed one and 'divisor' (the fix "
        "patch of the installed release's series); repeatable")
    add(
        "--backend", choices=["gloo", "nccl", "auto"], default="auto",
        help="gloo: CPU ranks; nccl: one GPU per rank; auto: nccl when there is a GPU for every "
        "rank, else gloo (default auto)")
    add("--repeats", type=int, default=3, help="timing launches (default 3)")
    add("--warmup", type=int, default=5, help="warm-up rounds per launch and case")
    add("--iters", type=int, default=30, help="timed rounds per launch and case")
    add("--case", action="append", default=None, metavar="LABEL=COUNTxNUMEL",
        help=f"timing bucket (default {' '.join(DEFAULT_CASES)})")
    add("--timing-dtypes", default="fp32,bf16-model,bf16",
        help="precision settings timed (see _reduce_path_ranks.precision_overrides)")
    add("--numerics-dtypes", default="bf16,fp16,fp32",
        help="precisions whose gradients are compared with the oracle (default %(default)s)")
    add("--topology", action="append", default=None, metavar="WORLD:SP",
        help=f"numerics layouts (default {' '.join(DEFAULT_TOPOLOGIES)})")
    add("--no-aa-control", dest="aa_control", action="store_false",
        help=f"do not time the unpatched code a second time as '{AA}' (the A/A noise control)")
    add("--add-timing-launch", action="append", default=[], metavar="JSON",
        help="pool this saved timing launch report (reduce_path_launches/*/timing*.json) too")
    add("--skip-timing", action="store_true", help="measure the numerics only")
    add("--skip-numerics", action="store_true", help="measure the timing only")
    add("--keep-other", action="store_true",
        help="keep the skipped section (timing or numerics) from the existing --out file")
    add("--max-load", type=float, default=None,
        help="wait (up to --max-wait s) for the 1-minute load average to drop below this first")
    add("--max-wait", type=float, default=600.0,
        help="the longest wait for --max-load, s; then it times anyway (default %(default)s)")
    add("--timeout", type=float, default=900.0, help="per launch, s")
    add("--out", type=Path, default=None, help=f"JSON path (default {RESULTS}/reduce_path.json)")
    args = parser.parse_args(argv)

    env = environment(args.python)
    series = series_for_version(env.deepspeed)
    patches = {RECOMMENDED: series.fix_patches[0].path, **{n: Path(f) for n, f in map(_pair, args.patch or [])}}
    tree = (f"DeepSpeed {env.deepspeed} as installed, + patches/{series.name} (v{series.version}) "
            f"{series.fix_patches[0].file[:4]}")
    if "before" in patches:
        raise SystemExit("error: 'before' is the installed DeepSpeed; name the patches otherwise")
    backend = resolve_backend(args.backend, 2)
    waited = _wait_for_quiet(args.max_load, args.max_wait)
    out_path = args.out or RESULTS / "reduce_path.json"
    shown = {n: _shown(p) for n, p in patches.items()}
    payload: dict = dict(benchmark="reduce_path", environment=env, tree=tree, backend=backend,
                         waited_for_load_s=waited, patches=shown, recommended=RECOMMENDED,
                         target=dict(case=TARGET_CASE, max_ratio=TARGET))
    if args.keep_other and out_path.exists():
        # The section this run skips comes from the previous results file (e.g. timing rerun at a quieter moment).
        old = ReducePath.load(out_path).to_dict()
        for section, skipped in (("timing", args.skip_timing), ("numerics", args.skip_numerics)):
            if skipped:
                payload.update({k: v for k, v in old.items() if k.split("_")[0] == section and v is not None})

    def run_info() -> dict:
        return dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), load_average_at_start=os.getloadavg(),
                    waited_for_load_s=waited)

    with tempfile.TemporaryDirectory(prefix="reduce-path-impls-") as tmp:
        impls = prepare_impls(args.python, patches, Path(tmp))
        if args.aa_control:  # the unpatched code again, timed like the others: this machine's noise floor and bias
            impls = {"before": impls["before"], AA: impls["before"], **impls}
        names = payload["impls"] = list(impls)
        # Each launch's report is kept next to the results: a run cut short keeps what it measured.
        work = out_path.parent / "reduce_path_launches" / time.strftime("%Y%m%d-%H%M%S")
        payload["launch_reports"] = _shown(work)
        if not args.skip_timing:
            extra = ["--warmup", str(args.warmup), "--iters", str(args.iters), "--dtypes", args.timing_dtypes]
            extra += [a for case in args.case or DEFAULT_CASES for a in ("--case", case)]
            launches = [TimingLaunch.load(Path(f)) for f in args.add_timing_launch]
            payload["timing_run"] = run_info()
            for i in range(args.repeats):
                report = run_launch(args.python, "timing", 2, 2, backend, impls, work / f"timing{i}.json", extra,
                                    args.timeout)
                if report is not None:
                    launches.append(report)
                    print(
                        f"timing launch {i + 1}/{args.repeats}: {report.driver_wall_s} s, load "
                        f"{report.load_average_at_start[0]:.2f} -> {report.load_average_at_end[0]:.2f}", flush=True)
            payload["timing_run"].update(load_average_at_end=os.getloadavg(), launches=len(launches),
                                         failed_launches=args.repeats + len(args.add_timing_launch) - len(launches),
                                         added_launches=list(args.add_timing_launch))
            if not launches:
                raise SystemExit("error: no timing launch succeeded")
            raw = [lr.to_dict() for lr in launches]
            payload.update(timing=summarize_timing(raw, names), timing_launches=[_info(lr) for lr in raw],
                           timing_raw=launches)
        if not args.skip_numerics:
            launches, numerics_impls = [], {n: p for n, p in impls.items() if n != AA}
            payload["numerics_run"] = run_info()
            for topo in args.topology or DEFAULT_TOPOLOGIES:
                world, sp = (int(x) for x in topo.split(":"))
                backend_here = backend if backend == "gloo" or gpu_count() >= world else "gloo"
                report = run_launch(args.python, "numerics", world, sp, backend_here, numerics_impls,
                                    work / f"numerics-{world}-{sp}.json", ["--dtypes", args.numerics_dtypes],
                                    args.timeout)
                if report is None:
                    raise SystemExit(f"error: the numerics launch for world {world}, sp {sp} failed")
                launches.append(report.to_dict())
                print(f"numerics world {world} sp {sp}: {report.driver_wall_s} s", flush=True)
            payload["numerics_run"]["load_average_at_end"] = os.getloadavg()
            payload.update(numerics=numerics_rows(launches), numerics_bitwise=numerics_flags(launches),
                           numerics_launches=[_info(lr) for lr in launches])
    payload["load_average_at_end"] = os.getloadavg()
    ratio = recommended_ratio(payload)
    if "timing" in payload:
        payload["meets_target"] = ratio is None or ratio <= TARGET  # the worse dtype of the target case
    if ratio is not None:
        payload["after_over_before"] = round(ratio, 4)
        payload["paired_calls"] = min(r["wall_ratio_vs_before"][RECOMMENDED]["rounds"] for r in payload["timing"]
                                      if r["case"] == TARGET_CASE)
    conclusion = payload["conclusion"] = _conclusion(payload)
    path = write_result(ReducePath.model_validate(payload), out_path)
    md = markdown(payload)
    path.with_suffix(".md").write_text(md)
    print(md.split("\n", 4)[4])
    print(f"{conclusion}; {path}")
    print(f"tree: {tree}")
    # The last line, for scripts: the fix's time on many small parameters over the unpatched code's.
    print(f"after/before = {ratio:.4f}" if ratio is not None else "after/before = not measured (timing skipped)")
    return 0 if payload.get("meets_target", True) else 1


def _info(launch: dict) -> dict:
    """A launch's report without its measurements: who ran, where, how long."""
    return {k: launch[k] for k in LaunchInfo.model_fields}


def recommended_ratio(payload: dict) -> float | None:
    """The fix's worst-dtype median paired ratio on the target case."""
    ratios = [
        r["wall_ratio_vs_before"][RECOMMENDED]["median_paired"] for r in payload.get("timing") or []
        if r["case"] == TARGET_CASE and RECOMMENDED in r["wall_ratio_vs_before"]
    ]
    return max(ratios) if ratios else None


def _wait_for_quiet(max_load: float | None, max_wait: float) -> float:
    """Seconds waited (at most ``max_wait``) for the 1-minute load average to drop under ``max_load``."""
    if max_load is None:
        return 0.0
    start = time.monotonic()
    while os.getloadavg()[0] >= max_load and time.monotonic() - start < max_wait:
        time.sleep(10)
    return round(time.monotonic() - start, 1)


def _divisor_less_exact(numerics: list[dict]) -> list[str]:
    """The numerics rows (dtype, inputs, world, sp) where avg_scatter[divisor] is worse than avg_scatter[rescale] on
    any of the four measures: a higher max or mean ULP, a lower exact or correctly rounded fraction."""
    by_key: dict = {}
    for r in numerics:
        by_key.setdefault((r["world"], r["sp"], r["dtype"], r["kind"]), {})[r["path"]] = r
    worse = []
    for (world, sp, dtype, kind), paths in by_key.items():
        fix, var = paths.get("avg_scatter[rescale]"), paths.get("avg_scatter[divisor]")
        if fix and var and (any(var[k] > fix[k] for k in ("max_ulp", "mean_ulp"))
                            or any(var[k] < fix[k] for k in ("exact_fraction", "correctly_rounded_fraction"))):
            worse.append(f"{dtype} {kind} world={world} sp={sp}")
    return worse


def _conclusion(payload: dict) -> str:
    parts = []
    if "timing" in payload:
        verdicts = [
            f"{n} {r['dtype']} {q['median_paired']:.3f} (cpu {r['cpu_ratio_vs_before'][n]['median_paired']:.3f})"
            for r in payload["timing"] if r["case"] == TARGET_CASE for n, q in r["wall_ratio_vs_before"].items()
        ]
        parts.append(f"{TARGET_CASE} after/before: {', '.join(verdicts)} (target <= {TARGET} for "
                     f"{RECOMMENDED}, the recommended fix: {'OK' if payload['meets_target'] else 'MISSED'})")
    if "numerics_bitwise" in payload:
        exact = [f for f in payload["numerics_bitwise"] if f["kind"] == "exact"]

        def all_equal(key: str) -> str:
            bad = [f"{f['dtype']} sp={f['sp']} dp={f['dp']}" for f in exact if key in f and not f[key]]
            return "all" if not bad else "not " + ", ".join(bad)

        forms = [n for n in payload.get("impls", []) if n not in ("before", AA)]
        parts.append("exact inputs, bitwise equal to the contiguous path: " +
                     "; ".join(f"{n} {all_equal(f'contiguous==avg_scatter[{n}]')}" for n in forms))
        if "rescale" in forms:
            worse = _divisor_less_exact(payload.get("numerics", []))
            payload["divisor_at_least_as_exact_as_rescale"] = not worse
            parts.append("divisor at least as exact as rescale (max and mean ULP, exact and correctly rounded "
                         f"fractions) in every row: {'yes' if not worse else 'no: ' + ', '.join(worse)}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return launch_main(argv) if "--phase" in argv else driver_main(argv)


if __name__ == "__main__":
    sys.exit(main())
