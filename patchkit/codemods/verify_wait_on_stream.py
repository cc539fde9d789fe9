"""sglang #25879 (0.5.13): the schedule stream waits for the previous verify, not the host.

Under the overlap scheduler, spec v2 prepares step N+1 while step N runs. The
batch's ``seq_lens`` for N+1 are step N's verify output, so the schedule
stream's work on them must come after that verify: 0.5.4 .. 0.5.12.post1 order
it with ``ScheduleBatch.maybe_wait_verify_done``, a host wait
(``verify_done.synchronize()``) at the top of ``filter_batch``, of spec-v2
``prepare_for_decode`` and of ``merge_batch``. Every decode step the host
stopped until the GPU had finished step N's draft and verify, so the next
step's preparation could only overlap step N's draft extend (docs/gpu.md,
issue 57: 3.00 event waits a step against 0.5.17's 1.00; idle gaps 2.36 against
1.15 ms a step at the 8B shape).

Upstream 0.5.13 relays ``seq_lens`` through ``FutureMap`` and waits for its
publish event **on the stream** (``publish_ready.wait()``; ROCm keeps
``synchronize()``, "Event.wait() regresses TPOT on AMD MI355"), unchanged in
that respect through 0.5.23. The relay itself is a rewrite of the overlap
scheduler and is not carried; its ordering is: the wait becomes the runtime's
``wait_event_on_stream(EVENT)`` (``Event.wait()`` on CUDA, the host wait
elsewhere). Every reader of those ``seq_lens`` is then ordered on the GPU: the
schedule stream's own kernels queue behind the wait, the forward waits for the
schedule stream (``forward_stream.wait_stream``), and a copy to the host (the
CPU mirror, where a backend still needs it) is queued behind the wait too, so
the host reads the verified values; it blocks there, and only there.

Two parts:

* ``managers/schedule_batch.py``: the ``EVENT.synchronize()`` of an event
  named ``verify_done`` inside ``maybe_wait_verify_done`` (0.5.4 ..
  0.5.12.post1). A vendor's own ``verify_done.wait()`` is the change done its
  way. 0.5.13+ has no such method (superseded there).
* ``managers/overlap_utils.py``: checked, not changed. ``FutureMap`` waiting on
  its publish event (0.5.13+) is upstream's change: done, so the patch reads
  native there; before, superseded (the wait lives in schedule_batch.py).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCheck, Finding, MethodCodemod
from patchkit.codemods.common.primitives import call
from patchkit.codemods.common.reads import Reads
from patchkit.codemods.common.shared import RUNTIME, code_of

WAIT = "wait_event_on_stream"
#: The event: ``X.verify_done``, or a local of that name (``verify_done = getattr(X, "verify_done", None)``).
VERIFY_DONE = primitives.attr("verify_done") | m.Name("verify_done")
#: ``EVENT.synchronize()`` as a statement: the host wait (a fork's ``else:`` branch included).
HOST_WAIT = primitives.line(m.Expr(value=primitives.method_call("synchronize", VERIFY_DONE)))
#: ``EVENT.wait()`` or ``STREAM.wait_event(EVENT)``: a stream wait the tree wrote itself.
OWN_STREAM_WAIT = primitives.method_call("wait", VERIFY_DONE) | m.Call(
    func=primitives.attr("wait_event"), args=[m.Arg(value=VERIFY_DONE)]
)
ON_STREAM = call(WAIT)
#: ``FutureMap``'s wait for its publish event on the stream (upstream, 0.5.13+).
PUBLISH_WAIT = primitives.method_call("wait", primitives.attr("publish_ready"))


class VerifyWaitOnStream(MethodCodemod):
    DESCRIPTION = (
        "ScheduleBatch.maybe_wait_verify_done: the schedule stream waits for the previous verify "
        "(wait_event_on_stream, Event.wait on CUDA), not the host (verify_done.synchronize(), every decode step)"
    )
    CLASS = "ScheduleBatch"
    METHOD = "maybe_wait_verify_done"
    WHY_ABSENT = (
        "no verify_done wait in ScheduleBatch: upstream relays seq_lens through FutureMap (sglang #25879, 0.5.13+)"
    )
    # A fork's own spelling of the host wait (the event in a local; issue 69) is what the patch moves.
    REPLACES_VENDOR = (
        (r"(\w+\.)?verify_done\.synchronize", "the host wait on the verify, moved onto the stream as in the release"),
    )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, HOST_WAIT):
            return Finding.todo(self.anchor, "the host waits for the previous verify (verify_done.synchronize())")
        if primitives.contains(fn, ON_STREAM):
            return Finding.done(self.anchor)
        own = primitives.find_all(fn, OWN_STREAM_WAIT)
        if own:
            return self.vendors_own(self.anchor, "waits for the previous verify on the stream", own[0])
        return self.missing_in(
            fn, "no verify_done.synchronize() here", "the host wait on verify_done to move it onto the stream"
        )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        def on_stream(line: cst.SimpleStatementLine) -> cst.BaseStatement:
            sync = cst.ensure_type(cst.ensure_type(line.body[0], cst.Expr).value, cst.Call)
            event = code_of(cst.ensure_type(sync.func, cst.Attribute).value)  # EVENT of EVENT.synchronize()
            (wait,) = primitives.parse_statements_with_comments(f"""
                # patchkit (sglang #25879): the schedule stream waits for the verify, not the
                # host, which goes on preparing the next step (a host wait on ROCm, as upstream).
                {WAIT}({event})
            """)
            return wait.with_changes(leading_lines=[*line.leading_lines, *wait.leading_lines])

        self.require_import(RUNTIME, WAIT)
        return primitives.replace_statements(fn, HOST_WAIT, on_stream)


class FutureMapWaitsOnStream(ClassCheck):
    DESCRIPTION = (
        "FutureMap waits for its publish event on the stream (upstream's #25879, 0.5.13+; checked, not changed)"
    )
    CLASS = "FutureMap"
    REQUIRED_TEXT = ()  # a tree without FutureMap is answered, not skipped: the wait is then elsewhere
    METHODS_READ, WORDS_READ = (), ("publish_ready",)  # the methods that wait on it
    ANCHOR = "FutureMap: the publish wait"

    @classmethod
    def reads(cls) -> Reads:
        return {cls.CLASS: cls.methods_read()}  # ``detect`` below only answers a missing class itself

    def detect(self, module: cst.Module) -> Finding:
        if primitives.find_class(module, self.CLASS) is None:
            return self._elsewhere()
        return super().detect(module)

    def _elsewhere(self) -> Finding:
        return Finding.superseded(
            self.ANCHOR,
            "the verify wait is ScheduleBatch.maybe_wait_verify_done's in this release",
        )

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        if primitives.contains(cls, PUBLISH_WAIT):
            return Finding.done(self.ANCHOR, "upstream's FutureMap relay (sglang #25879, 0.5.13+)")
        return self._elsewhere()
