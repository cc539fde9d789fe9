"""sglang #28397 (0.5.14): the min_new_tokens penalty without a host sync.

``BatchedMinNewTokensPenalizer._apply`` added the stop-token penalties with
boolean-mask indexing, ``logits[mask] += penalties[mask]``: the number of
selected cells is data-dependent, so torch copies it to the host, and every
decode step of a batch holding a request with ``min_tokens > 0`` waits for
the GPU there. Upstream adds ``torch.where(mask, penalties, 0.0)`` instead:
an elementwise select with no sync, the same logits (a 0.0 where the mask is
off, so the -inf penalty of a stop token never meets a 0 factor).

Anchored by meaning: in the penalizer's ``_apply(self, LOGITS)``, an
augmented ``LOGITS[MASK] += PENALTIES[MASK]`` whose ``MASK`` the method
assigned (``MASK = (COND).expand_as(LOGITS)`` in 0.5.10 .. 0.5.13, or the
condition alone). Upstream's shape (0.5.14+: ``torch.where`` and no masked
add) is native. A vendor's own select (``logits += torch.where(...)``, in a
shape of its own) is the change done its way: superseded, naming its line.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import host_copies, primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.primitives import call
from patchkit.codemods.common.shared import code_of


def _masked_add(logits: str) -> m.AugAssign:
    """``LOGITS[<name>] += <expr>[<name>]`` (the names compared by the caller)."""
    index = m.SubscriptElement(slice=m.Index(value=m.Name()))
    return m.AugAssign(
        target=m.Subscript(value=m.Name(logits), slice=[index]),
        operator=m.AddAssign(),
        value=m.Subscript(slice=[index]),
    )


def _index_name(subscript: cst.BaseExpression) -> str:
    """``NAME`` of ``X[NAME]`` (a side of what ``_masked_add`` matched)."""
    index = cst.ensure_type(cst.ensure_type(subscript, cst.Subscript).slice[0].slice, cst.Index)
    return cst.ensure_type(index.value, cst.Name).value


def _where_added(logits: str) -> m.Call:
    """``LOGITS.add_(torch.where(...))``: the shape this codemod writes, and upstream's."""
    return m.Call(func=m.Attribute(value=m.Name(logits), attr=m.Name("add_")), args=[m.Arg(value=call("torch.where"))])


# An elementwise select of the penalties (``torch.where``) where the masked add was: no data-dependent count.
_NO_SYNC: m.MatchIfTrue[cst.BaseSmallStatement] = m.MatchIfTrue(
    lambda node: primitives.contains(node, call("torch.where"))
)


class AddPenaltyWithoutSync(MethodCodemod):
    DESCRIPTION = (
        "BatchedMinNewTokensPenalizer._apply: logits.add_(torch.where(mask, penalties, 0.0)) "
        "instead of logits[mask] += penalties[mask] (a host sync every decode step)"
    )
    CLASS = "BatchedMinNewTokensPenalizer"
    METHOD = "_apply"

    def _logits(self, fn: cst.FunctionDef) -> Optional[str]:
        params = [p.name.value for p in fn.params.params]
        return params[1] if len(params) > 1 else None

    def _site(self, fn: cst.FunctionDef):
        """(the masked add, its mask's assignment, the condition, the penalties), or None."""
        logits = self._logits(fn)
        if logits is None:
            return None
        for add in primitives.find_all_of(cst.AugAssign, fn, _masked_add(logits)):
            mask = _index_name(add.target)
            if _index_name(add.value) != mask:
                continue
            assigns = primitives.find_all_of(cst.Assign, fn, m.Assign(targets=[m.AssignTarget(target=m.Name(mask))]))
            if len(assigns) != 1 or not (self._top_level(fn, assigns[0]) and self._top_level(fn, add)):
                continue
            cond = assigns[0].value
            expand = m.Call(func=m.Attribute(attr=m.Name("expand_as")), args=[m.Arg(value=m.Name(logits))])
            if isinstance(cond, cst.Call) and isinstance(cond.func, cst.Attribute) and m.matches(cond, expand):
                cond = cond.func.value.with_changes(lpar=[], rpar=[])
            return add, assigns[0], cond, cst.ensure_type(add.value, cst.Subscript).value
        return None

    @staticmethod
    def _index(fn: cst.FunctionDef, node: cst.CSTNode) -> Optional[int]:
        """Where ``node`` is a statement of the method's own body (None inside a block)."""
        for i, stmt in enumerate(fn.body.body):
            if isinstance(stmt, cst.SimpleStatementLine) and any(small is node for small in stmt.body):
                return i
        return None

    def _top_level(self, fn: cst.FunctionDef, node: cst.CSTNode) -> bool:
        return self._index(fn, node) is not None

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        site = self._site(fn)
        if site is not None:
            return Finding.todo(self.anchor, "logits[mask] += ... copies the mask's count to the host every step")
        logits = self._logits(fn)
        if logits is not None and primitives.contains(fn, _where_added(logits)):
            return Finding.done(self.anchor)  # ours, and upstream's (0.5.14+)
        own = primitives.find_all(fn, primitives.line(_NO_SYNC))
        if own:
            # A vendor's own select (``logits += torch.where(...)``, ``masked_fill`` ...): no sync left.
            return self.vendors_own(self.anchor, "adds the stop-token penalties without a host sync", own[0])
        return self.missing_in(
            fn,
            "no masked add of the stop-token penalties (LOGITS[MASK] += PENALTIES[MASK])",
            "it to turn into a torch.where",
        )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        add, assign, cond, penalties = self._site(fn)
        logits, mask = self._logits(fn), code_of(assign.targets[0].target)
        source = f"""
            # Boolean-mask indexing (logits[mask]) forces a device-to-host sync every
            # decode step; torch.where is an elementwise select (sglang #28397).
            {mask} = {code_of(cond)}
            {logits}.add_(torch.where({mask}, {code_of(penalties)}, 0.0))
        """
        new_mask, new_add = primitives.parse_statements_with_comments(source)
        body = primitives.block_statements(fn.body)
        first, last = self._index(fn, assign), self._index(fn, add)
        assert first is not None and last is not None  # _site found them at the top level
        # Each line where it was (anything between them stays), its blank lines and comments kept.
        body[first] = new_mask.with_changes(leading_lines=[*body[first].leading_lines, *new_mask.leading_lines])
        body[last] = new_add.with_changes(leading_lines=body[last].leading_lines)
        self.require_import("torch", None)
        return fn.with_changes(body=fn.body.with_changes(body=body))


