"""Where one cold in-process apply spends its time: a cProfile summary by
phase, by area (libcst parse, codegen, codemods, state store ...) and the top
functions."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys

from timing import ROOT, Bench, quiet, with_env

from patchkit import registry
from patchkit.api.applying import apply_patches
from patchkit.engine import locked_session


def profile_apply(bench: Bench) -> str:
    patches = list(registry.all_patches())
    tree = bench.fresh()
    prof = cProfile.Profile()

    def profiled() -> None:
        prof.enable()
        with locked_session(tree, quiet, "apply") as session:
            apply_patches(session, patches)
        prof.disable()

    # Cold and in this process, so the profile sees every file's work.
    with_env({**bench.empty_cache(), "PATCHKIT_JOBS": "1"}, profiled)()
    stats = pstats.Stats(prof)
    total = sum(v[2] for v in stats.stats.values())  # tottime
    buckets: dict[str, float] = {}
    for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        buckets[_bucket(filename, func)] = buckets.get(_bucket(filename, func), 0.0) + tt
    out = io.StringIO()
    out.write(
        f"cProfile of one in-process cold apply, one process: {total:.2f} s of own time (profiling inflates visitor-heavy "
        "code; read the shares)\n\nphases (cumulative, overlapping where nested):\n"
    )
    phases = [
        (
            "Transformer.prepare (every file: parse, detect, transform, check)",
            "patchkit/transform/transformer.py",
            "prepare",
        ),
        ("  transform.parse (libcst parse of each file)", "patchkit/transform/__init__.py", "parse"),
        ("  vendor_code.check (the vendor's code survives)", "patchkit/transform/vendor_code.py", "check"),
        ("Session.reports (status before apply: from the findings prepare cached)", "patchkit/engine.py", "reports"),
        (
            "Transformer.run (a prepared result, else detect, transform, re-detect, compile)",
            "patchkit/transform/transformer.py",
            "run",
        ),
        ("  ClassCodemod.detect (all calls)", "patchkit/codemods/common/base.py", "detect"),
        ("  codemod transform_module (all calls)", "patchkit/codemods/common/base.py", "transform_module"),
        ("  add_needed_imports", "patchkit/codemods/common/primitives/imports.py", "add_needed_imports"),
        ("  libcst Module.bytes (codegen)", "libcst/_nodes/module.py", "bytes"),
        ("  compile()", "~", "<built-in method builtins.compile>"),
        ("Store.commit (blobs, journal, fsync, writes)", "patchkit/state/__init__.py", "commit"),
    ]
    for label, fname, func in phases:
        cum = sum(v[3] for (f, _l, fn), v in stats.stats.items() if fn == func and f.replace("\\", "/").endswith(fname))
        out.write(f"  {cum:7.3f} s  {cum / total:5.1%}  {label}\n")
    out.write("\nown time by area:\n")
    for name, tt in sorted(buckets.items(), key=lambda kv: -kv[1]):
        out.write(f"  {tt:7.3f} s  {tt / total:5.1%}  {name}\n")
    out.write("\ntop functions by cumulative time:\n")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    out.write(_trim_pstats(buf.getvalue()))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
    out.write("\ntop functions by own time:\n")
    out.write(_trim_pstats(buf.getvalue()))
    return out.getvalue()


# -- report ----------------------------------------------------------------


def _bucket(filename: str, func: str) -> str:
    f = filename.replace("\\", "/")
    if (
        "libcst/_parser" in f
        or func in ("parse_module", "parse_module_as_expression")
        or "libcst/native" in f
        or "libcst_native" in f
    ):
        return "libcst: parse (native parser + CST building)"
    if "libcst/_nodes" in f and func in ("_codegen", "_codegen_impl", "code", "bytes", "code_for_node"):
        return "libcst: codegen (module.bytes)"
    if "libcst/_nodes" in f or "libcst/_visitors" in f or "libcst/_batched" in f:
        return "libcst: tree walks / node rebuilds (visit, with_changes, deep_equals)"
    if "libcst/codemod" in f or "libcst/helpers" in f or "libcst/metadata" in f:
        return "libcst: codemod helpers (AddImportsVisitor, metadata)"
    if "libcst/matchers" in f:
        return "libcst: matchers"
    if "libcst" in f:
        return "libcst: other"
    if "patchkit/codemods" in f:
        return "patchkit: codemods (detect/transform)"
    if "patchkit/state" in f or func in ("fsync", "replace", "write", "read", "open", "mkstemp"):
        return "state store: blobs, journal, fsync"
    if "patchkit/" in f:
        return "patchkit: engine/registry"
    if func == "<built-in method builtins.compile>" or "compile" in func:
        return "compile() of patched files"
    if "<frozen importlib" in f or "importlib" in f:
        return "imports"
    return "other (stdlib, builtins)"


def _trim_pstats(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("ncalls")), 0)
    out = []
    for ln in lines[start:]:
        if not ln.strip():
            continue
        out.append("  " + ln.replace(str(ROOT) + "/", "").replace(sys.prefix, "<venv>")[:160])
    return "\n".join(out) + "\n"
