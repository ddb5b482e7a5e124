"""PR.md: the pull-request description, rendered only from a bundle's own files.

Deterministic: the same bundle renders the same bytes, which is how ``bundle verify`` checks
that every number in PR.md is the one in the results it cites. Nothing here is typed by
hand that a run produced: ratios, counts, versions and environments are read from the
verdicts and reports under ``<bundle>/results/``; each table cites the files it read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

TITLE = "Scale ZeRO-3 __avg_scatter_grads by sequence_parallel_size"


ISSUE = 8692
# The description a reviewer reads on one screen ends here; the rest is folded.
FOLD = "<details><summary>Evidence: root cause, series, matrix, DeepSpeed's tests, ALST, audit, numerics, " \
    "environment</summary>"
MAX_HEAD_LINES = 60


def render_pr(bundle: Path) -> str:
    """A squash-ready GitHub pull-request description: one screen, then the evidence folded."""
    verdicts = _load_verdicts(bundle)
    head = [f"# {TITLE}\n", f"Fixes #{ISSUE}\n", _problem(), _fix(bundle), _behaviour(bundle),
            _how_tested(bundle, verdicts), _credits()]
    body = [_root_cause(), _series_section(bundle), _downstream(bundle), _reproduce(), _matrix(bundle, verdicts),
            _tests(bundle, verdicts), _affected(bundle)]
    body += [section(bundle) for section in EXTRA_SECTIONS]
    body += [_environment(verdicts), _evidence(bundle)]
    text = "\n".join(p for p in head if p).rstrip() + "\n\n" + FOLD + "\n\n"
    text += "\n".join(p for p in body if p).rstrip() + "\n\n</details>\n"
    return text


def head_lines(markdown: str) -> int:
    """How many lines PR.md shows before its first fold."""
    return markdown.split(FOLD, 1)[0].rstrip("\n").count("\n") + 1


def _problem() -> str:
    return """## Problem

