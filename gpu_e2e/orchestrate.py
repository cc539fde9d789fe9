"""GPU side: unpack the bundle, run every (release, size, variant) in a fresh process, compare.

    cd BUNDLE && PYTHONPATH=e2e python3 -m pk_gpu_e2e.orchestrate --out "$OUT"

Writes (all under ``--out``, so they come back even when the call is cut short):
``results.json`` (every run, rewritten after each), ``table.md``, ``settings.md``
(what each engine ran with, read back: :mod:`.engine_facts`) and ``engine.log``
(every engine's own output, one after the other).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import (
    bundle_kernels,
    call_verdict,
    dp,
    engine_env,
    engine_facts,
    fa3_kernel,
    issue23_report,
    launch,
    mirror_control,
    rank_report,
    ranks,
    report,
    sites,
    wait_report,
)
from .call_options import _schedule, _setting, _variant, parser
from .unpack import log, prepare_trees, unpacked_site


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    asked_env = engine_env.parse(args.engine_env)
    gpus = ranks.gpus_visible() if args.tp > 1 else None
    if args.tp > 1 and (gpus or 0) < args.tp:
        raise SystemExit(f"--tp {args.tp}: nvidia-smi lists {gpus} GPU(s)")

    bundle = Path(args.bundle).resolve()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    manifest = json.loads((bundle / "manifest.json").read_text())
    releases = args.releases.split(",") if args.releases else sorted(manifest["releases"], reverse=True)

    t0 = time.perf_counter()
    site_common = unpacked_site(bundle, "common", work)
    log(f"site unpacked in {time.perf_counter() - t0:.0f} s")
    for member in bundle_kernels.install(args.kernels or bundle, site_common):
        log(f"{member} installed from {args.kernels or bundle} (sha256 checked)")

    mem_fraction = args.mem_fraction_static or (0.25 if args.scenario == "standalone" else 0.6)
    results_path = out / "results.json"
    engine_log = out / "engine.log"
    all_results: dict = {
        "device": _device(),
        "manifest_created": manifest.get("created"),
        "patchkit_commit": manifest.get("patchkit_commit"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "runs": {},
        "rows": [],
        "problems": [],
        "trees": {},
        "rank_rows": [],
        "notes": [],
    }

    for release in releases:
        info = manifest["releases"][release]
        site_rel = unpacked_site(bundle, release, work)
        if args.fa3_lib is not None:  # beside the sgl_kernel this release imports (0.5.13: its own pin)
            kernel_site = site_rel if (site_rel / "sgl_kernel").is_dir() else site_common
            fa3 = fa3_kernel.install(args.fa3_lib, kernel_site)
            log(
                f"FA3 kernels installed from {args.fa3_lib} into {kernel_site.name} "
                f"(sglang-kernel {fa3['sglang_kernel']}, sha256 checked)"
            )
        trees = prepare_trees(bundle, release, work / "trees")
        overlay = bundle / "trees" / release / "overlay.json"
        all_results["trees"][release] = {
            "runtime_mode": info["runtime_mode"],
            "patched_files_sha256": json.loads(overlay.read_text()) if overlay.exists() else {},
            # every other tree the bundle carries (minus-ID, an earlier patchkit's): its files' sha256
            "variant_files_sha256": {
                p.name[len("overlay-") : -len(".json")]: json.loads(p.read_text())
                for p in sorted(overlay.parent.glob("overlay-*.json"))
            },
        }
        variants = list(trees) if "upstream" in trees else (["patched"] if args.alternate else args.variants.split(","))
        unknown = [v for v in variants if _variant(v, "")[0] not in trees]
        if unknown:
            raise SystemExit(f"{release}: no tree for variant(s) {', '.join(unknown)} (trees: {', '.join(trees)})")
        pair = (
            tuple(args.compare.split(","))
            if args.compare
            else (("pristine", "patched") if {"pristine", "patched"} <= set(variants) else tuple(variants[:2]))
        )
        for size, rnd, order in _schedule(args.sizes.split(","), variants, args.rounds):
            got = {}
            for variant in order:
                tree_name, backend = _variant(variant, args.attention_backend)
                tag = f"r{rnd}/" if args.rounds > 1 else ""
                key = f"{release}/{size}/{backend}/{_setting(args)}{tag}{tree_name}"
                sync_dir = work / "syncs" / key.replace("/", "_")
                if sync_dir.exists():
                    shutil.rmtree(sync_dir)
                res_file = work / "results" / (key.replace("/", "_") + ".json")
                res_file.parent.mkdir(parents=True, exist_ok=True)
                if res_file.exists():
                    res_file.unlink()
                env = launch.runner_env(
                    tree=trees[tree_name],
                    tree_name=tree_name,
                    site_rel=site_rel,
                    site_common=site_common,
                    bundle=bundle,
                    info=info,
                    sync_dir=sync_dir,
                    asked_env=asked_env,
                )
                if args.alternate:
                    env[mirror_control.ENV_CONTROL] = str(sync_dir / "mirror")
                    env["PK_E2E_SYNC_FLUSH_S"] = "0.05"
                cmd = [
                    *args.wrap.split(),
                    sys.executable,
                    "-m",
                    "pk_gpu_e2e.runner",
                    "--tree-parent",
                    str(trees[tree_name]),
                    "--variant",
                    tree_name,
                    "--size",
                    size,
                    "--batch-sizes",
                    args.batch_sizes,
                    "--max-new-tokens",
                    str(args.max_new_tokens),
                    "--runs",
                    str(args.runs),
                    "--attention-backend",
                    backend,
                    "--scenario",
                    args.scenario,
                    "--workloads",
                    args.workloads,
                    "--alternate",
                    str(args.alternate),
                    "--mem-fraction-static",
                    str(mem_fraction),
                    "--tp",
                    str(args.tp),
                    "--piecewise",
                    args.piecewise,
                    "--draft",
                    args.draft,
                    "--context-length",
                    str(args.context_length),
                    "--engine-extra",
                    args.engine_extra,
                    "--input-len",
                    str(args.input_len),
                    *dp.forwarded(args),
                    "--profile-batch",
                    str(args.profile_batch),
                    "--models-dir",
                    str(work / "models"),
                    "--out",
                    str(res_file),
                ]
                if args.deterministic:
                    cmd.append("--deterministic")
                log(f"start {key}")
                t = time.perf_counter()
                with open(engine_log, "a") as fh:
                    section_start = fh.tell()
                    fh.write(f"\n===== {key} =====\n")
                    fh.flush()
                    try:
                        proc = subprocess.run(
                            cmd,
                            env=env,
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                            timeout=args.run_timeout,
                            start_new_session=False,
                        )
                        rc: int | str = proc.returncode
                    except subprocess.TimeoutExpired:
                        rc = "timeout"
                log(f"end {key}: rc={rc} in {time.perf_counter() - t:.0f} s")
                if res_file.exists():
                    res = json.loads(res_file.read_text())
                    res["rc"] = rc
                    res["engine_log"] = engine_facts.log_facts(_section(engine_log, section_start))
                    all_results["runs"][key] = res
                    all_results["problems"].extend(engine_facts.problems(key, res))
                    res["engine_env"] = asked_env
                    all_results["problems"].extend(engine_env.problems(key, asked_env, res))
                    (out / "settings.md").write_text(engine_facts.settings_markdown(all_results["runs"]))
                    log(f"  in force: {engine_facts.in_force(res)}")
                    if (res.get("kernel_gaps") or {}).get("asked"):  # 0.5.9's stand-ins (kernel_gaps.py)
                        log(f"  sgl_kernel stand-ins: {res['kernel_gaps']}")
                    for b in res.get("batches", []):
                        if "summary" not in b:
                            log(
                                f"  {b.get('workload', 'uniform')} bs={b['batch_size']}: {b['tok_per_s']:.1f} "
                                f"tok/s, accept {b['accept_length']}, steps {b['decode_steps']}, syncs {b['syncs']}"
                            )
                    if rc == 0 and res.get("batches"):
                        got[variant] = res
                else:
                    all_results["runs"][key] = {"rc": rc}
                run = all_results["runs"][key]
                if rc != 0 and not run.get("batches"):  # a refused setting, a missing package (issue 58)
                    # the log's root cause before the runner's own line, which may only say
                    # that a scheduler died (dp-tbo's "ImportError: DeepEP is not installed")
                    run["engine_failure"] = engine_facts.failure_line(_section(engine_log, section_start)) or run.get(
                        "engine_failure"
                    )
                    all_results["problems"].append(f"{key}: the engine did not run (rc={rc}): {run['engine_failure']}")
                    log(f"  engine failed: {run['engine_failure']}")
                results_path.write_text(json.dumps(all_results, indent=1, sort_keys=True))
            # One variant (--alternate, an upstream reference) has no pair to compare.
            first, second = pair if len(pair) == 2 else ("", "")  # "": no variant of that name
            if first in got and second in got and pair != ("pristine", "patched"):
                # Two trees or two backends side by side: the speed ratio per round;
                # identical outputs where both run one backend.
                rows = report.compare(release, got[first], got[second])
                for row in rows:
                    row["pair"] = f"{first} → {second}"
                all_results["rows"].extend(rows)
                same_backend = _variant(first, args.attention_backend)[1] == _variant(second, args.attention_backend)[1]
                all_results["problems"].extend(
                    f"{r['release']} {r['size']} bs={r['batch_size']}: outputs differ ({r['mismatch']})"
                    for r in rows
                    if same_backend and not r["identical"]
                )
                (out / "table.md").write_text(report.markdown(all_results["rows"]))
                if args.rounds > 1:
                    (out / "speed.md").write_text(report.speed_markdown(all_results["rows"]))
                print(report.markdown(rows), flush=True)
            elif "pristine" in got and "patched" in got:
                rows = report.compare(release, got["pristine"], got["patched"])
                all_results["rows"].extend(rows)
                # "default": the backend sglang chose, as the patched engine read it back
                used = engine_facts.backend_in_force(got["patched"], args.attention_backend)
                mirror_kept = used not in report.SYNC_FREE_BACKENDS
                all_results["problems"].extend(report.verdict(rows, mirror_kept=mirror_kept))
                all_results["problems"].extend(wait_report.problems(rows))  # torch's count (issue 53)
                all_results["notes"].extend(_startup_notes(rows) + sites.negligible_notes(rows))
                (out / "table.md").write_text(tables(all_results["rows"]))
                if args.rounds > 1:
                    (out / "speed.md").write_text(report.speed_markdown(all_results["rows"]))
                print(report.markdown(rows), flush=True)
                if args.tp > 1:
                    rank_rows = rank_report.compare(release, got["pristine"], got["patched"])
                    all_results["rank_rows"].extend(rank_rows)
                    all_results["problems"].extend(rank_report.verdict(rank_rows, args.tp, mirror_kept=mirror_kept))
                    all_results["notes"].extend(_startup_notes(rank_rows) + sites.negligible_notes(rank_rows))
                    (out / "ranks.md").write_text(rank_report.markdown(all_results["rank_rows"]))
                    print(rank_report.markdown(rank_rows), flush=True)
            results_path.write_text(json.dumps(all_results, indent=1, sort_keys=True))

    print("\n" + tables(all_results["rows"]))
    if args.rounds > 1:
        print("\n" + report.speed_markdown(all_results["rows"]))
    if args.tp > 1:
        print("\n" + rank_report.markdown(all_results["rank_rows"]))
    extra = issue23_report.issue23_tables([all_results])
    if extra:
        (out / "tables.md").write_text(extra)
        print("\n" + extra)
    all_results["problems"].extend(issue23_report.issue23_problems([all_results]))
    ok = call_verdict.verdict(all_results, extra)  # adds its NOTE where the call has no pair
    results_path.write_text(json.dumps(all_results, indent=1, sort_keys=True))
    print("device:", all_results["device"])
    for n in all_results["notes"]:
        print("NOTE:", n)
    for p in all_results["problems"]:
        print("PROBLEM:", p)
    print("verdict:", "OK" if ok else "NOT OK")
    return 0 if ok else 1


def tables(rows: list[dict]) -> str:
    """table.md: the wrapper counter's table, then torch's host waits per site (issue 53)."""
    waits = [r for r in rows if r.get("waits")]
    return report.markdown(rows) + ("\n" + wait_report.markdown(waits) if waits else "")


def _section(path: Path, start: int) -> str:
    """One engine's part of the shared engine log."""
    with open(path, "rb") as fh:
        fh.seek(start)
        return fh.read().decode("utf-8", "replace")


def _startup_notes(rows: list[dict]) -> list[str]:
    """New sync sites seen only while the patched engine started (reported, not a problem)."""
    seen = {}
    for r in rows:
        if r.get("new_sites_startup"):
            tag = f"{r['release']} {r['size']}" + (f" rank {r['tp_rank']}" if "tp_rank" in r else "")
            seen[tag] = r["new_sites_startup"]
        if r.get("new_wait_sites_startup"):
            seen[f"{r['release']} {r['size']} (torch's count)"] = r["new_wait_sites_startup"]
    return [
        f"{tag}: new sync sites during start-up only (graph capture; not a problem): {', '.join(s)}"
        for tag, s in seen.items()
    ]


def _device() -> str:
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return q.stdout.strip() or q.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"


if __name__ == "__main__":
    sys.exit(main())
