"""Issue 57: upstream 0.5.17 as a reference bundle, tested on CPU.

The pins follow 0.5.17's own metadata; its tree travels without the extension modules
built for another Python; the harness's Engine settings reach 0.5.17's renamed
``ServerArgs`` fields; a bundle too big for one device call travels in parts; and,
with the built bundle's site first on the path, the 0.5.17 tree imports the Engine
path's modules as far as CPU allows.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from gpu_e2e import bundle, bundle_parts, coverage, cuda_only_imports, runner, server_args_names, timed_calls, wheels

REL = "0.5.17"


def test_017_is_a_reference_release_with_its_own_pins():
    assert REL in wheels.REFERENCE_RELEASES and REL not in wheels.RELEASES
    alone = wheels.all_pins([REL])
    assert alone[REL] == {
        "transformers": "5.12.1",
        "tokenizers": "0.22.2",
        "flashinfer-python": "0.6.15.post1",
        "sglang-kernel": "0.4.5",
        "apache-tvm-ffi": "0.1.11",
        "xgrammar": "0.2.1",
        "sgl-deep-gemm": "0.1.5.post1",
    }
    # alone, the common group drops what 0.5.17 pins its own way; beside 0.5.12.post1 it keeps them
    assert not {"sglang-kernel", "apache-tvm-ffi"} & set(alone["common"])
    both = wheels.all_pins(["0.5.12.post1", REL])
    assert both["common"]["sglang-kernel"] == "0.4.2.post2" and both["common"]["apache-tvm-ffi"] == "0.1.9"
    on_image = {wheels.normalise(d) for g in alone.values() for d in g} & wheels.IMAGE_PACKAGES
    assert on_image == {"transformers", "tokenizers"}  # 5.12.1 refuses the image's tokenizers 0.23.2
    # FA3 from sglang-kernel, never the hub download the offline image cannot make
    assert wheels.RELEASE_ENV[REL] == {"SGLANG_USE_SGL_FA3_KERNEL": "1"}


def test_xgrammar_travels_without_its_static_library_and_headers():
    assert wheels.keep_member("xgrammar", "xgrammar/libxgrammar_bindings.so")
    assert wheels.keep_member("xgrammar", "xgrammar/__init__.py")
    assert not wheels.keep_member("xgrammar", "xgrammar/lib/libxgrammar.a")
    assert not wheels.keep_member("xgrammar", "xgrammar/include/xgrammar/xgrammar.h")
    # sglang-kernel 0.4.5 is slimmed like 0.4.2.post2: its cp310-only InfLLM library stays behind
    assert wheels.keep_member("sglang-kernel", "sglang_kernel-0.4.5.dist-info/METADATA")
    assert not wheels.keep_member("sglang-kernel", "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so")


def test_a_reference_tree_leaves_out_extensions_built_for_another_python():
    assert not bundle.loads_on_image("srt/server/_core.cpython-311-x86_64-linux-gnu.so")
    assert bundle.loads_on_image("srt/server/_core.cpython-312-x86_64-linux-gnu.so")
    assert bundle.loads_on_image("srt/managers/scheduler.py")
    assert bundle.loads_on_image("lib/thing.abi3.so")


@pytest.mark.trees
def test_pins_are_the_ones_017_metadata_asks_for():
    from patchkit.fetch import download_wheel

    with zipfile.ZipFile(download_wheel(REL)) as zf:
        meta = zf.read(f"sglang-{REL}.dist-info/METADATA").decode()
    asked = {}
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:") and "==" in line and "extra ==" not in line:
            name, _, ver = line.split(":", 1)[1].split(";")[0].strip().partition("==")
            asked[wheels.normalise(name.split("[")[0])] = ver.strip()
    pins = wheels.all_pins([REL])[REL]
    for dist, ver in pins.items():
        if wheels.normalise(dist) != "tokenizers":  # not pinned by sglang; transformers 5.12.1 caps it
            assert asked[wheels.normalise(dist)] == ver, dist
    assert asked["torch"] == "2.11.0"  # the image's: why 0.5.17 is the newest that runs there


def test_renames_only_where_the_release_renamed():
    old = {"cuda_graph_max_bs", "disable_piecewise_cuda_graph", "enforce_piecewise_cuda_graph", "dtype"}
    new = {"cuda_graph_max_bs_decode", "cuda_graph_backend_prefill", "dtype"}
    kw = {"cuda_graph_max_bs": 32, "disable_piecewise_cuda_graph": True, "dtype": "bfloat16"}
    assert server_args_names.for_fields(kw, old) == (kw, {})
    assert server_args_names.for_fields(kw, None) == (kw, {})
    got, renamed = server_args_names.for_fields(kw, new)
    assert got == {"cuda_graph_max_bs_decode": 32, "cuda_graph_backend_prefill": "disabled", "dtype": "bfloat16"}
    assert renamed == {
        "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
        "disable_piecewise_cuda_graph": "cuda_graph_backend_prefill",
    }
    got, _ = server_args_names.for_fields({"enforce_piecewise_cuda_graph": True}, new)
    assert got == {"cuda_graph_backend_prefill": "tc_piecewise"}
    got, _ = server_args_names.for_fields({"disable_piecewise_cuda_graph": False}, new)
    assert got == {}  # the old default: nothing to ask for
    with pytest.raises(ValueError, match="cuda_graph_backend_prefill"):
        server_args_names.for_fields({"disable_piecewise_cuda_graph": True, "cuda_graph_backend_prefill": "full"}, new)


def _ast_fields(release: str) -> set[str]:
    from patchkit.fetch import fetch_tree

    tree = ast.parse((fetch_tree(release) / "srt" / "server_args.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _harness_kwargs(tmp_path) -> list[dict]:
    """What issue 57's plan and the earlier ones pass: FA3 by default, Triton, each piecewise switch."""
    out = []
    for backend, piecewise in (("default", "default"), ("triton", "default"), ("fa3", "off"), ("fa3", "on")):
        out.append(
            runner.engine_kwargs(
                tmp_path / "t",
                tmp_path / "d",
                attention_backend=backend,
                cuda_graph_max_bs=32,
                mem_fraction_static=0.6,
                piecewise=piecewise,
                context_length=131072,
                engine_extra={"cuda_graph_max_bs": 8},
            )
        )
    return out


