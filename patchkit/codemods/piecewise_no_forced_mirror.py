"""sglang #28633: piecewise CUDA graph no longer forces the CPU seq_lens mirror.

#26128's decision kept the spec-v2 ``seq_lens`` D2H copy whenever piecewise
CUDA graph (PCG) was on. From 0.5.11 PCG stays on under EAGLE / EAGLE3 /
STANDALONE by default, so on sglang's default settings the patched decode
step still synced. Upstream dropped the rule in 0.5.14: no PCG path reads the
mirror of a spec-v2 decode batch. PCG runs only in the target's
``forward_extend`` (draft runners build none: ``init_piecewise_cuda_graphs``
returns for draft workers), its ``can_run`` refuses TARGET_VERIFY (0.5.11's
breakable runner does not, but its replay never reads the mirror), decode
batches never reach it, and the prefill batches it serves build their mirror
from host lists. The runners only hand ``forward_batch.seq_lens_cpu`` /
``seq_lens_sum`` through into the ForwardBatch they replay with.

Three parts, one per place the decision or its premise lives:

* ``model_executor/piecewise_cuda_graph_runner.py`` and
  ``breakable_cuda_graph_runner.py``: checked, not changed. A runner that
  reads the mirror other than by handing it through (a fork's own) refuses
  the patch in one line: the mirror stays under PCG there.
* ``managers/scheduler.py`` (0.5.10 .. 0.5.12.post1, where needs-cpu-seq-lens
  puts patchkit's decision): ``configure_needs_cpu_seq_lens(...,
  piecewise_reads_mirror=False)``.
* ``managers/overlap_utils.py`` (0.5.13, sglang's own decision): the
  ``if not server_args.disable_piecewise_cuda_graph: return True`` rule is
  removed, as upstream; 0.5.14+ has no rule (native).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCheck, Finding, MethodCodemod, PatchCodemod
from patchkit.codemods.common.primitives import call
from patchkit.codemods.common.shared import code_of

MIRROR = ("seq_lens_cpu", "seq_lens_sum")
DECIDE = "decide_needs_cpu_seq_lens"
CONFIGURE = call("configure_needs_cpu_seq_lens")
KEYWORD = "piecewise_reads_mirror"
WITHOUT_RULE = m.Arg(keyword=m.Name(KEYWORD), value=m.Name("False"))
#: ``if not server_args.disable_piecewise_cuda_graph: ... return True`` (any receiver).
PCG_RULE = m.If(
    test=m.UnaryOperation(operator=m.Not(), expression=m.Attribute(attr=m.Name("disable_piecewise_cuda_graph")))
)


def _handed_through(arg: cst.Arg) -> bool:
    """``seq_lens_cpu=<batch>.seq_lens_cpu``: the value goes into the
    ForwardBatch the runner replays with, unread."""
    return (
        arg.keyword is not None
        and isinstance(arg.value, cst.Attribute)
        and arg.value.attr.value == arg.keyword.value
        and arg.keyword.value in MIRROR
    )


def mirror_reads(cls: cst.ClassDef) -> list[cst.Attribute]:
    """The loads of ``.seq_lens_cpu`` / ``.seq_lens_sum`` in ``cls`` other than
    hand-overs and assignment targets."""
    is_mirror = m.Attribute(attr=m.OneOf(*(m.Name(a) for a in MIRROR)))
    passed = {id(arg.value) for arg in primitives.find_all_of(cst.Arg, cls, m.Arg()) if _handed_through(arg)}
    stored = {
        id(target.target) for target in primitives.find_all_of(cst.AssignTarget, cls, m.AssignTarget(target=is_mirror))
    }
    return [
        a for a in primitives.find_all_of(cst.Attribute, cls, is_mirror) if id(a) not in passed and id(a) not in stored
    ]


class RunnerHandsMirrorThrough(ClassCheck):
    """``CLASS`` never reads the mirror itself (checked, not changed)."""

    METHODS_READ, WORDS_READ = (), MIRROR  # the methods that name it

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}: reads of seq_lens_cpu / seq_lens_sum"
        reads = mirror_reads(cls)
        if reads:
            return self.located(
                Finding.missing(
                    anchor,
                    f"{self.where(reads[0])}: {self.CLASS} reads `{code_of(reads[0])}`; "
                    "the CPU mirror stays on under piecewise CUDA graph in this tree",
                ),
                reads[0],
            )
        return Finding.superseded(anchor, "hands the mirror through only; nothing to change in this file")


class PiecewiseRunnerHandsMirrorThrough(RunnerHandsMirrorThrough):
    DESCRIPTION = "PiecewiseCudaGraphRunner only hands seq_lens_cpu / seq_lens_sum through (checked, not changed)"
    CLASS = "PiecewiseCudaGraphRunner"


class BreakableRunnerHandsMirrorThrough(RunnerHandsMirrorThrough):
    DESCRIPTION = "BreakableCudaGraphRunner only hands seq_lens_cpu / seq_lens_sum through (checked, not changed)"
    CLASS = "BreakableCudaGraphRunner"


class ConfigureWithoutPiecewiseRule(MethodCodemod):
    DESCRIPTION = (
        f"Scheduler.init_overlap: patchkit's decision (needs-cpu-seq-lens) no longer keeps the mirror "
        f"because piecewise CUDA graph is on ({KEYWORD}=False)"
    )
    CLASS = "Scheduler"
    METHOD = "init_overlap"
    REQUIRED_TEXT = ("init_overlap",)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        calls = primitives.find_all(fn, CONFIGURE)
        if calls:
            if all(primitives.contains(c, WITHOUT_RULE) for c in calls):
                return Finding.done(self.anchor)
            return self.located(
                Finding.todo(self.anchor, "the decision keeps the mirror under piecewise CUDA graph"), calls[0]
            )
        if primitives.contains(fn, call(DECIDE)):
            return Finding.superseded(self.anchor, "the decision is sglang's own here (managers/overlap_utils.py)")
        # needs-cpu-seq-lens (required) puts the call there first, in the same apply.
        return Finding.todo(self.anchor, "no needs_cpu_seq_lens decision yet (needs-cpu-seq-lens adds it)")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        return primitives.replace_expressions(
            fn, CONFIGURE, lambda node, _: primitives.set_keyword_argument(node, KEYWORD, "False")
        )


#: What replaces the rule: ngram's full-mask verify reads the mirror whatever the
#: backend, which the piecewise rule covered on default settings (0.5.14's
#: rule, imported where it is used as 0.5.23 does: overlap_utils stays a leaf).
NGRAM_RULE = """
# patchkit (sglang #28633): piecewise CUDA graph no longer forces the mirror
# (its runners only hand it through). ngram's USE_FULL_MASK verify reads
# seq_lens_cpu per request whatever the backend: it keeps the mirror.
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
if SpeculativeAlgorithm.from_string(server_args.speculative_algorithm).is_ngram():
    return True
"""


class DropPiecewiseRule(PatchCodemod):
    DESCRIPTION = f"{DECIDE}: piecewise CUDA graph no longer forces the CPU mirror; ngram keeps it (0.5.14's rules)"

    @classmethod
    def reads(cls):
        return {DECIDE: None}  # the decision function alone

    def detect(self, module: cst.Module) -> Finding:
        self.detect_module(module)
        fn = primitives.find_function(module, DECIDE)
        if fn is None:
            return Finding.superseded(DECIDE, "the decision is patchkit's runtime here (needs-cpu-seq-lens)")
        if primitives.find_statement_index(fn, PCG_RULE) is None:
            return Finding.done(DECIDE)
        return self.located(Finding.todo(DECIDE, "keeps the mirror whenever piecewise CUDA graph is on"), fn)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        return primitives.replace_function(
            tree,
            DECIDE,
            lambda fn: primitives.replace_statements(
                fn, PCG_RULE, lambda _: cst.FlattenSentinel(primitives.parse_statements_with_comments(NGRAM_RULE))
            ),
        )
