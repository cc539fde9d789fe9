"""GPU side: several trees' engines alive on one GPU, their generates interleaved (issue 67).

    cd BUNDLE && PYTHONPATH=e2e python3 -m pk_gpu_e2e.duel --out OUT --work W \\
        --engine pristine=.:0.5.12.post1:pristine --engine patched=.:0.5.12.post1:patched \\
        --engine patched-again=.:0.5.12.post1:patched --engine upstream=/tmp/b17:0.5.17:upstream \\
        --size small --attention-backend default --fa3-lib .:/tmp/pk_fa3/flash_ops.abi3.so ...

Why: one engine after another (:mod:`.orchestrate`) puts each tree in its own process at its own time,
and the grid's second run found the host's speed differing by process and by minute far more than the 2%
the issue asks to resolve (docs/research/eager-speed-profile.md). Here every engine starts once
(``runner --serve``, :mod:`.duel_serve`), all at the same time on the same GPU, and the driver then
times one generate at a time, tree after tree, batch size by batch size, the order reversed every round
(ABBA). Only the engine being timed runs: the driver freezes the others' process groups (SIGSTOP; an
idle sglang scheduler spins on its sockets and would take a core), so each call has the host to itself,
as a lone engine would.

``patched-again`` (a second engine of the patched tree) is the control: its ratio to
``patched`` is the measure's own noise, the floor any other ratio is read against.

Writes ``duel.json`` (every call, rewritten after each) and ``duel.md``
(:mod:`.duel_report`) under ``--out``, and each engine's output as ``engine-NAME.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Client, Connection
from pathlib import Path

from . import (
    bundle_kernels,
    cpu_lanes,
    dp,
    duel_report,
    duel_serve,
    engine_env,
    fa3_kernel,
    host_usage,
    launch,
    py_stacks,
)
from .orchestrate import _device
from .unpack import log, prepare_trees, unpacked_site


def parse_engine(spec: str) -> dict:
    """``NAME=BUNDLE:RELEASE:TREE[:KEY=VALUE,...]`` (TREE: pristine, patched or upstream; the
    variables go to this engine's processes alone, as ``--engine-env`` does in the
    orchestrator: e.g. one tree timed with a runtime switch off and on)."""
    name, sep, rest = spec.partition("=")
    parts = rest.split(":", 3)
    if not sep or not name or len(parts) not in (3, 4) or not all(parts):
        raise SystemExit(f"--engine {spec!r}: expected NAME=BUNDLE:RELEASE:TREE[:KEY=VALUE,...]")
    env = engine_env.parse(parts[3].split(",")) if len(parts) == 4 else {}
    return {"name": name, "bundle": parts[0], "release": parts[1], "tree": parts[2], "env": env}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[2])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/pk_duel")
    ap.add_argument("--engine", action="append", required=True, type=parse_engine, help="NAME=BUNDLE:RELEASE:TREE")
    ap.add_argument("--fa3-lib", action="append", default=[], help="BUNDLE:PATH (FA3 library for that bundle's trees)")
    ap.add_argument("--size", default="small")
    ap.add_argument("--scenario", default="eagle3", help="eagle3 (Llama sizes) or mtp (DeepSeek sizes)")
    ap.add_argument("--tp", type=int, default=1, help="tp_size of every engine (all visible GPUs hold each one)")
    dp.add_arguments(ap)
    ap.add_argument(
        "--serial-start",
        action="store_true",
        help="start each engine once the one before is up (default at --tp > 1: sglang refuses a start "
        "that sees its GPUs' free memory differ, as engines loading side by side make it)",
    )
    ap.add_argument("--attention-backend", default="default")
    ap.add_argument("--batch-sizes", default="1,8,32,64,128")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmups", type=int, default=1, help="untimed generates per engine and batch size first")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="generates per engine, batch size and round, back to back while it is thawed; the round "
        "takes their median (2026-11-28g: one generate's rate moved up to 2x between rounds)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--mem-fraction-static", type=float, default=0.85)
    ap.add_argument(
        "--engine-extra",
        default="{}",
        help="JSON Engine settings for every engine; give max_total_tokens (engines share the GPU), port is per engine",
    )
    ap.add_argument("--base-port", type=int, default=31000)
    ap.add_argument("--start-timeout", type=int, default=600)
    ap.add_argument("--call-timeout", type=int, default=300)
    ap.add_argument("--compare", default=",".join(duel_report.DEFAULT_PAIRS), help="BASE:OTHER pairs, comma list")
    ap.add_argument("--deadline-s", type=int, default=0, help="> 0: no round starts after this many seconds")
    # 2026-11-28h: a TP 4 duel's serial start-up and warm-ups took 423 s, 3 s past its deadline: it ran none
    ap.add_argument("--min-rounds", type=int, default=0, help="rounds that start past --deadline-s too")
    ap.add_argument("--rotate", action="store_true", help="every engine takes every place in a round in turn")
    ap.add_argument("--py-spy", type=py_stacks.program, help="py-spy's program: timed calls sampled (py_stacks.py)")
    ap.add_argument("--py-spy-rounds", type=int, default=0, help="> 0: only the first N rounds sampled")
    ap.add_argument("--cpus", type=cpu_lanes.allowed, help="CPU list every engine's threads are held to once up")
    ap.add_argument(
        "--once",
        action="append",
        default=[],
        metavar="NAME",
        help="an engine timed in the first round only (e.g. one with the counters on, whose times are "
        "not compared: its host waits per step are what it is there for)",
    )
    return ap


class Engine:
    """One runner process and its engine: started, frozen, thawed, asked, stopped."""

    def __init__(self, name: str, proc: subprocess.Popen, addr: Path, key: bytes, log_path: Path):
        self.name, self.proc, self.addr, self.key, self.log_path = name, proc, addr, key, log_path
        self.conn: Connection | None = None
        self.ready: dict | None = None
        self.failure: str | None = None
        self.start_s: float | None = None

    def poll_ready(self) -> bool:
        """Connect once the runner's socket is there: True when up."""
        if self.conn is None and self.addr.exists():
            try:
                conn = Client(str(self.addr), family="AF_UNIX", authkey=self.key)
            except ConnectionRefusedError:  # bound, not listening yet
                return False
            self.ready = conn.recv()["ready"]
            self.conn = conn
        return self.conn is not None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def call(self, message: dict, timeout: float, freeze: bool = True, sample: tuple | None = None) -> dict:
        """One request to the thawed engine, frozen again after it unless ``freeze`` is False
        (the next call of a burst follows at once); ``sample``: (py-spy's program, the file it writes)."""
        assert self.conn is not None, "called before it was up"
        self.signal(signal.SIGCONT)
        spy = py_stacks.Sampler(sample[0], self.proc.pid, sample[1]) if sample else None
        usage = host_usage.Call(self.proc.pid)
        try:
            self.conn.send(message)
            if not self.conn.poll(timeout):
                return {"error": f"no answer in {timeout:.0f} s"}
            got = self.conn.recv()
            # the host's steal, the engine's own CPU time and instructions over the call (host_usage.py)
            return {**got, "host": usage.end()}
        except (EOFError, OSError) as exc:  # the runner died mid-call (2026-11-28e: DSA pristine's
            # illegal address): its failure is recorded and the other engines go on
            return {"error": f"engine gone ({type(exc).__name__}); see {self.log_path.name}"}
        finally:
            usage.close()
            if spy is not None:
                spy.stop()
            if freeze:
                self.signal(signal.SIGSTOP)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        if self.conn is not None:
            try:
                self.conn.send({"op": "stop"})
            except OSError:
                pass
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()