@pytest.mark.trees
@pytest.mark.parametrize("release", ["0.5.12.post1", REL])
def test_harness_settings_are_server_args_of_the_release(release, tmp_path):
    fields = _ast_fields(release)
    for kwargs in _harness_kwargs(tmp_path):
        got, renamed = server_args_names.for_fields(kwargs, fields)
        assert set(got) <= fields, set(got) - fields
        assert bool(renamed) == (release == REL)
        if release == REL:
            assert "cuda_graph_max_bs_decode" in renamed.values() and got["cuda_graph_max_bs_decode"] == 8


@pytest.mark.trees
def test_what_017_eagle_graph_capture_imports_on_cuda_is_on_the_image_or_in_the_bundle():
    """The GPU run's first failure (issue 57): ``_capture_cuda_graphs`` imports
    ``dsa_backend`` under ``if _is_cuda``, which imports ``deep_gemm`` under ``if is_cuda():``
    at module level. The CPU import walk never runs either branch; this reads them."""
    from patchkit.fetch import fetch_tree

    tree_parent = fetch_tree(REL).parent
    lazy = cuda_only_imports.lazy_cuda_imports(
        tree_parent, "sglang.srt.speculative.eagle_worker_v2", "_capture_cuda_graphs"
    )
    assert "sglang.srt.layers.attention.dsa_backend" in lazy
    assert not any("aiter" in m for m in lazy)  # HIP only
    tops = cuda_only_imports.module_level_imports(tree_parent, lazy)
    assert tops["deep_gemm"].startswith("sglang.srt.layers.attention.dsa_backend:")
    allowed = coverage.allowed_distributions([REL])
    missing = {top: where for top, where in tops.items() if coverage.distribution_of_import(top) not in allowed}
    assert missing == {}


def test_join_takes_every_part_named_in_one_call(tmp_path, capsys):
    src = tmp_path / "bundle"
    (src / "site").mkdir(parents=True)
    (src / "site" / "big.tar.xz").write_bytes(bytes(range(256)) * 700)
    parts = bundle_parts.split(src, part_bytes=64 * 1024 + 100_000, log=lambda *_: None)
    dest = tmp_path / "joined"
    # two --part flags once kept only the last: every one named is joined now
    assert bundle_parts.main(["join", *(a for p in parts for a in ("--part", str(p))), "--dest", str(dest)]) == 0
    assert (dest / "site" / "big.tar.xz").read_bytes() == (src / "site" / "big.tar.xz").read_bytes()
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("complete, every file's sha256 checked")


