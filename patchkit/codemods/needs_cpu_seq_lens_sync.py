"""sglang #26128, part 2: decide once, gate the seq_lens D2H sync.

* ``EAGLEWorkerV2.spec_v2_attn_backends`` lists the attention backends the
  spec-v2 worker runs (target/verify, multi-step draft, draft-extend graph, and
  the draft runner's own backend, which the eager draft extend uses on
  0.5.10 .. 0.5.12.post1).
* ``Scheduler.init_overlap`` takes the decision once, before it builds the
  FutureMap, with ``patchkit.runtime.configure_needs_cpu_seq_lens`` (which
  stores it for the sync owner of this process).
* The sync owner reads it: on 0.5.10 .. 0.5.12.post1 that is the
  ``batch.seq_lens_cpu = batch.seq_lens.cpu()`` assignment at the end of
  ``EagleDraftInputV2Mixin.prepare_for_decode`` (under ``FIXME(lsyin): make
  this sync optional``); on trees with the FutureMap rewrite it is
  ``FutureMap.resolve_seq_lens_cpu``. Both are found by their shape (an
  assignment to ``<batch>.seq_lens_cpu``); the one a release lacks is
  superseded there, each saying only what its own file holds (a codemod sees
  one file). When the decision is False the GPU ``seq_lens`` still advance;
  ``seq_lens_cpu`` and ``seq_lens_sum`` become None.
* A vendor fork may have removed the sync its own way: ``prepare_for_decode``
  sets ``seq_lens_cpu = None`` and a helper of its own fills the mirror
  later. There is nothing to gate: that part is superseded, naming the line,
  and the rest of the patch (flags, decision, guards) still applies. So is
  a gate of its own: an ``if`` whose one branch copies the lengths and whose
  other sets the mirror None.

Upstream shapes (0.5.13+) count as done: the property exists,
``init_overlap`` calls ``decide_needs_cpu_seq_lens``, and
``resolve_seq_lens_cpu`` tests ``self.needs_cpu_seq_lens``.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import AddMethodCodemod, Finding, MethodCodemod
from patchkit.codemods.common.primitives import assigns_attr, attr, call, line, save
from patchkit.layout import import_path

RUNTIME = import_path("runtime")


# -- the worker lists its backends ------------------------------------------------------

BACKENDS_PROPERTY = "spec_v2_attn_backends"
BACKENDS_SOURCE = f"""
@property
def {BACKENDS_PROPERTY}(self) -> tuple:
    # patchkit (sglang #26128): every attention backend this worker runs, for
    # the scheduler's needs_cpu_seq_lens decision: verify (target), multi-step
    # draft, draft-extend CUDA graph, and the draft runner's own backend (the
    # eager draft extend uses it).
    return (
        self._target_worker.model_runner.attn_backend,
        self._draft_worker.draft_attn_backend,
        self._draft_worker.draft_extend_attn_backend,
        self._draft_worker.draft_runner.attn_backend,
    )
