"""The bases of needs-cpu-seq-lens's guards of the decode metrics (the scheduler
mixin's up to 0.5.12, the metrics reporter's from 0.5.13): what a metrics method
that reads no mirror, or is not there at all, means, and how upstream's own
sync-free sum is recognised.

Kept apart from ``needs_cpu_seq_lens_guards`` (one class per site) so that
module stays under the house's 400 lines; the site classes themselves stay
there, where the patch definition names them.
"""

from __future__ import annotations

import libcst as cst

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, State
from patchkit.codemods.common.primitives import ANY, attr, save
from patchkit.codemods.common.shared import MirrorGuards

# The batch's total length read from the mirror, however spelled (`int(M.sum())`, `M.sum().int().item()` ...).
MIRROR_TOTAL = primitives.host_scalar("sum", attr("seq_lens_cpu", save(ANY, "BATCH")), slices=False)


class MetricsGuards(MirrorGuards):
    """A metrics method may stop reading the mirror in a fork (it sums
    ``req.seqlen`` itself, say): nothing is left to guard there, which is the
    tree's own change, said as a note (as ``GateDecodeSync`` says of a fork
    that dropped the sync), not a missing anchor.

    Upstream moved the metrics between releases (observability/ from 0.5.10,
    ``managers/scheduler_components/metrics_reporter.py`` from 0.5.13), and
    forks carry those moves before their release does: the module is then
    no code of the release, all of it "the vendor's", though its read of the
    mirror is upstream's. The rewrite keeps the value (the same sum with the
    mirror), so it replaces that read on purpose, said in one line."""

    REPLACES_VENDOR = (
        (
            r"seq_lens_cpu",
            "the decode metrics' read of the CPU mirror (upstream's, in a module this release does not have there) "
            "becomes the same value from the requests when the mirror is dropped",
        ),
    )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        finding = super().detect_in_method(fn)
        if finding.state is State.MISSING and not self._value_reads(fn):
            return Finding.superseded(
                self.anchor_of(fn),
                f"this tree reads no CPU seq_lens mirror here ({self.where(fn)}); patchkit has nothing to guard",
                by_tree=True,
            )
        return finding

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        """A metrics method the tree does not have (a fork that carries an
        early form of upstream's move to observability/: ``log_decode_stats``
        and none of the methods that replaced it) reads nothing: nothing to
        guard there, said as a note, not a missing anchor."""
        if self.WHY_ABSENT:
            return super().detect_absent(cls)
        return Finding.superseded(
            self.anchor,
            f"this tree's {self.CLASS} has no {self.METHOD} ({self.where(cls)}), so no read of the CPU seq_lens "
            "mirror there; patchkit has nothing to guard",
            by_tree=True,
        )


UPSTREAM_DECODE_SUM = "_decode_total_seq_lens"  # the reporter's own None-aware sum (sglang #26128, 0.5.13)


class ReporterGuards(MetricsGuards):
    """The reporter's reads; a reporter with upstream's sync-free sum
    (``_decode_total_seq_lens``, 0.5.13+) is upstream's as it is."""

    CLASS = "SchedulerMetricsReporter"
    UPSTREAM_FUNCTION = UPSTREAM_DECODE_SUM

    @classmethod
    def reads(cls):  # the reporter's methods read, and upstream's top-level sum
        return {cls.CLASS: cls.methods_read(), UPSTREAM_DECODE_SUM: None}

    def detect(self, module: cst.Module) -> Finding:
        if primitives.find_function(module, UPSTREAM_DECODE_SUM) is not None:
            return Finding.done(self.anchor, f"upstream's metrics reporter ({UPSTREAM_DECODE_SUM}(), sglang #26128)")
        return super().detect(module)