def test_split_and_join_put_every_file_back(tmp_path):
    src = tmp_path / "bundle"
    (src / "site").mkdir(parents=True)
    (src / "site" / "big.tar.xz").write_bytes(bytes(range(256)) * 700)  # 179,200 bytes: cut in chunks
    (src / "manifest.json").write_text("{}")
    (src / "site" / "small.tar.xz").write_bytes(b"x" * 50_000)
    # the default leaves room for the checkout: a 45.9 MiB part beside 17.9 MiB was refused
    assert bundle_parts.PART_BYTES <= 40 * bundle_parts.MIB
    parts = bundle_parts.split(src, part_bytes=64 * 1024 + 100_000, log=lambda *_: None)
    assert [p.name for p in parts] == [f"bundle-{c}" for c in "abc"]
    for part in parts:
        assert sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) <= 64 * 1024 + 100_000
    dest = tmp_path / "joined"
    assert bundle_parts.join(parts[1], dest)  # parts may come in any order
    assert bundle_parts.join(parts[2], dest)
    assert not dest.exists()  # whole, or not there: a plan waiting for it never starts on half
    assert bundle_parts.join(parts[0], dest) == []
    assert not dest.with_name("joined.parts").exists()
    for f in ("site/big.tar.xz", "site/small.tar.xz", "manifest.json"):
        assert (dest / f).read_bytes() == (src / f).read_bytes()
    assert not list(dest.rglob("*.chunk-*"))
    index = json.loads((parts[0] / bundle_parts.INDEX).read_text())
    index["holds"] = ["../escape"]
    (parts[0] / bundle_parts.INDEX).write_text(json.dumps(index))
    with pytest.raises(SystemExit, match="there already"):
        bundle_parts.join(parts[0], dest)
    with pytest.raises(SystemExit, match="outside"):
        bundle_parts.join(parts[0], tmp_path / "again")


# ------------------------------------------------------------------ the built bundle


def _wheels_cached() -> bool:
    pins = wheels.all_pins([REL])
    return all(wheels.find_wheel(wheels.wheel_cache(), d, v) for g in pins.values() for d, v in g.items())