def prepared(specs: list[dict], fa3_libs: dict[str, str], work: Path) -> dict:
    """Each (bundle, release) unpacked once: its trees, sites and manifest entry."""
    done: dict = {}
    for spec in specs:
        key = (spec["bundle"], spec["release"])
        if key in done:
            continue
        bundle = Path(spec["bundle"]).resolve()
        bwork = work / f"b{len({b for b, _ in done})}-{bundle.name}"
        manifest = json.loads((bundle / "manifest.json").read_text())
        site_common = unpacked_site(bundle, "common", bwork)
        for member in bundle_kernels.install(bundle, site_common):
            log(f"{member} installed from {bundle} (sha256 checked)")
        site_rel = unpacked_site(bundle, spec["release"], bwork)
        if spec["bundle"] in fa3_libs:
            kernel_site = site_rel if (site_rel / "sgl_kernel").is_dir() else site_common
            fa3 = fa3_kernel.install(Path(fa3_libs[spec["bundle"]]), kernel_site)
            log(f"FA3 kernels for {spec['release']} (sglang-kernel {fa3['sglang_kernel']}, sha256 checked)")
        done[key] = {
            "bundle": bundle,
            "info": manifest["releases"][spec["release"]],
            "trees": prepare_trees(bundle, spec["release"], bwork / "trees"),
            "site_rel": site_rel,
            "site_common": site_common,
            "patchkit_commit": manifest.get("patchkit_commit"),
        }
    return done