# -- the penalizers' output ids, copied to the device without a wait (sglang #28491, #28500) ---

CUMULATE = primitives.method_call("cumulate_output_tokens")
UPSTREAM_CUMULATE = primitives.method_call("cumulate_penalty_output_tokens")  # 0.5.14+


class _OutputIdsCopyWithoutWait(MethodCodemod):
    """With a penalizer active (``min_new_tokens``, a frequency or presence
    penalty), ``prepare_for_decode`` built the last output ids as
    ``torch.tensor(LIST, ..., device=D)``: a copy from pageable memory that
    blocks the host every decode step. As upstream (0.5.14), they are built
    pinned and copied ``non_blocking`` (``common.host_copies``). Anchored by
    what the ids feed: ``cumulate_output_tokens(X)``, ``X`` that tensor or a
    name the method assigned it to. 0.5.14+ calls upstream's
    ``cumulate_penalty_output_tokens()``: native."""

    METHOD = "prepare_for_decode"

    def _fed(self, fn: cst.FunctionDef) -> list[cst.BaseExpression]:
        """What each ``cumulate_output_tokens(X)`` is handed: ``X``, or the values the method assigned to it."""
        out = []
        for c in primitives.find_all_of(cst.Call, fn, CUMULATE):
            arg = c.args[0].value if c.args else None
            if isinstance(arg, cst.Name):
                out += [a.value for a in primitives.find_all_of(cst.Assign, fn, primitives.assigns_name(arg.value))]
            elif arg is not None:
                out.append(arg)
        return out

    def _sites(self, fn: cst.FunctionDef) -> list[cst.Call]:
        return [v for v in self._fed(fn) if isinstance(v, cst.Call) and host_copies.built_on_device(v) is not None]

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if self._sites(fn):
            return Finding.todo(
                self.anchor, "the penalizers' output ids are copied from pageable memory (a host wait every step)"
            )
        if primitives.contains(fn, UPSTREAM_CUMULATE):
            return Finding.done(self.anchor, "upstream's cumulate_penalty_output_tokens (0.5.14+)")
        if any(host_copies.is_pinned_copy(v) for v in self._fed(fn)):
            return Finding.done(self.anchor)
        return Finding.superseded(self.anchor, "no host list of output ids is copied for the penalizers here")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        for site in self._sites(fn):
            fn = primitives.replace_node(fn, site, host_copies.pinned_copy(site))
        self.require_import(host_copies.HELPERS, host_copies.PIN)
        return fn


class OutputIdsCopyWithoutWait(_OutputIdsCopyWithoutWait):
    __doc__ = _OutputIdsCopyWithoutWait.__doc__
    DESCRIPTION = (
        "ScheduleBatch.prepare_for_decode: the penalizers' output ids built pinned and copied non_blocking "
        "(sglang #28491), not torch.tensor(list, device=...) (a host wait every decode step)"
    )
    CLASS = "ScheduleBatch"


class SpecV2OutputIdsCopyWithoutWait(_OutputIdsCopyWithoutWait):
    __doc__ = _OutputIdsCopyWithoutWait.__doc__
    DESCRIPTION = (
        "EagleDraftInputV2Mixin.prepare_for_decode: the penalizers' output ids built pinned and copied "
        "non_blocking (sglang #28500), not torch.tensor(list, device=...) (a host wait every decode step)"
    )
    CLASS = "EagleDraftInputV2Mixin"