With Ulysses sequence parallelism (`sequence_parallel_size` = sp > 1), gradients are summed over
the sp ranks and averaged over the dp ranks: ZeRO-0/1/2 and ZeRO-3's contiguous path do so.
ZeRO-3's `__avg_scatter_grads` averages over sp x dp instead, so every bucket it reduces comes out
`1/sp` too small: with the default `reduce_scatter=True`, with `contiguous_gradients=False`, and
for any parameter larger than `reduce_bucket_size` (one model then trains at two scales). Since
v0.11.2 (ec029e7625ae, #4530).
"""


def _fix(bundle: Path) -> str:
    manifest = _read_toml(bundle / "patches" / "series.toml")
    master = next((s for s in manifest.get("series", []) if s["name"] == "master"), None)
    if master is None:
        return ""
    what = {"fix": "divides the averaging world size by `sequence_parallel_size` in `__avg_scatter_grads`, as "
                   "the contiguous path does, and adds the capability flag "
                   "`deepspeed.runtime.zero.stage3.ZERO3_SP_GRADIENTS_SUMMED = True`",
            "test": "`TestZero3SequenceParallelGradientScale`: four ZeRO-3 configs, 2 ranks (sp=2) and 4 ranks "
                    "(sp=2 x dp=2), plus an sp=2 case of the AutoEP reduce-scatter unit test",
            "companion": "the ALST / Ulysses-HF test and tutorial backprop each rank's own loss share (their "
                         "recipe relied on the bug)"}
    lines = [f"## The fix (series v{master['version']}, on `{master['base_commit'][:12]}`)", ""]
    for p in master["patches"]:
        lines.append(f"* {_patch_subject(bundle / 'patches' / 'master' / p['file'])}: {what.get(p['role'], '')}")
    backports = [s for s in manifest.get("series", []) if s["name"] != "master"]
    if backports:
        low = min(s["min_version"] for s in backports)
        lines += ["", f"Backports for every release from {low} on: {len(backports)} series in `patches/` "
                  "(table in the evidence below)."]
    return "\n".join(lines) + "\n"


def _behaviour(bundle: Path) -> str:
    notice = "[downstream-notice.md](downstream-notice.md)" if (bundle / "downstream-notice.md").exists() \
        else "the downstream notice"
    return f"""## Behaviour change: release note needed

Under ZeRO-3 with sp > 1 those gradients become sp times larger, equal to ZeRO-1/2's. Loss code
that backprops a loss gathered over the sp group with the differentiable all_gather (the ALST
tutorial, transformers 5.0-5.24, ArcticTraining) was right on ZeRO-3 only by this bug, and now
gets sp times the gradient there, as it already does on ZeRO-1/2. transformers 5.25 multiplies
the ZeRO-3 loss by sp for `deepspeed < 0.20.2`: this fix must ship in 0.20.2, or that gate must
move to the release that has it; clients that must also serve backports test
`ZERO3_SP_GRADIENTS_SUMMED` instead of the version. Who must change what, measured with each
client's own code: {notice}.
"""


def _how_tested(bundle: Path, verdicts: dict[str, dict[str, Any]]) -> str:
    """The counts that decide the review, each rendered from a result file in the bundle."""
    lines = ["## How it was tested", "",
             "CPU only (gloo), real DeepSpeed processes and collectives; every number below "
             "is rendered from a file in this bundle."]
    cells = {env: v for env, v in verdicts.items() if env.startswith("patch-and-test-ds")}
    ran = sorted((v for v in cells.values() if v.get("before") or v.get("after")), key=_version_key)
    if ran:
        outcomes = sorted({v["outcome"] for v in ran})
        count = f"{len(ran)} cell{'s' if len(ran) != 1 else ''}"
        lines.append(f"* Reproducers (2 ranks, sp=2), unpatched → patched, {count} "
                     f"({', '.join(_cell_label(v) for v in ran)}): {', '.join(outcomes)}.")
    not_run = sorted((v for v in cells.values() if not (v.get("before") or v.get("after"))), key=_version_key)
    if not_run:
        lines.append(f"* Not run here: {', '.join(_cell_label(v) for v in not_run)} "
                     f"({not_run[0].get('error') or not_run[0]['outcome']}).")
    # One line per test name, whatever the number of cells: the screen stays one screen.
    by_test: dict[str, list[str]] = {}
    for v in ran:
        for t in v.get("tests", []):
            counts = ", ".join(f"{n} {k}" for k, n in _counts(t["outcomes"]).items() if n) or "nothing ran"
            by_test.setdefault(t["name"], []).append(f"{_cell_label(v)}: {counts}")
    for name, results in by_test.items():
        lines.append(f"* {name}, with the series: {'; '.join(results)}.")
    affected = [(name, data, data.get("suite") or {}) for name, data in _affected_results(bundle)]
    if affected:
        trees = ", ".join(f"{name} {data.get('version') or ''}".strip() for name, data, _ in affected)
        regressions = sum(len(s.get("regressions", [])) for _, _, s in affected if s)
        errors = [name for name, data, s in affected if not s or s.get("status") == "error"]
        new = sum(sum(1 for r in s["results"] if r["category"] == "new") for _, _, s in affected if s)
        before = sum(s["collected_before"] for _, _, s in affected if s)
        lines.append(f"* DeepSpeed's own tests the series can reach ({affected[0][2].get('tier', '?')} tier; "
                     f"{trees}): {before} tests before, {new} new with the series, {regressions} regressions"
                     + (f", errors on {', '.join(errors)}" if errors else "") + " (table below).")
    lines.append("* CONTRIBUTING.md: every commit signed off (DCO); DeepSpeed's pre-commit rules (yapf, flake8, "
                 "codespell, license header) clean on every touched file (`tox -e upstream-lint`).")
    rows = _downstream_rows(bundle)
    if rows:
        held = sum(1 for r in rows if r["matches_rule"])
        lines.append(f"* Downstream clients' own loss code on DeepSpeed unpatched and patched: {held} of {len(rows)} "
                     "measured gradients as the rule in the notice predicts.")
    return "\n".join(lines) + "\n"


def _credits() -> str:
    return """## Credits

@alanhuangyoo reported #8692, diagnosed the gap between the two reduce paths (the mixed-bucket case
included) and wrote the 2-rank reproducers the regression test follows (`Reported-by:`).
@Eliaaazzz pointed to #4530 and `_reduce_non_expert_gradients` for the convention: sum over sp,
average over dp. The fix is the one proposed upstream for #8692.
"""


def _affected_results(bundle: Path) -> list[tuple[str, dict[str, Any]]]:
    """(tree name, affected.json) of every affected-tests run kept in the bundle."""
    return affected_results(bundle / "results" / "affected")


def affected_results(root: Path) -> list[tuple[str, dict[str, Any]]]:
    """(tree name, affected.json) under ``root``: master first, then the newest tree first."""
    found = [(p.parent.name, json.loads(p.read_text())) for p in sorted(root.glob("*/affected.json"))]
    return sorted(found, key=lambda f: (f[0] != "master", [-n for n in _num_key(f[1].get("version") or "")]))


def affected_table(found: list[tuple[str, dict[str, Any]]], link_root: str) -> str:
    """Per tree: the selection's tests before and after the series, and the pre-existing failures' reasons."""
    lines = ["| tree | tier | files | tests before / after | before | after | regressions | pre-existing | fixed | "
             "new | flaky | wall before / after | result |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    reasons: dict[str, set[str]] = {}
    for name, data in found:
        s = data.get("suite") or {}
        link = f"[{data.get('outcome')}]({link_root}/{name}/affected.json)"
        if not s:
            lines.append(f"| {name} | | | | | | | | | | | | {link}: {data.get('error')} |")
            continue
        new = sum(1 for r in s["results"] if r["category"] == "new")
        version = f" {data['version']}" if data.get("version") else ""
        lines.append(f"| {name}{version} (`{(data.get('base') or '')[:12]}`) | {s['tier']} | {len(s['files'])} | "
                     f"{s['collected_before']} / {s['collected_after']} | {_fmt_counts(s['before'])} | "
                     f"{_fmt_counts(s['after'])} | {len(s['regressions'])} | {len(s['pre_existing'])} | "
                     f"{len(s['fixed'])} | {new} | {len(s['flaky'])} | {s['wall_s_before']:.0f} s / "
                     f"{s['wall_s_after']:.0f} s | {link} |")
        for r in s["results"]:
            if r["category"] in ("pre-existing", "regression", "flaky"):
                reasons.setdefault(f"{r['category']}: `{r['test']}`: {r['reason']}", set()).add(name)
        for path, why in sorted((s.get("not_collectable") or {}).items()):
            reasons.setdefault(f"not collectable: `{path}`: {why}", set()).add(name)
    if reasons:
        lines += ["", "Every test that did not pass both times, with its reason and the trees it failed on:", ""]
        lines += [f"* {what} ({', '.join(sorted(trees))})" for what, trees in sorted(reasons.items())]
    return "\n".join(lines)


def _affected(bundle: Path) -> str:
    """Per tree: the selection's tests before and after the series (patch_and_test.affected_job)."""
    found = _affected_results(bundle)
    if not found:
        return ""
    return "\n".join([
        "## DeepSpeed's own tests the series can reach", "",
        "`python -m patch_and_test.affected_job`: the test files the series' diffs can reach (rule in "
        "`docs/affected-tests.md`), run before and after `git am` on the same tree; a passed-before, "
        "failed-after test is rerun before it counts as a regression.", "",
        affected_table(found, "results/affected")]) + "\n"