def start(spec: dict, where: dict, args, index: int, work: Path, out: Path) -> Engine:
    tree = where["trees"].get(spec["tree"])
    if tree is None:
        raise SystemExit(
            f"{spec['name']}: no {spec['tree']} tree in {where['bundle']} (has {', '.join(where['trees'])})"
        )
    addr = work / f"duel-{spec['name']}.sock"
    addr.unlink(missing_ok=True)
    # a lane's --work outlives its duels: an earlier duel's dumps under the same engine name
    # were read as this engine's facts (2026-11-28d's FlashInfer counted engines showed FA3's)
    sync_dir = work / "syncs" / spec["name"]
    shutil.rmtree(sync_dir, ignore_errors=True)
    key = secrets.token_bytes(16)
    env = launch.runner_env(
        tree=tree,
        tree_name=spec["tree"],
        site_rel=where["site_rel"],
        site_common=where["site_common"],
        bundle=where["bundle"],
        info=where["info"],
        sync_dir=sync_dir,
        asked_env=spec.get("env") or {},
    )
    env[duel_serve.ENV_ADDR], env[duel_serve.ENV_KEY] = str(addr), key.hex()
    extra = {**json.loads(args.engine_extra), "port": args.base_port + 100 * index}
    if args.tp == 1 and args.dp == 1:
        # torch.distributed's port too: sglang picks a free one at start, and engines starting
        # together raced for it (2026-11-28e: FlashInfer 8B's patched engine, EADDRINUSE)
        extra["nccl_port"] = extra["port"] + 50
    cmd = [
        *(sys.executable, "-m", "pk_gpu_e2e.runner", "--serve"),
        *("--tree-parent", str(tree), "--variant", spec["name"], "--size", args.size, "--scenario", args.scenario),
        *("--tp", str(args.tp), *dp.forwarded(args)),
        *("--batch-sizes", args.batch_sizes, "--max-new-tokens", str(args.max_new_tokens)),
        *("--input-len", str(args.input_len), "--attention-backend", args.attention_backend),
        *("--mem-fraction-static", str(args.mem_fraction_static), "--engine-extra", json.dumps(extra)),
        *("--models-dir", str(work / f"models-{spec['name']}"), "--out", str(out / f"runner-{spec['name']}.json")),
    ]
    # models per engine: the runners write them at the same time (the draft's checkpoint too)
    log_path = out / f"engine-{spec['name']}.log"
    fh = open(log_path, "w")  # noqa: SIM115  the child keeps it open
    proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    log(f"start {spec['name']}: {spec['release']} {spec['tree']} {spec.get('env') or ''} (pid {proc.pid})")
    return Engine(spec["name"], proc, addr, key, log_path)


def wait_up(engines: list[Engine], timeout: float) -> None:
    """Every engine up (then frozen) or failed; the others' start-up goes on meanwhile."""
    t0 = time.monotonic()
    waiting = list(engines)
    while waiting and time.monotonic() - t0 < timeout:
        for e in list(waiting):
            if e.poll_ready():
                e.start_s = round(time.monotonic() - t0, 1)
                e.signal(signal.SIGSTOP)
                log(f"{e.name} up in {e.start_s} s (frozen until its calls)")
                waiting.remove(e)
            elif e.proc.poll() is not None:
                e.failure = f"exited rc={e.proc.returncode} before it was up (see {e.log_path.name})"
                waiting.remove(e)
        time.sleep(0.5)
    for e in waiting:
        e.failure = f"not up in {timeout:.0f} s"


