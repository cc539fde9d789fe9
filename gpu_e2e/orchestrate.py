"""GPU side: unpack the bundle, run every (release, size, variant) in a fresh process, compare.

    cd BUNDLE && PYTHONPATH=e2e python3 -m pk_gpu_e2e.orchestrate --out "$OUT"

Writes (all under ``--out``, so they come back even when the call is cut short):
``results.json`` (every run, rewritten after each), ``table.md``, ``settings.md``
(what each engine ran with, read back: :mod:`.engine_facts`) and ``engine.log``
(every engine's own output, one after the other).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from . import (bundle_kernels, call_verdict, dp, engine_facts, fa3_kernel, mirror_control, rank_report, ranks,
               report, wait_report)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def unpack(tar_path: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(dest)


def prepare_trees(bundle: Path, release: str, work: Path) -> dict[str, Path]:
    """``{"pristine": parent_dir, "patched": parent_dir}`` (each holds ``sglang/``);
    a reference release (upstream, no overlay) gives ``{"upstream": parent_dir}``."""
    tdir = bundle / "trees" / release
    pristine = work / release / "pristine"
    patched = work / release / "patched"
    for d in (pristine, patched):
        if d.exists():
            shutil.rmtree(d)
    unpack(tdir / "pristine.tar.gz", pristine)
    if not (tdir / "overlay.tar.gz").exists():
        log(f"{release}: upstream tree ready (the reference: no overlay)")
        return {"upstream": pristine}
    trees = {"pristine": pristine}
    for overlay_tar in sorted(tdir.glob("overlay*.tar.gz")):
        # overlay.tar.gz: every patch; overlay-minus-ID.tar.gz: every patch but ID.
        name = overlay_tar.name[len("overlay-"):-len(".tar.gz")] if overlay_tar.name != "overlay.tar.gz" else "patched"
        tree = work / release / name
        if tree.exists():
            shutil.rmtree(tree)
        shutil.copytree(pristine, tree)
        unpack(overlay_tar, tree)
        expected = json.loads(overlay_tar.with_name(overlay_tar.name.replace(".tar.gz", ".json")).read_text())
        for rel, sha in expected.items():
            got = hashlib.sha256((tree / "sglang" / rel).read_bytes()).hexdigest()
            if got != sha:
                raise SystemExit(f"{release}: {name} {rel} has sha256 {got}, expected {sha}")
        trees[name] = tree
        log(f"{release}: {name} tree ready ({len(expected)} patched file(s) checked)")
    return trees


def unpacked_site(bundle: Path, group: str, work: Path) -> Path:
    """The bundle's ``site/<group>.tar.xz`` (``.tar.gz`` in bundles built before) unpacked under ``work``, reused by later
    calls on a warm machine only when it is the same tar (named by its sha256: two
    bundles' "common" groups differ, e.g. 0.5.13's lacks sglang-kernel 0.4.2)."""
    tar = next((t for t in (bundle / "site" / f"{group}.tar.xz", bundle / "site" / f"{group}.tar.gz") if t.exists()),
               bundle / "site" / f"{group}.tar.xz")
    sha = hashlib.sha256(tar.read_bytes()).hexdigest()[:16]
    dest = work / "site" / f"{group}-{sha}"
    if not dest.exists():
        part = dest.with_name(dest.name + ".part")
        shutil.rmtree(part, ignore_errors=True)  # left by a call cut short
        unpack(tar, part)
        part.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=".")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--work", default="/tmp/pk_gpu_e2e")
    ap.add_argument("--releases", default=None, help="comma list (default: all in the bundle)")
    ap.add_argument("--sizes", default="small,8b")
    ap.add_argument("--variants", default="pristine,patched",
                    help="of a patched release; a reference release runs its upstream tree. Each is "
                         "TREE or TREE@BACKEND: TREE pristine, patched or minus-PATCH (a bundle built with "
                         "--minus PATCH), BACKEND an attention backend (default --attention-backend)")
    ap.add_argument("--compare", default=None,
                    help="A,B: the two variants each round compares (default: pristine,patched, or the "
                         "first two variants); outputs must be identical only where A and B use one backend")
    ap.add_argument("--scenario", choices=("eagle3", "standalone", "mtp"), default="eagle3",
                    help="standalone: the draft is the target itself, so steps accept tokens; "
                         "mtp: a DeepSeek size (ds, ds-dense) with its own MTP layer as the draft")
    ap.add_argument("--engine-extra", default="{}",
                    help="JSON object of Engine settings over the rest (page_size, speculative_eagle_topk, "
                         "cuda_graph_max_bs, ...), as each engine's settings.md reads them back")
    ap.add_argument("--input-len", type=int, default=32, help="prompt tokens of the uniform workload")
    ap.add_argument("--label", default="", help="a word added to every run's key (one call, two settings)")
    ap.add_argument("--wrap", default="",
                    help="a command put before every runner (e.g. compute-sanitizer --tool memcheck ...)")
    ap.add_argument("--deterministic", action="store_true",
                    help="enable_deterministic_inference in every engine")
    ap.add_argument("--workloads", default="uniform", help="comma list: uniform, mixed, penalized")
    ap.add_argument("--alternate", type=int, default=0,
                    help="N > 0: patched only, N ABBA alternations of mirror kept / dropped "
                         "inside each engine (the sync's cost, in one process)")
    ap.add_argument("--mem-fraction-static", type=float, default=None,
                    help="default 0.6; 0.25 for standalone (the draft copy needs its own room)")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile-batch", type=int, default=0, help="BS: one more generate under sglang's profiler")
    ap.add_argument("--attention-backend", default="triton",
                    help='"default": name none, so sglang picks (FA3 on Hopper; read back in settings.md)')
    ap.add_argument("--piecewise", choices=("default", "on", "off"), default="default",
                    help="piecewise CUDA graph as the release defaults it (default), enforced on, or off "
                         "(disable_piecewise_cuda_graph=True, as the proofs before issue 40 ran)")
    ap.add_argument("--draft", choices=("checkpoint", "dummy"), default="checkpoint",
                    help="checkpoint: EAGLE3 draft shaped like a published one (draft vocab 32000, d2t); "
                         "dummy: the earlier proofs' draft (draft vocab = vocab, no token map)")
    ap.add_argument("--context-length", type=int, default=0, help="0: the models' own (131072)")
    ap.add_argument("--fa3-lib", type=Path, default=None,
                    help="FA3's flash_ops.abi3.so unpacked by fa3_kernel.py (checked, then put beside sgl_kernel)")
    ap.add_argument("--kernels", type=Path, default=None,
                    help="a folder holding kernels/ (bundle_kernels.py; default: the bundle's own)")
    ap.add_argument("--run-timeout", type=int, default=420)
    ap.add_argument("--rounds", type=int, default=1,
                    help="engine processes per variant, alternating which starts first (ABBA...): "
                         "the speed ratio is then read per round, so noise between processes shows")
    ap.add_argument("--tp", type=int, default=1,
                    help="tp_size of every engine; above 1 also a row per rank in ranks.md (see ranks.py)")
    dp.add_arguments(ap)  # issue 58: DP attention, two-batch overlap, the a2a backend (GPUs: --tp)
    args = ap.parse_args(argv)
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
    all_results: dict = {"device": _device(), "manifest_created": manifest.get("created"),
                         "patchkit_commit": manifest.get("patchkit_commit"),
                         "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "runs": {}, "rows": [], "problems": [],
                         "trees": {}, "rank_rows": [], "notes": []}

    for release in releases:
        info = manifest["releases"][release]
        site_rel = unpacked_site(bundle, release, work)
        if args.fa3_lib is not None:  # beside the sgl_kernel this release imports (0.5.13: its own pin)
            kernel_site = site_rel if (site_rel / "sgl_kernel").is_dir() else site_common
            fa3 = fa3_kernel.install(args.fa3_lib, kernel_site)
            log(f"FA3 kernels installed from {args.fa3_lib} into {kernel_site.name} "
                f"(sglang-kernel {fa3['sglang_kernel']}, sha256 checked)")
        trees = prepare_trees(bundle, release, work / "trees")
        overlay = bundle / "trees" / release / "overlay.json"
        all_results["trees"][release] = {
            "runtime_mode": info["runtime_mode"],
            "patched_files_sha256": json.loads(overlay.read_text()) if overlay.exists() else {},
            # every other tree the bundle carries (minus-ID, an earlier patchkit's): its files' sha256
            "variant_files_sha256": {p.name[len("overlay-"):-len(".json")]: json.loads(p.read_text())
                                     for p in sorted(overlay.parent.glob("overlay-*.json"))},
        }
        variants = list(trees) if "upstream" in trees else (
            ["patched"] if args.alternate else args.variants.split(","))
        unknown = [v for v in variants if _variant(v, "")[0] not in trees]
        if unknown:
            raise SystemExit(f"{release}: no tree for variant(s) {', '.join(unknown)} (trees: {', '.join(trees)})")
        pair = tuple(args.compare.split(",")) if args.compare else (
            ("pristine", "patched") if {"pristine", "patched"} <= set(variants) else tuple(variants[:2]))
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
                path = [str(trees[tree_name]), str(site_rel), str(site_common), str(bundle / "e2e")]
                if tree_name != "pristine" and info["runtime_mode"] == "package":
                    path.insert(1, str(bundle / "runtime"))
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1",
                           PK_E2E_SYNC_DIR=str(sync_dir), SGLANG_ENABLE_SPEC_V2="1",
                           HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **ranks.MULTICAST_OFF)
                env.update(info.get("env", {}))  # what the release needs on this image (wheels.RELEASE_ENV)
                if args.alternate:
                    env[mirror_control.ENV_CONTROL] = str(sync_dir / "mirror")
                    env["PK_E2E_SYNC_FLUSH_S"] = "0.05"
                cmd = [*args.wrap.split(), sys.executable, "-m", "pk_gpu_e2e.runner", "--tree-parent", str(trees[tree_name]),
                       "--variant", tree_name, "--size", size, "--batch-sizes", args.batch_sizes,
                       "--max-new-tokens", str(args.max_new_tokens), "--runs", str(args.runs),
                       "--attention-backend", backend,
                       "--scenario", args.scenario, "--workloads", args.workloads,
                       "--alternate", str(args.alternate), "--mem-fraction-static", str(mem_fraction),
                       "--tp", str(args.tp), "--piecewise", args.piecewise, "--draft", args.draft,
                       "--context-length", str(args.context_length), "--engine-extra", args.engine_extra,
                       "--input-len", str(args.input_len), *dp.forwarded(args), "--profile-batch", str(args.profile_batch),
                       "--models-dir", str(work / "models"), "--out", str(res_file)]
                if args.deterministic:
                    cmd.append("--deterministic")
                log(f"start {key}")
                t = time.perf_counter()
                with open(engine_log, "a") as fh:
                    section_start = fh.tell()
                    fh.write(f"\n===== {key} =====\n")
                    fh.flush()
                    try:
                        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                              timeout=args.run_timeout, start_new_session=False)
                        rc = proc.returncode
                    except subprocess.TimeoutExpired:
                        rc = "timeout"
                log(f"end {key}: rc={rc} in {time.perf_counter() - t:.0f} s")
                if res_file.exists():
                    res = json.loads(res_file.read_text())
                    res["rc"] = rc
                    res["engine_log"] = engine_facts.log_facts(_section(engine_log, section_start))
                    all_results["runs"][key] = res
                    all_results["problems"].extend(engine_facts.problems(key, res))
                    (out / "settings.md").write_text(engine_facts.settings_markdown(all_results["runs"]))
                    log(f"  in force: {engine_facts.in_force(res)}")
                    if (res.get("kernel_gaps") or {}).get("asked"):  # 0.5.9's stand-ins (kernel_gaps.py)
                        log(f"  sgl_kernel stand-ins: {res['kernel_gaps']}")
                    for b in res.get("batches", []):
                        if "summary" not in b:
                            log(f"  {b.get('workload', 'uniform')} bs={b['batch_size']}: {b['tok_per_s']:.1f} "
                                f"tok/s, accept {b['accept_length']}, steps {b['decode_steps']}, syncs {b['syncs']}")
                    if rc == 0 and res.get("batches"):
                        got[variant] = res
                else:
                    all_results["runs"][key] = {"rc": rc}
                run = all_results["runs"][key]
                if rc != 0 and not run.get("batches"):  # a refused setting, a missing package (issue 58)
                    # the log's root cause before the runner's own line, which may only say
                    # that a scheduler died (dp-tbo's "ImportError: DeepEP is not installed")
                    run["engine_failure"] = engine_facts.failure_line(
                        _section(engine_log, section_start)) or run.get("engine_failure")
                    all_results["problems"].append(f"{key}: the engine did not run (rc={rc}): {run['engine_failure']}")
                    log(f"  engine failed: {run['engine_failure']}")
                results_path.write_text(json.dumps(all_results, indent=1, sort_keys=True))
            # One variant (--alternate, an upstream reference) has no pair to compare.
            first, second = pair if len(pair) == 2 else (None, None)
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
                    for r in rows if same_backend and not r["identical"])
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
                all_results["notes"].extend(_startup_notes(rows))
                (out / "table.md").write_text(tables(all_results["rows"]))
                if args.rounds > 1:
                    (out / "speed.md").write_text(report.speed_markdown(all_results["rows"]))
                print(report.markdown(rows), flush=True)
                if args.tp > 1:
                    rank_rows = rank_report.compare(release, got["pristine"], got["patched"])
                    all_results["rank_rows"].extend(rank_rows)
                    all_results["problems"].extend(rank_report.verdict(rank_rows, args.tp, mirror_kept=mirror_kept))
                    all_results["notes"].extend(_startup_notes(rank_rows))
                    (out / "ranks.md").write_text(rank_report.markdown(all_results["rank_rows"]))
                    print(rank_report.markdown(rank_rows), flush=True)
            results_path.write_text(json.dumps(all_results, indent=1, sort_keys=True))

    print("\n" + tables(all_results["rows"]))
    if args.rounds > 1:
        print("\n" + report.speed_markdown(all_results["rows"]))
    if args.tp > 1:
        print("\n" + rank_report.markdown(all_results["rank_rows"]))
    extra = report.issue23_tables([all_results])
    if extra:
        (out / "tables.md").write_text(extra)
        print("\n" + extra)
    all_results["problems"].extend(report.issue23_problems([all_results]))
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


def _variant(spec: str, default_backend: str) -> tuple[str, str]:
    """``TREE[@BACKEND]`` -> (tree name, attention backend)."""
    tree, _, backend = spec.partition("@")
    return tree, backend or default_backend


def _setting(args) -> str:
    """Key part naming what differs from the first proof's settings ("" when nothing)."""
    parts = [args.label] if getattr(args, "label", "") else []
    if args.scenario != "eagle3":
        parts.append(args.scenario)
    if args.deterministic:
        parts.append("det")
    if args.workloads != "uniform":
        parts.append(args.workloads.replace(",", "+"))
    if args.alternate:
        parts.append(f"alt{args.alternate}")
    if args.tp > 1:
        parts.append(f"tp{args.tp}")
    parts += dp.setting_parts(args)
    if getattr(args, "piecewise", "default") != "default":
        parts.append(f"pw-{args.piecewise}")
    if getattr(args, "draft", "checkpoint") != "checkpoint":
        parts.append(f"draft-{args.draft}")
    if getattr(args, "context_length", 0):
        parts.append(f"ctx{args.context_length}")
    return "-".join(parts) + "/" if parts else ""


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
    return [f"{tag}: new sync sites during start-up only (graph capture; not a problem): {', '.join(s)}"
            for tag, s in seen.items()]


def _schedule(sizes: list[str], variants: list[str], rounds: int):
    """(size, round, variants in start order): the order flips every round, so
    a drift of the machine over the call (clocks, heat) hits both variants alike."""
    for size in sizes:
        for rnd in range(rounds):
            yield size, rnd, variants if rnd % 2 == 0 else variants[::-1]


def _device() -> str:
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        return q.stdout.strip() or q.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"


if __name__ == "__main__":
    sys.exit(main())