def _downstream_rows(bundle: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((bundle / "results" / "downstream").glob("*/*/downstream_clients.json")):
        rows += [r for r in json.loads(path.read_text()).get("rows", []) if r.get("status") == "measured"]
    return rows


def _alst(bundle: Path) -> str:
    """The ALST recipe reproducer, before and after, in every cell that ran it."""
    rows = []
    for env, v in sorted(_load_verdicts(bundle).items(), key=lambda kv: _version_key(kv[1])):
        for phase in ("before", "after"):
            for check in v.get(phase, []):
                if check.get("script") != "alst_recipe":
                    continue
                report = _report(bundle, check)
                if report is None:
                    continue
                ratios: dict[tuple[str, int], list[float]] = {}
                for r in report["rows"]:
                    ratios.setdefault((r["recipe"], r["stage"]), []).append(r["ratio"])
                cells = [_ratio_span(ratios.get((recipe, stage), [])) for recipe in ("allgather", "own_share")
                         for stage in (2, 3)]
                rows.append(f"| [{_cell_label(v)} {phase}]({_rel(bundle, check['report'])}) | "
                            f"{report['deepspeed_version']} | {' | '.join(cells)} | {check['pattern']} |")
    if not rows:
        return ""
    return "\n".join([
        "## The ALST / Ulysses-HF loss recipe (why patch 3 exists)", "",
        "`repro/alst_recipe.py`: a tiny Llama sharded with DeepSpeed's `UlyssesSPAttentionHF` / "
        "`UlyssesSPDataLoaderAdapter`, sp=2, ratio of DeepSpeed's full gradient to a non-sp baseline of "
        "the same sample (min-max over four parameters). `allgather` is the recipe of DeepSpeed's tutorial "
        "and `TestUlyssesSPHF` (the loss gathered with the differentiable all_gather, whose backward sums "
        "over the sp ranks); `own_share` backprops each rank's token-weighted share. The unpatched ZeRO-3 "
        "hides the recipe's sp-fold count; with the fix ZeRO-3 agrees with ZeRO-2, so the recipe itself "
        "must change (the companion patch).", "",
        "| run | DeepSpeed | allgather ZeRO-2 | allgather ZeRO-3 | own_share ZeRO-2 | own_share ZeRO-3 | pattern |",
        "|---|---|---|---|---|---|---|", *rows]) + "\n"


def _ratio_span(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return _ratio(lo) if round(lo, 4) == round(hi, 4) else f"{_ratio(lo)}-{_ratio(hi)}"


def _audit(bundle: Path) -> str:
    """The parity audit's counts per cell, before and after, and the known upstream discrepancies."""
    rows, known, writeups = [], {}, {}
    for env, v in sorted(_load_verdicts(bundle).items(), key=lambda kv: _version_key(kv[1])):
        for phase in ("before", "after"):
            for check in v.get(phase, []):
                if check.get("script") != "parity_audit":
                    continue
                report = _report(bundle, check)
                if report is None:
                    continue
                c = report["summary"]["counts"]
                layouts = ", ".join(f"{t['sp']}x{t['dp']}" for t in report.get("topologies", []))
                rows.append(f"| [{_cell_label(v)} {phase}]({_rel(bundle, check['report'])}) | "
                            f"{report.get('mode', '?')} | {layouts} | {check['expect']} | "
                            f"{'holds' if check['exit_code'] == 0 else 'DOES NOT HOLD'} | {c['points']} | "
                            f"{c['rejected']} | {c['match']} | {c['sp_bug']} | {c['known']} | {c['unexplained']} |")
                for kid, n in (report["summary"].get("known_points") or {}).items():
                    if n:
                        known.setdefault(kid, set()).add(_cell_label(v).split()[0])
                writeups.update({k["id"]: k.get("writeup", "") for k in report.get("known", [])})
    if not rows:
        return ""
    lines = ["## Parity audit", "",
             "`repro/parity_audit.py`: every ZeRO stage, reduce path, bucket size, fp32/bf16, gradient accumulation "
             "1/2 and the predivide/prescale knobs, on the sp x dp layouts listed per run, each point's full gradient "
             "against one plain-torch oracle. `at 1/sp`: points whose gradients went through `__avg_scatter_grads` "
             "with sp > 1 at 1/sp (this bug); `known`: documented upstream discrepancies (write-ups in "
             "`upstream-candidates/`).", "",
             "| run | mode | sp x dp | expect | | points | rejected | match | at 1/sp | known | unexplained |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *rows]
    if known:
        lines += ["", "Known upstream discrepancies the audit hit (not this bug; candidate upstream issues):", ""]
        for kid in sorted(known):
            # The write-up the audit's known list names for this entry (docs/upstream-candidates/ in the repo).
            doc = f"upstream-candidates/{Path(writeups.get(kid) or kid + '.md').name}"
            link = f"[`{kid}`]({doc})" if (bundle / doc).exists() else f"`{kid}`"
            lines.append(f"* {link}: DeepSpeed {', '.join(sorted(known[kid], key=_num_key))}")
    return "\n".join(lines) + "\n"


def _num_key(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _numerics(bundle: Path) -> str:
    """Cost and numerics of the reduce path (benchmarks/reduce_path.py), where it ran."""
    path = bundle / "results" / "benchmarks" / "reduce_path.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    rel = _rel(bundle, path)
    # The forms of the fix are named by the run; "recommended" is the master series' patch 1.
    recommended = data.get("recommended", "divisor")
    forms = [recommended] + sorted(n for n in data.get("patches", {}) if n != recommended)
    lines = ["## Cost and numerics of the fix", ""]
    timing = data.get("timing") or []
    if timing:
        impls = [n for n in ("before-again", *forms) if n in timing[0].get("wall_ratio_vs_before", {})]
        lines += [f"Time of `__avg_scatter_grads` inside a real ZeRO-3 engine's backward, 2 ranks, sp=2, gloo on CPU "
                  f"([{rel}]({rel})): median of the per-round paired wall-time ratios to the unpatched code "
                  f"(`before-again` times the unpatched code twice: the noise floor). Target for `{recommended}` "
                  f"(the recommended fix): <= {data.get('target', {}).get('max_ratio', '?')} on "
                  f"`{data.get('target', {}).get('case', '?')}`.", "",
                  "| case | dtype | " + " | ".join(impls) + " | " +
                  " | ".join(f"extra bytes, rank 0 ({n})" for n in forms) + " |",
                  "|---|---|" + "---|" * (len(impls) + len(forms))]
        for row in timing:
            ratios = row["wall_ratio_vs_before"]
            extra = row.get("analytic_extra_bytes_rank0", {})
            lines.append(f"| {row['case']} ({row['params']} x {row['numel_each']}) | {row['dtype']} | "
                         + " | ".join(f"{ratios[n]['median_paired']:.4f}" for n in impls) + " | "
                         + " | ".join(str(extra.get(n, "-")) for n in forms) + " |")
        lines.append("")
    else:
        lines += ["Timing: not measured in this bundle (`python benchmarks/reduce_path.py` on a quiet machine).", ""]
    lines += ["Numerics: max ULP error against a float64 oracle in the communication dtype, per path, for "
              "random inputs; the last columns say whether each fixed `__avg_scatter_grads` is bitwise equal "
              "to the contiguous path on exactly representable inputs.", "",
              "| world | sp | dtype | before | " + " | ".join(forms) + " | contiguous | " +
              " | ".join(f"{n} == contiguous (exact inputs)" for n in forms) + " |",
              "|---|---|---|---|" + "---|" * (2 * len(forms) + 1)]
    ulp = {(n["world"], n["sp"], n["dtype"], n["kind"], n["path"]): n["max_ulp"] for n in data.get("numerics", [])}
    bitwise = {(b["world"], b["sp"], b["dtype"], b["kind"]): b for b in data.get("numerics_bitwise", [])}
    for world, sp, dtype in sorted({(k[0], k[1], k[2]) for k in ulp}):
        def cell(p):
            value = ulp.get((world, sp, dtype, "random", p))
            return "-" if value is None else f"{value:g}"

        flags = bitwise.get((world, sp, dtype, "exact"), {})
        eq = [flags.get(f"contiguous==avg_scatter[{n}]") for n in forms]
        lines.append(f"| {world} | {sp} | {dtype} | {cell('avg_scatter[before]')} | "
                     + " | ".join(cell(f"avg_scatter[{n}]") for n in forms) + f" | {cell('contiguous')} | "
                     + " | ".join("-" if e is None else str(e) for e in eq) + " |")
    if data.get("conclusion"):
        lines += ["", f"Benchmark's conclusion: {data['conclusion']}"]
    return "\n".join(lines) + "\n"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _pytest_summary(text: str) -> tuple[str, list[str]]:
    """The counts of a pytest log's final line, and the tests it lists as FAILED."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    summary = next((m.group(1) for line in reversed(lines)
                    for m in [re.match(r"^=+ (.* in [\d.]+s.*?) =+$", line.strip())] if m), "no summary line")
    counts = re.sub(r"\s*in [\d.]+s.*$", "", summary)
    counts = ", ".join(part for part in counts.split(", ") if "warning" not in part and "deselected" not in part)
    failed = sorted({m.group(1) for line in lines for m in [re.match(r"^FAILED (\S+)", line.strip())] if m})
    return counts, failed


def _upstream_logs(bundle: Path) -> str:
    """DeepSpeed's own tests, run by hand on real checkouts of the mirror (their logs are in the bundle)."""
    logs = sorted((bundle / "results" / "upstream").glob("*.log"))
    if not logs:
        return ""
    lines = ["## DeepSpeed's own tests on real checkouts", "",
             "`PYTHONPATH=.:$PWD/tests DS_ACCELERATOR=cpu LOCAL_SIZE=2 pytest ...` on checkouts of the mirror "
             "(tag or master) with: the whole series (`fixed`, `fix-plus-companion`), patch 1 only (`fix-only`), the "
             "test patch only (`testonly`), or nothing (`unfixed`). Each log starts with the "
             "branch and commits it ran on.", "", "| log | result | failed |", "|---|---|---|"]
    for log in logs:
        counts, failed = _pytest_summary(log.read_text(errors="replace"))
        shown = "<br>".join(f"`{t.split('::', 1)[-1]}`" for t in failed) or "-"
        rel = _rel(bundle, log)
        lines.append(f"| [{log.stem}]({rel}) | {counts} | {shown} |")
    return "\n".join(lines) + "\n"


# The checks beyond the reproducers, each a function of the bundle path returning markdown, or ""
# when its results are absent.
EXTRA_SECTIONS: list[Callable[[Path], str]] = [_upstream_logs, _alst, _audit, _numerics]


def _load_verdicts(bundle: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted((bundle / "results").glob("*/verdict.json")):
        out[path.parent.name] = json.loads(path.read_text())
    return out


def _rel(bundle: Path, path: str | Path) -> str:
    """A result's path inside the bundle (verdicts store the paths of the run that wrote them)."""
    p = Path(path)
    parts = p.parts
    if "results" in parts:
        i = len(parts) - 1 - parts[::-1].index("results")
        return Path(*parts[i:]).as_posix()
    try:
        return p.relative_to(bundle).as_posix()
    except ValueError:
        return p.as_posix()


def _root_cause() -> str:
    return """## Root cause

`DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads`
(`deepspeed/runtime/zero/stage3.py`) reduces a bucket on one of two paths:

* `__avg_scatter_contiguous_grads` (contiguous gradients, no reduce-scatter, bucket fits):
  divides by `averaging_world_size / sequence_parallel_size`, then all-reduces: right.
* `__avg_scatter_grads` (otherwise): `reduce_scatter_coalesced`
  (`deepspeed/runtime/comm/coalesced_collectives.py`) pre-divides by the partition group's size,
  i.e. all `sp x dp` ranks, and nothing multiplies by `sp` afterwards: `1/sp` too small.

Commit ec029e7625ae ("Fix the sequence-parallelism for the dense model architecture (#4530)",
v0.11.2) added the `sequence_parallel_size` divisor to the contiguous path and to
`allreduce_bucket`, not to `__avg_scatter_grads`.
"""


def _series_section(bundle: Path) -> str:
    manifest = _read_toml(bundle / "patches" / "series.toml")
    lines = ["## The series", "",
             "| series | DeepSpeed versions | made on | patches |", "|---|---|---|---|"]
    for s in manifest.get("series", []):
        subjects = []
        for p in s["patches"]:
            subjects.append(f"{_patch_subject(bundle / 'patches' / s['name'] / p['file'])} ({p['role']})")
        lines.append(f"| `{s['name']}` v{s['version']} | >={s['min_version']},<{s['below_version']} | "
                     f"{s['base_ref']} `{s['base_commit'][:12]}` | {'<br>'.join(subjects)} |")
    lines += ["", "Each series applies with plain `git am` to its base and to every release in its range; its fix "
              "patch also applies to the PyPI sdists (which carry no `tests/`).", ""]
    return "\n".join(lines)


def _patch_subject(path: Path) -> str:
    if not path.exists():
        return path.name
    text = path.read_text(errors="replace")
    m = re.search(r"^Subject: (.*(?:\n .*)*)", text, re.M)
    subject = re.sub(r"\s+", " ", m.group(1)) if m else path.name
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)


def _downstream(bundle: Path) -> str:
    notice = bundle / "downstream-notice.md"
    if not notice.exists():
        return ""
    body = notice.read_text().strip()
    body = re.sub(r"^#+ .*\n+", "", body, count=1)  # the file's own title
    return "## Downstream impact\n\n" + _demote_headings(body) + "\n"


def _demote_headings(markdown: str) -> str:
    """One level down, so an included document's sections nest under ours (code blocks untouched)."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" + line if not fenced and re.match(r"#+ ", line) else line)
    return "\n".join(out)


def _reproduce() -> str:
    return """## How to reproduce

```bash
pip install "tox>=4.11" "tox-uv>=1.11"
tox -e patch-and-test      # DeepSpeed 0.19.8 from PyPI: bug before, series applied, fixed after
```

Or on any DeepSpeed with torch installed, without the package's tooling:

```bash
python repro/zero3_sp_grad_scale.py --expect buggy   # exit 0 on unpatched DeepSpeed (1 once fixed)
python repro/zero3_sp_grad_scale.py                  # --expect fixed: exit 0 with the series applied
```
"""


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


GRAD_SCALE_SCRIPTS = ("zero3_sp_grad_scale", "zero3_sp_mixed_bucket")


def _report(bundle: Path, check: dict[str, Any]) -> dict[str, Any] | None:
    if not check.get("report"):
        return None
    path = bundle / _rel(bundle, check["report"])
    return json.loads(path.read_text()) if path.exists() else None


def _report_rows(bundle: Path, check: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    if not check.get("report") or check.get("script") not in GRAD_SCALE_SCRIPTS:
        return {}
    path = bundle / _rel(bundle, check["report"])
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {(check["script"], r["config"], r["param"]): r["ratio"] for r in data["rows"]}


def _matrix(bundle: Path, verdicts: dict[str, dict[str, Any]]) -> str:
    cells = {env: v for env, v in verdicts.items() if env.startswith("patch-and-test-ds")}
    if not cells:
        return ""
    ran = {env: v for env, v in cells.items() if v.get("before") or v.get("after")}
    skipped = {env: v for env, v in cells.items() if env not in ran}
    lines = ["## Compatibility matrix", ""]
    if ran:
        envs = sorted(ran, key=lambda e: _version_key(ran[e]))
        table: dict[tuple[str, str, str], dict[str, str]] = {}
        for env in envs:
            before = {k: r for c in ran[env]["before"] for k, r in _report_rows(bundle, c).items()}
            after = {k: r for c in ran[env]["after"] for k, r in _report_rows(bundle, c).items()}
            for key in sorted(set(before) | set(after), key=lambda k: (k[0], _config_order(k[1]), k[2])):
                table.setdefault(key, {})[env] = f"{_ratio(before.get(key))} → {_ratio(after.get(key))}"
        header = [f"[{_cell_label(ran[e])}]({_rel(bundle, Path('results') / e / 'verdict.json')})" for e in envs]
        lines += ["Ratio of DeepSpeed's full gradient to the oracle (sum over sp, mean over dp), sp=2, 2 ranks: "
                  "unpatched → with the series. Each column links to its verdict; the numbers are in its "
                  "`before/` and `after/` reports.", "",
                  "| reproducer | config | param | " + " | ".join(header) + " |",
                  "|---|---|---|" + "---|" * len(envs)]
        for (script, config, param), row in sorted(table.items(),
                                                   key=lambda kv: (kv[0][0], _config_order(kv[0][1]), kv[0][2])):
            lines.append(f"| {script} | {config} | {param} | " + " | ".join(row.get(e, "-") for e in envs) + " |")
        lines += ["", "| cell | outcome | DeepSpeed | series |", "|---|---|---|---|"]
        for env in envs:
            v = ran[env]
            lines.append(f"| {_cell_label(v)} | {v['outcome']} (exit {v['exit_code']}) | "
                         f"{v.get('deepspeed_before')} → {v.get('deepspeed_after')} | "
                         f"{(v.get('series') or {}).get('name')} |")
    if skipped:
        lines += ["", "Not run here:", ""]
        for env in sorted(skipped, key=lambda e: _version_key(skipped[e])):
            v = skipped[env]
            lines.append(f"* {_cell_label(v)}: {v['outcome']}: {v.get('error') or 'no result'}")
    return "\n".join(lines) + "\n"


def _version_key(verdict: dict[str, Any]) -> tuple:
    version = (verdict.get("source") or {}).get("version") or verdict.get("env", "")
    nums = tuple(int(x) for x in re.findall(r"\d+", str(version))[:3])
    return nums, verdict.get("backend", "")


def _cell_label(verdict: dict[str, Any]) -> str:
    m = re.search(r"ds([\d.]+)-(\w+)$", verdict.get("env", ""))
    return f"{m.group(1)} {m.group(2)}" if m else verdict.get("env", "?")


_ORDER = ["zero1", "zero2", "zero3 rs=False cg=True bucket=500", "zero3 rs=False cg=False bucket=500",
          "zero3 rs=True cg=True bucket=500", "zero3 rs=False cg=True bucket=16"]


def _config_order(config: str) -> int:
    return _ORDER.index(config) if config in _ORDER else len(_ORDER)


def _tests(bundle: Path, verdicts: dict[str, dict[str, Any]]) -> str:
    rows = []
    for env, v in sorted(verdicts.items(), key=lambda kv: _version_key(kv[1])):
        for t in v.get("tests", []):
            counts = ", ".join(f"{n} {k}" for k, n in _counts(t["outcomes"]).items() if n) or "nothing ran"
            rows.append(f"| {_cell_label(v)} | {t['name']} | {counts} | [junit]({_rel(bundle, t['junit'])}) |")
        for s in v.get("suites", []):
            tier = f" [{s['tier']} tier, {len(s['files'])} files]" if "tier" in s else ""
            times = (f"; {s['wall_s_before']:.0f} s → {s['wall_s_after']:.0f} s" if "wall_s_before" in s else "")
            rows.append(f"| {_cell_label(v)} | {s['name']}{tier} (before → after) | {_fmt_counts(s['before'])} → "
                        f"{_fmt_counts(s['after'])}; regressions {len(s['regressions'])}, "
                        f"pre-existing failures {len(s['pre_existing'])}, flaky {len(s.get('flaky', []))}{times} | "
                        f"[after]({_rel(bundle, Path('results') / env / 'after')}) |")
    if not rows:
        return ""
    lines = ["## Tests run", "", "With the series applied (the twin is the package's copy of the upstream test, "
             "run against the installed DeepSpeed; the upstream tests ran where the source is a checkout).", "",
             "| cell | test | result | file |", "|---|---|---|---|", *rows]
    pre = sorted({t for v in verdicts.values() for s in v.get("suites", []) for t in s["pre_existing"]})
    if pre:
        lines += ["", "Pre-existing failures (fail with and without the series; not ours):", ""]
        lines += [f"* `{t}`" for t in pre]
    return "\n".join(lines) + "\n"


def _counts(outcomes: dict[str, str]) -> dict[str, int]:
    keys = ("passed", "failed", "error", "skipped")
    return {k: sum(1 for o in outcomes.values() if o == k) for k in keys}


def _fmt_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none"


def _environment(verdicts: dict[str, dict[str, Any]]) -> str:
    envs = {}
    for v in verdicts.values():
        e = v.get("environment") or {}
        key = (e.get("os"), e.get("python"), e.get("torch"), e.get("machine"), e.get("cpus"), e.get("gpus"))
        envs.setdefault(key, set()).add(v.get("backend"))
    if not envs:
        return ""
    lines = ["## Environment", "", "| OS | Python | torch | CPU | cores | GPUs | backends |",
             "|---|---|---|---|---|---|---|"]
    for (os_, py, torch, machine, cpus, gpus), backends in sorted(envs.items(), key=str):
        lines.append(f"| {os_} | {py} | {torch} | {machine} | {cpus} | {gpus} | {', '.join(sorted(backends))} |")
    return "\n".join(lines) + "\n"


def _evidence(bundle: Path) -> str:
    files = sorted(p.relative_to(bundle).as_posix() for p in (bundle / "results").rglob("*.json"))
    if not files:
        return ""
    return "## Evidence\n\nEvery number above comes from these files (`MANIFEST.sha256` has their hashes):\n\n" + \
        "\n".join(f"* `{f}`" for f in files) + "\n"


def _read_toml(path: Path) -> dict[str, Any]:
    from repro.harness.files import load_toml

    return load_toml(path) if path.exists() else {}
