"""sglang #25818 (in 0.5.13), carried by needs-cpu-seq-lens: ``seq_lens_sum`` is deferred.

On 0.5.10 .. 0.5.12.post1 the ScheduleBatch keeps ``seq_lens_sum`` up to date
as the batch changes: ``filter_batch`` recomputes it from the *device*
``seq_lens`` (``self.seq_lens.sum().item()``, a device-to-host sync each time a
request leaves the batch), ``merge_batch`` adds the other side's, the non-spec
``prepare_for_decode`` adds ``bs``. Upstream 0.5.13 sets it to None on those
three paths (the deferral marker) and computes it once, from the host mirror
``seq_lens_cpu``, when the forward batch is built; with no mirror (spec-v2
decode when no backend needs it) it stays None and the None-aware readers of
the rest of this patch take over.

* ``DeferFilterBatchSum``, ``DeferMergeBatchSum``, ``DeferDecodeSum``: every
  write of ``self.seq_lens_sum`` in the method that is not ``= None`` becomes
  ``self.seq_lens_sum = None``.
* ``FillDeferredSum``: ``ScheduleBatch.get_model_worker_batch`` fills a
  deferred sum from the host mirror it hands over (``seq_lens_cpu``: the
  caller's cache or the batch's own), back onto the ScheduleBatch, before it
  builds the ModelWorkerBatch. Upstream does this in ``ForwardBatch.init_new``,
  which in 0.5.13 takes the ScheduleBatch itself (``get_model_worker_batch``
  was folded into it): here ``init_new`` sees only the ModelWorkerBatch, and
  code that does arithmetic on the ScheduleBatch's sum after the forward
  batch is built (DFlash verify: ``batch.seq_lens_sum += ...``) needs the
  value on the ScheduleBatch, as upstream's write-back gives it.

With the mirror every reader gets the same integer as before: the host mirror
advances with the device ``seq_lens`` wherever the sum was kept (the spec-v2
decode already summed the mirror, in ``prepare_for_decode``).

Upstream shapes (0.5.13+): the three methods assign only ``None``: done;
``get_model_worker_batch`` is gone (folded into ``ForwardBatch.init_new``):
superseded.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.primitives import assigns_attr, assigns_name, attr, call, line, none_test

SELF_SUM = attr("seq_lens_sum", m.Name("self"))
# Any statement line writing `self.seq_lens_sum` (`=` or an augmented `+=`).
SUM_WRITE = line(m.Assign(targets=[m.AssignTarget(target=SELF_SUM)]) | m.AugAssign(target=SELF_SUM))
DEFERRED = line(assigns_attr("seq_lens_sum", value=m.Name("None"), receiver=m.Name("self")))
EAGER_WRITE = SUM_WRITE & m.DoesNotMatch(DEFERRED)

DEFERRED_SOURCE = """
# patchkit (sglang #25818): deferred; get_model_worker_batch computes the sum
# from the host mirror (no device sync here).
self.seq_lens_sum = None
"""


def _deferred(stmt: primitives.Statement) -> primitives.Statement:
    """``self.seq_lens_sum = None`` with its comment, below the statement's own
    leading lines."""
    new = primitives.parse_statements_with_comments(DEFERRED_SOURCE)[0]
    return new.with_changes(leading_lines=[*stmt.leading_lines, *new.leading_lines])


class DeferSeqLensSum(MethodCodemod):
    """One ScheduleBatch method: its eager ``seq_lens_sum`` writes become the
    deferral marker. Done when it only writes None."""

    CLASS = "ScheduleBatch"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        eager = primitives.find_all(fn, EAGER_WRITE)
        if eager:
            return Finding.todo(self.anchor, f"seq_lens_sum computed eagerly at {self.where(eager[0])}")
        if primitives.contains(fn, DEFERRED):
            return Finding.done(self.anchor)
        return Finding.superseded(self.anchor, f"{self.anchor} writes no seq_lens_sum in this tree")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        return primitives.replace_statements(fn, EAGER_WRITE, _deferred)


# The device seq_lens (any receiver): summing it is the sync filter_batch's deferral removes.
DEVICE_SEQ_LENS = m.Attribute(attr=m.Name("seq_lens"))


class DeferFilterBatchSum(DeferSeqLensSum):
    """Superseded where the tree already keeps the sum without a device sync:
    every write of it reads no device ``seq_lens`` (a fork that drops the
    mirror for spec v2 itself and refreshes the sum from the requests, or sums
    the host mirror), said once naming the vendor's line. Its value stays as
    the vendor computes it (never None here: the readers need no fill)."""

    DESCRIPTION = "ScheduleBatch.filter_batch: seq_lens_sum = seq_lens.sum().item() (a device sync) -> None (deferred)"
    METHOD = "filter_batch"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        eager = primitives.find_all(fn, EAGER_WRITE)
        if eager and not any(primitives.contains(stmt, DEVICE_SEQ_LENS) for stmt in eager):
            return self.vendors_own(self.anchor, "computes seq_lens_sum without a device sync", eager[0])
        return super().detect_in_method(fn)


class DeferMergeBatchSum(DeferSeqLensSum):
    DESCRIPTION = "ScheduleBatch.merge_batch: seq_lens_sum += other.seq_lens_sum -> None (deferred)"
    METHOD = "merge_batch"


class DeferDecodeSum(DeferSeqLensSum):
    DESCRIPTION = "ScheduleBatch.prepare_for_decode (non-spec decode): seq_lens_sum += bs -> None (deferred)"
    METHOD = "prepare_for_decode"


# -- where the forward batch is built -----------------------------------------------------------

HOST_MIRROR = assigns_name("seq_lens_cpu")  # the mirror handed over: the caller's cache or the batch's
BUILD = call("ModelWorkerBatch")
FILLED = none_test(SELF_SUM)
FILL_SOURCE = """
# patchkit (sglang #25818): filter_batch / merge_batch / prepare_for_decode
# defer seq_lens_sum; compute it here from the host mirror (no device sync).
if self.seq_lens_sum is None and seq_lens_cpu is not None:
    self.seq_lens_sum = int(seq_lens_cpu.sum())
"""


class FillDeferredSum(MethodCodemod):
    DESCRIPTION = (
        "ScheduleBatch.get_model_worker_batch: a deferred seq_lens_sum is computed from the host "
        "mirror it hands over (None without one) before the ModelWorkerBatch is built"
    )
    CLASS = "ScheduleBatch"
    METHOD = "get_model_worker_batch"
    WHY_ABSENT = "get_model_worker_batch was folded into ForwardBatch.init_new, which fills the deferred sum itself (upstream, 0.5.13+)"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, FILLED):
            return Finding.done(self.anchor)
        build = primitives.find_statement_index(fn, BUILD)
        if build is None:
            return self.missing_in(fn, "no ModelWorkerBatch(...) built here", "the construction to fill the sum before")
        mirror = primitives.find_statement_index(fn, HOST_MIRROR)
        if mirror is None or mirror > build:
            return self.missing_in(
                fn, "no local `seq_lens_cpu` before the ModelWorkerBatch", "the host mirror it hands over"
            )
        return Finding.todo(self.anchor, "a deferred seq_lens_sum is handed over as None")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        return primitives.insert_before(fn, BUILD, FILL_SOURCE)