needs_wheels = pytest.mark.skipif(
    not _wheels_cached(),
    reason=(
        "needs 0.5.17's wheels in the patchkit cache (sglang-kernel 0.4.5 is 366 MB): run "
        "`python scripts/gpu_e2e.py bundle --out DIR --reference 0.5.17 --limit-mib 160` once"
    ),
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    dest = tmp_path_factory.mktemp("b17") / "bundle"
    # gzip: minutes faster than the devices' xz (the orchestrator reads both)
    manifest = bundle.build(
        dest, [], reference=[REL], log=lambda *_: None, site_compression="gz", limit=160 * bundle.MIB
    )
    return dest, manifest


def _dists(tar_path: Path) -> dict[str, str]:
    out = {}
    with tarfile.open(tar_path) as tar:
        for name in tar.getnames():
            top = name.split("/")[0]
            if top.endswith(".dist-info") and name.endswith("/METADATA"):
                dist, ver = top[: -len(".dist-info")].rsplit("-", 1)
                assert wheels.normalise(dist) not in out, dist
                out[wheels.normalise(dist)] = ver
    return out


@pytest.mark.trees
@needs_wheels
def test_the_017_bundle_carries_its_pins_and_its_tree(built):
    dest, manifest = built
    info = manifest["releases"][REL]
    assert info["reference"] and info["env"] == {"SGLANG_USE_SGL_FA3_KERNEL": "1"}
    assert info["left_out"] and all(".cpython-311-" in r for r in info["left_out"])
    pins = {g: {wheels.normalise(d): v for d, v in p.items()} for g, p in manifest["pins"].items()}
    assert _dists(dest / "site" / f"{REL}.tar.gz") == pins[REL]
    assert _dists(dest / "site" / "common.tar.gz") == pins["common"]
    with tarfile.open(dest / "site" / f"{REL}.tar.gz") as tar:
        names = set(tar.getnames())
    assert "sgl_kernel/sm90/common_ops.abi3.so" in names and "xgrammar/libxgrammar_bindings.so" in names
    assert "deep_gemm/__init__.py" in names and "deep_gemm/_C.so" in names  # dsa_backend imports it on CUDA
    assert not any("flash_ops" in n or n.startswith(("xgrammar/lib/", "xgrammar/include/")) for n in names)
    with tarfile.open(dest / "trees" / REL / "pristine.tar.gz") as tar:
        tree_names = tar.getnames()
    assert "sglang/srt/speculative/eagle_worker_v2.py" in tree_names
    assert not any(".cpython-311-" in n for n in tree_names)
    assert not (dest / "trees" / REL / "overlay.tar.gz").exists()  # the orchestrator's "upstream" variant


def _this_python_twins(pins: dict[str, dict[str, str]], folder: Path) -> list[Path]:
    """The pinned wheels built for another Python (cp312: the image's), downloaded at the
    same version for this interpreter: they stand first on the path, so that the walk
    below loads the bundle's versions of everything, compiled or not."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    here = set(sys_tags())
    wanted = {}
    for group in pins.values():
        for dist, ver in group.items():
            wheel = wheels.find_wheel(wheels.wheel_cache(), dist, ver)
            if not set(parse_wheel_filename(wheel.name)[3]) & here:
                wanted[dist] = ver
    cache = wheels.wheel_cache() / f"this-python-{sys.version_info.major}{sys.version_info.minor}"
    cache.mkdir(parents=True, exist_ok=True)
    missing = [f"{d}=={v}" for d, v in wanted.items() if wheels.find_wheel(cache, d, v) is None]
    if missing:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(cache),
                *missing,
            ],
            check=True,
            capture_output=True,
        )
    folder.mkdir(parents=True, exist_ok=True)
    for dist, ver in wanted.items():
        with zipfile.ZipFile(wheels.find_wheel(cache, dist, ver)) as zf:
            zf.extractall(folder)
    return [folder]


@pytest.mark.behaviour
@pytest.mark.trees
@needs_wheels
def test_the_017_tree_imports_the_engine_path_from_the_bundle_site(built, tmp_path):
    from gpu_e2e import orchestrate

    dest, manifest = built
    trees = orchestrate.prepare_trees(dest, REL, tmp_path / "trees")
    assert set(trees) == {"upstream"}
    site = [orchestrate.unpacked_site(dest, g, tmp_path / "work") for g in (REL, "common")]
    path = [*_this_python_twins(manifest["pins"], tmp_path / "twins"), *site]
    result = coverage.engine_path_imports(trees["upstream"], REL, site=path)
    assert "error" not in result, result.get("error")
    assert coverage.uncovered(result, REL) == []
    assert "xgrammar" in result["modules"] and "transformers" in result["modules"]
    # the bundle's versions, not the CPU environment's
    assert coverage.present_modules(trees["upstream"]) == [
        m for m in coverage.ENGINE_PATH_MODULES if m != "sglang.srt.speculative.eagle_info_v2"
    ]
    probe = (
        "import sys, json, dataclasses, importlib.metadata as md, transformers;"
        "sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]);"
        "import sglang_cpu_env as env; env.install_import_stubs(sys.argv[1] + '/sglang');"
        "from sglang.srt.server_args import ServerArgs;"
        "print(json.dumps({'fields': sorted(f.name for f in dataclasses.fields(ServerArgs)),"
        "'versions': [md.version(d) for d in ('transformers', 'xgrammar', 'apache-tvm-ffi')],"
        "'transformers': transformers.__file__}))"
    )
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, path)))
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(trees["upstream"]), str(Path(__file__).resolve().parents[1])],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["versions"] == ["5.12.1", "0.2.1", "0.1.11"]
    assert got["transformers"].startswith(str(site[0]))  # the bundle's, not the CPU environment's 5.6.0
    for kwargs in _harness_kwargs(tmp_path):
        named, _ = server_args_names.for_fields(kwargs, got["fields"])
        assert set(named) <= set(got["fields"]), set(named) - set(got["fields"])


def test_decode_steps_are_the_workers_where_no_prepare_for_decode_is_counted():
    pfd = "call|sglang.srt.speculative.eagle_info_v2:EagleDraftInputV2Mixin.prepare_for_decode"
    worker = "call|sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2.forward_batch_generation@"
    # up to 0.5.13: prepare_for_decode's calls, whatever the worker counted
    assert timed_calls.decode_steps_of({pfd: 64, worker + "decode": 64, worker + "extend": 1}) == (
        64,
        "prepare_for_decode",
    )
    # 0.5.17 (no eagle_info_v2): the worker's decode calls, not its prefills
    assert timed_calls.decode_steps_of({worker + "decode": 70, worker + "extend": 1}) == (70, "worker")
    assert timed_calls.decode_steps_of({}) == (0, None)


def test_the_renamed_settings_are_read_back_from_the_engine():
    from gpu_e2e import engine_facts

    assert {new for new, _ in server_args_names.RENAMED.values()} <= set(engine_facts.SERVER_FIELDS)


PLAN = Path(__file__).resolve().parents[2] / "gpu_e2e" / "yardstick_plan.sh"
STUB = """
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
with open(os.environ["PK_PLAN_LOG"], "a") as fh:
    fh.write(json.dumps({"bundle": Path.cwd().name, "args": args,
                         "counters_off": os.environ.get("PK_E2E_COUNTERS_OFF", "")}) + "\\n")
print("verdict: stub")
"""


def _run_plan(tmp_path, steps: str, **extra: str) -> list[dict]:
    """plan.sh over stub bundles (each orchestrate call logged), with STEPS ``steps``."""
    import os

    log = tmp_path / "calls.jsonl"
    for name in ("b12", "b17"):
        (tmp_path / name / "e2e" / "pk_gpu_e2e").mkdir(parents=True)
        (tmp_path / name / "e2e" / "pk_gpu_e2e" / "__init__.py").write_text("")
        (tmp_path / name / "e2e" / "pk_gpu_e2e" / "orchestrate.py").write_text(STUB)
        (tmp_path / name / "manifest.json").write_text("{}")
    for name in ("fa3", "fa3_17"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "fa3.json").write_text("{}")
    bin_dir = tmp_path / "bin"  # the plan's python3 is this interpreter
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = dict(
        os.environ,
        R=str(tmp_path / "run"),
        B12=str(tmp_path / "b12"),
        B17=str(tmp_path / "b17"),
        FA3_12=str(tmp_path / "fa3" / "lib.so"),
        FA3_17=str(tmp_path / "fa3_17" / "lib.so"),
        PK_PLAN_LOG=str(log),
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        STEPS=steps,
        **extra,
    )
    done = subprocess.run(["bash", str(PLAN)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "all done" in (tmp_path / "run" / "progress.log").read_text()
    return [json.loads(line) for line in log.read_text().splitlines()]


def _arg(call: dict, name: str) -> str:
    return call["args"][call["args"].index(name) + 1]


def test_the_yardstick_plan_runs_abba_rounds_of_each_bundle_with_its_own_fa3(tmp_path):
    calls = _run_plan(tmp_path, "fa3-r1 triton-r1 fa3-r2 fa3-r3 triton-r2 triton-r3")  # the second session's
    order = [
        (c["bundle"], c["args"][c["args"].index("--label") + 1], c["args"][c["args"].index("--attention-backend") + 1])
        for c in calls
    ]
    # FA3 round 1, Triton round 1, then the other rounds (plan.sh's STEPS, since 8b4dc09)
    assert order == [
        ("b12", "r1", "default"),
        ("b17", "r1", "default"),
        ("b12", "r1", "triton"),
        ("b17", "r1", "triton"),
        ("b17", "r2", "default"),
        ("b12", "r2", "default"),
        ("b12", "r3", "default"),
        ("b17", "r3", "default"),
        ("b17", "r2", "triton"),
        ("b12", "r2", "triton"),
        ("b12", "r3", "triton"),
        ("b17", "r3", "triton"),
    ]
    for c in calls:
        a = c["args"]
        r1 = a[a.index("--label") + 1] == "r1"  # round 1 adds bs 48, above cuda_graph_max_bs 32 (eager)
        assert a[a.index("--batch-sizes") + 1] == ("1,8,32,48" if r1 else "1,8,32")
        assert a[a.index("--sizes") + 1] == "small"
        release = a[a.index("--releases") + 1]
        assert release == {"b12": "0.5.12.post1", "b17": "0.5.17"}[c["bundle"]]
        if "--fa3-lib" in a:  # each bundle its own sglang-kernel's FA3
            assert Path(a[a.index("--fa3-lib") + 1]).parent.name == {"b12": "fa3", "b17": "fa3_17"}[c["bundle"]]
        else:
            assert a[a.index("--attention-backend") + 1] == "triton"
        if c["bundle"] == "b12":  # pristine beside patched in round 1 only
            r1 = a[a.index("--label") + 1] == "r1"
            assert a[a.index("--variants") + 1] == ("pristine,patched" if r1 else "patched")
        assert c["counters_off"] == ""


def test_the_plan_s_counters_off_and_8b_steps(tmp_path):
    """``_off``: counters off, round 1 profiled at bs 8 with pristine; ``_8b``: the 8B shape;
    ``_8boff``: both, round 1 profiled at bs 32 (the last batch size)."""
    calls = _run_plan(tmp_path, "fa3_off-r1 triton_8b-r1 fa3_8boff-r1 triton_8boff-r2")
    seen = [
        (
            c["bundle"],
            _arg(c, "--sizes"),
            c["counters_off"],
            _arg(c, "--profile-batch") if "--profile-batch" in c["args"] else None,
            _arg(c, "--variants") if "--variants" in c["args"] else None,
        )
        for c in calls
    ]
    assert seen == [
        ("b12", "small", "1", "8", "pristine,patched"),
        ("b17", "small", "1", "8", None),
        ("b12", "8b", "", None, "patched"),
        ("b17", "8b", "", None, None),
        ("b12", "8b", "1", "32", "patched"),
        ("b17", "8b", "1", "32", None),
        ("b17", "8b", "1", None, None),
        ("b12", "8b", "1", None, "patched"),  # r2: 0.5.17 first
    ]
    assert all(_arg(c, "--batch-sizes") == "1,8,32" for c in calls)


def test_the_plan_without_profiles_keeps_every_other_argument(tmp_path):
    """NO_PROFILE (sixth lease): the round-1 steps lose their profiled generate only;
    VARIANTS12=patched runs the patched tree alone, with no pristine."""
    calls = _run_plan(tmp_path, "fa3_8boff-r1 triton_off-r1 fa3-r1", NO_PROFILE="1", VARIANTS12="patched")
    assert [c["bundle"] for c in calls] == ["b12", "b17"] * 3
    assert not any("--profile-batch" in c["args"] for c in calls)
    assert {_arg(c, "--variants") for c in calls if c["bundle"] == "b12"} == {"patched"}
    assert _arg(calls[4], "--engine-extra") == '{"cuda_graph_max_bs": 32}'  # kept whole
    assert [_arg(c, "--sizes") for c in calls] == ["8b", "8b", "small", "small", "small", "small"]


def test_bundle_release_0_5_17_carries_the_yardstick_as_published():
    """`bundle --release 0.5.17` (issue 57's wording) builds the reference bundle: 0.5.17
    has no pristine/patched pair to measure, only upstream's own tree."""
    from gpu_e2e import bundle

    assert bundle.carried(["0.5.17"], []) == ([], ["0.5.17"])
    assert bundle.carried(["0.5.12.post1", "0.5.17"], ["0.5.17"]) == (["0.5.12.post1"], ["0.5.17"])
    assert bundle.carried(["0.5.13"], ["0.5.13"]) == (["0.5.13"], ["0.5.13"])  # both, as before


def test_the_plan_s_per_patch_ab_runs_both_trees_of_b12_in_abba_order(tmp_path, monkeypatch):
    """VARIANTS12: every step's B12 call runs the minus tree beside the patched one, the
    order flipping in round 2, the comparison always minus against patched."""
    ab = "minus-verify-wait-on-stream,patched"
    monkeypatch.setenv("VARIANTS12", ab)
    calls = _run_plan(tmp_path, "fa3_8boff-r1 triton_8boff-r2 fa3_8b-r3")
    b12 = [(_arg(c, "--label"), _arg(c, "--variants"), _arg(c, "--compare")) for c in calls if c["bundle"] == "b12"]
    assert b12 == [
        ("r1", ab, ab),
        ("r2", "patched,minus-verify-wait-on-stream", ab),
        ("r3", ab, ab),
    ]
    assert [c["bundle"] for c in calls] == ["b12", "b17", "b17", "b12", "b12", "b17"]
    assert all("--compare" not in c["args"] for c in calls if c["bundle"] == "b17")