"""


class ExposeSpecV2AttnBackends(AddMethodCodemod):
    DESCRIPTION = f"EAGLEWorkerV2.{BACKENDS_PROPERTY}: the attention backends the spec-v2 worker uses"
    CLASS = "EAGLEWorkerV2"
    METHOD = BACKENDS_PROPERTY
    SOURCE = BACKENDS_SOURCE
    AFTER = ("draft_worker",)


# -- the scheduler decides ---------------------------------------------------------------

FUTURE_MAP_BUILT = line(assigns_attr("future_map", value=m.Call()))
DECISION_CALL = call("configure_needs_cpu_seq_lens") | call("decide_needs_cpu_seq_lens")
DECISION_SOURCE = """
# patchkit (sglang #26128): decide once whether spec-v2 decode needs the CPU
# mirror of seq_lens; the code that owns the seq_lens D2H sync reads it.
configure_needs_cpu_seq_lens(self.server_args, self.draft_worker, self.tp_worker)
"""


class DecideInInitOverlap(MethodCodemod):
    DESCRIPTION = "Scheduler.init_overlap: take the needs_cpu_seq_lens decision before building the FutureMap"
    CLASS = "Scheduler"
    METHOD = "init_overlap"
    REQUIRED_TEXT = ("init_overlap",)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, DECISION_CALL):
            return Finding.done(self.anchor)
        if primitives.find_statement_index(fn, FUTURE_MAP_BUILT) is None:
            return self.missing_in(
                fn, "init_overlap builds no FutureMap", "a `self.future_map = ...(...)` construction to decide before"
            )
        return Finding.todo(self.anchor, "needs_cpu_seq_lens not decided")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(RUNTIME, "configure_needs_cpu_seq_lens")
        return primitives.insert_before(fn, FUTURE_MAP_BUILT, DECISION_SOURCE)


# -- the sync owner reads the decision -----------------------------------------------------

GATE = "not needs_cpu_seq_lens()"
GATED = call("needs_cpu_seq_lens") | m.If(
    test=m.UnaryOperation(operator=m.Not(), expression=m.Attribute(attr=m.Name("needs_cpu_seq_lens")))
)
# `batch.seq_lens_cpu = batch.seq_lens.cpu()` (or a fork's `.to("cpu", ...)`): the D2H copy,
# the device lengths and the copy in any spelling (`primitives.spelled`: casts, a batch slice).
_TO_CPU = m.Arg(value=m.SimpleString('"cpu"') | m.SimpleString("'cpu'"))
_DEVICE_LENS = primitives.spelled(attr("seq_lens"))
D2H_ASSIGN = assigns_attr(
    "seq_lens_cpu",
    receiver=save(m.Name(), "BATCH"),
    value=primitives.spelled(
        m.Call(func=m.Attribute(value=_DEVICE_LENS, attr=m.Name("cpu")))
        | m.Call(func=m.Attribute(value=_DEVICE_LENS, attr=m.Name("to")), args=[_TO_CPU, m.ZeroOrMore()]),
        slices=False,
    ),
)
D2H = line(D2H_ASSIGN)
SUM = line(assigns_attr("seq_lens_sum"))
MIRROR_WRITE = assigns_attr("seq_lens_cpu", receiver=save(m.Name(), "BATCH"))
# A fork that dropped the sync itself: `<batch>.seq_lens_cpu = None` (filled later, if at all, by its own code).
MIRROR_DROPPED = assigns_attr("seq_lens_cpu", value=m.Name("None"))

NO_MIRROR_COMMENT = (
    "# patchkit (sglang #26128): no attention backend reads the CPU mirror;\n"
    "# the GPU seq_lens are already advanced, skip the D2H copy and sum.\n"
)


def _sync_block(fn: cst.FunctionDef) -> Optional[cst.IndentedBlock]:
    """The block holding the D2H assignment as one of its statements: the
    method body, or the block a fork moved it into (outermost first)."""
    return next(
        (b for b in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock()) if _sync_run(b) is not None), None
    )


def _sync_run(block: cst.IndentedBlock) -> Optional[tuple[int, int, str]]:
    """(start, end, batch name) of the D2H assignment in ``block`` and the
    ``seq_lens_sum`` assignment right after it, if any."""
    body = block.body
    for i, stmt in enumerate(body):
        captures = m.extract(stmt, D2H)
        if captures is not None:
            end = i + 2 if i + 1 < len(body) and m.matches(body[i + 1], SUM) else i + 1
            return i, end, cst.ensure_type(captures["BATCH"], cst.Name).value
    return None


def _vendor_gate(fn: cst.FunctionDef) -> Optional[cst.CSTNode]:
    """A fork's own gate of the sync: an ``if`` one branch of which copies
    the lengths to the host and another sets the mirror None (whatever it
    tests). The None assignment, where found."""
    for node in primitives.find_all_of(cst.If, fn, m.If()):
        branches = [node.body, node.orelse.body if node.orelse is not None else None]
        copies = [b is not None and primitives.contains(b, D2H_ASSIGN) for b in branches]
        drops = [primitives.find_all(b, MIRROR_DROPPED) if b is not None else [] for b in branches]
        if (copies[0] and drops[1]) or (copies[1] and drops[0]):
            return (drops[1] or drops[0])[0]
    return None


class GateDecodeSync(MethodCodemod):
    DESCRIPTION = (
        "EagleDraftInputV2Mixin.prepare_for_decode: the seq_lens D2H copy and sum run only "
        "when needs_cpu_seq_lens(); else seq_lens_cpu / seq_lens_sum are None"
    )
    CLASS = "EagleDraftInputV2Mixin"
    METHOD = "prepare_for_decode"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, GATED):
            return Finding.done(self.anchor)
        gate = _vendor_gate(fn)
        if gate is not None:
            return self.vendors_own(self.anchor, "skips the seq_lens sync on a branch", gate)
        if _sync_block(fn) is not None:
            return Finding.todo(self.anchor, "`seq_lens_cpu = seq_lens.cpu()` runs every decode step")
        copies = primitives.find_all(fn, D2H_ASSIGN)
        if copies:
            return self.missing_in(
                fn,
                "the seq_lens copy to the host shares its line with other statements",
                "it as a statement of its own, to gate it",
                copies[0],
            )
        dropped = primitives.find_all(fn, MIRROR_DROPPED)
        if dropped:
            return self.vendors_own(self.anchor, "avoids the seq_lens sync", dropped[0])
        return Finding.superseded(self.anchor, "prepare_for_decode copies no seq_lens to the host in this tree")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(RUNTIME, "needs_cpu_seq_lens")
        block = _sync_block(fn)
        run = None if block is None else _sync_run(block)
        assert block is not None and run is not None  # detect found them
        start, end, batch = run
        no_mirror = f"{NO_MIRROR_COMMENT}{batch}.seq_lens_cpu = None\n{batch}.seq_lens_sum = None\n"
        return primitives.replace_block_statements(
            fn, block, start, end, lambda run: primitives.branch_statements(run, GATE, no_mirror)
        )


class GateFutureMapSync(MethodCodemod):
    DESCRIPTION = (
        "FutureMap.resolve_seq_lens_cpu (trees with the FutureMap rewrite): return before the "
        "D2H with seq_lens_cpu / seq_lens_sum None unless needs_cpu_seq_lens()"
    )
    CLASS = "FutureMap"
    METHOD = "resolve_seq_lens_cpu"
    WHY_ABSENT = "FutureMap has no resolve_seq_lens_cpu in this tree (it came with upstream's FutureMap rewrite)"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, GATED):
            return Finding.done(self.anchor)
        if primitives.find_statement_index(fn, MIRROR_WRITE) is None:
            return self.missing_in(fn, "no assignment to <batch>.seq_lens_cpu", "the mirror write to gate")
        return Finding.todo(self.anchor, "the seq_lens D2H runs every decode step")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(RUNTIME, "needs_cpu_seq_lens")
        write = primitives.find_all(fn, MIRROR_WRITE)[0]
        captures = m.extract(write, MIRROR_WRITE)
        assert captures is not None  # a match of MIRROR_WRITE
        batch = cst.ensure_type(captures["BATCH"], cst.Name).value
        source = (
            f"{NO_MIRROR_COMMENT}if {GATE}:\n"
            f"    {batch}.seq_lens_cpu = None\n    {batch}.seq_lens_sum = None\n    return\n"
        )
        return primitives.insert_before(fn, MIRROR_WRITE, source)