def order_of(names: list[str], round_no: int, rotate: bool = False) -> list[str]:
    """ABBA: the engines in their order in even rounds, reversed in odd ones. ``rotate``
    (--rotate) also shifts the order one engine every two rounds, so that each of three or
    more engines takes every place in turn (ABBA keeps the middle ones in the middle: the
    tenth run's patched engine ran second in all 37 rounds)."""
    k = (round_no // 2) % len(names) if rotate and names else 0
    names = names[k:] + names[:k]
    return list(names) if round_no % 2 == 0 else list(reversed(names))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    names = [s["name"] for s in args.engine]
    if len(set(names)) != len(names):
        raise SystemExit(f"--engine names repeat: {', '.join(names)}")
    if set(args.once) - set(names):
        raise SystemExit(f"--once {', '.join(sorted(set(args.once) - set(names)))}: no such --engine")
    fa3_libs = dict(x.split(":", 1) for x in args.fa3_lib)
    places = prepared(args.engine, fa3_libs, work)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    result: dict = {
        "device": _device(),
        "args": {k: v for k, v in vars(args).items()},
        "patchkit_commit": {s["name"]: places[(s["bundle"], s["release"])]["patchkit_commit"] for s in args.engine},
        "patched_files_sha256": {
            s["name"]: _overlay(places[(s["bundle"], s["release"])]["bundle"], s["release"], s["tree"])
            for s in args.engine
        },
        "engines": {},
        "calls": [],
    }
    t_plan = time.monotonic()
    engines: list[Engine] = []
    try:
        if args.serial_start or args.tp > 1:
            for i, s in enumerate(args.engine):
                engines.append(start(s, places[(s["bundle"], s["release"])], args, i, work, out))
                wait_up(engines[-1:], args.start_timeout)
        else:
            engines = [
                start(s, places[(s["bundle"], s["release"])], args, i, work, out) for i, s in enumerate(args.engine)
            ]
            wait_up(engines, args.start_timeout)
        live = [e for e in engines if e.failure is None]
        for e in engines:
            result["engines"][e.name] = {"start_s": e.start_s, "failure": e.failure, "ready": e.ready}
            if args.cpus and e in live:  # held there from the warm-up on (cpu_lanes.pin_group)
                result["engines"][e.name]["pinned"] = cpu_lanes.pin_group(e.proc.pid, args.cpus)
        _write(out, result, args)
        for e in live:  # warm-up: each batch size once per engine (JIT, allocator), untimed
            for bs in batch_sizes * args.warmups:
                got = e.call({"op": "generate", "batch_size": bs}, args.call_timeout)
                if "error" in got:
                    e.failure = f"warm-up bs {bs}: {got['error']}"
                    break
            log(f"{e.name} warmed up" + (f": {e.failure}" if e.failure else ""))
        for r in range(args.rounds):
            if args.deadline_s and r >= args.min_rounds and time.monotonic() - t_plan > args.deadline_s:
                log(f"deadline: round {r + 1} not started")
                break
            by_name = {e.name: e for e in engines if e.failure is None and (r == 0 or e.name not in args.once)}
            for bs in batch_sizes:
                for name in order_of([n for n in names if n in by_name], r, args.rotate):
                    e = by_name[name]
                    for k in range(args.repeats):  # thawed once: the first generate of a burst is repeat 1
                        last = k == args.repeats - 1
                        spy = py_stacks.sample_of(args, out, name, bs, r + 1, k + 1)
                        got = e.call({"op": "generate", "batch_size": bs}, args.call_timeout, freeze=last, sample=spy)
                        repeat = {"repeat": k + 1} if args.repeats > 1 else {}
                        result["calls"].append({"round": r + 1, "batch_size": bs, "engine": name, **repeat, **got})
                        if "error" in got:
                            e.failure = f"round {r + 1} bs {bs}: {got['error']}"
                            e.signal(signal.SIGSTOP)
                            break
            log(f"round {r + 1} done")
            _write(out, result, args)
    finally:
        specs = {s["name"]: s for s in args.engine}
        for e in engines:
            e.stop()
            entry = result["engines"].setdefault(e.name, {})
            entry["failure"] = e.failure
            if specs[e.name].get("env"):
                entry.update(engine_env.arrived(out / f"runner-{e.name}.json", specs[e.name]["env"]))
        _write(out, result, args)
    print((out / "duel.md").read_text())
    return 0 if all(e.failure is None for e in engines) else 1


def _overlay(bundle: Path, release: str, tree: str) -> dict:
    """The sha256 of each file the engine's tree changes: none for pristine (and the published
    upstream tree), ``overlay.json`` for patched, ``overlay-minus-ID.json`` for a minus tree
    (2026-11-28c recorded the patched tree's files for every engine of a bundle)."""
    if tree in ("pristine", "upstream"):
        return {}
    path = bundle / "trees" / release / ("overlay.json" if tree == "patched" else f"overlay-{tree}.json")
    return json.loads(path.read_text()) if path.exists() else {}


def _write(out: Path, result: dict, args) -> None:
    """duel.json and duel.md, as far as the calls go."""
    result["summary"] = duel_report.summary(result["calls"], duel_report.pairs_of(args.compare), _eager_above(args))
    (out / "duel.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
    (out / "duel.md").write_text(duel_report.markdown(result))


def _eager_above(args) -> int:
    """Batches above the captured limit run eager: the Engine's cuda_graph_max_bs as asked."""
    return int(json.loads(args.engine_extra).get("cuda_graph_max_bs", 0)) or max(
        int(b) for b in args.batch_sizes.split(",")
    )


if __name__ == "__main__":
    sys.exit(main())
