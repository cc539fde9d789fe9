"""Spec-v2 ``prepare_for_decode``: the kv-lens copies to the device without a host wait (issue 53).

``EagleDraftInputV2Mixin.prepare_for_decode`` builds each request's current
and next allocated KV lengths as host tensors (``torch.tensor(LIST, ...,
device="cpu")``) and copies them to the device every decode step: twice for
``assign_req_to_token_pool_func``, twice more for the paged allocator when
``page_size > 1``. Each ``.to(device=...)`` from pageable memory blocked the
host (measured with torch's sync debug mode on an H200, 0.5.12.post1: the
two assign copies, every step). Upstream made the copies ``non_blocking``
in 0.5.13 (with the WAR barrier's schedule stream, sglang #26380, in mind:
a blocking copy there waits a whole forward); a ``non_blocking`` copy from
pageable memory is still staged synchronously, so the patched tree also
pins the host tensors (``pin_memory_for``, shared ``common.host_copies``).

Anchored by meaning: in the method, every ``T.to(...)`` copy of a name
``T`` the method assigned from ``torch.tensor(...)`` built on the host.
Done when each copy is ``non_blocking``: pinned (ours) or upstream's own
(0.5.13, 0.5.14: from pageable memory, left as upstream wrote it; from
0.5.15 in ``eagle_utils.eagle_prepare_for_decode``, read there too).
0.5.4, 0.5.5 keep the lengths on the device: superseded there. Not
carried: upstream's copying each tensor once for both consumers (0.5.13):
two more small queued copies where ``page_size > 1``, no wait.

The draft extend of every decode step builds a ``ForwardBatch`` too
(``ForwardBatch.init_new``, forward_batch_info.py): its extend lengths
(``torch.tensor(batch.extend_seq_lens, ...).to(device, non_blocking=True)``,
the prefix lengths likewise) came from pageable memory up to 0.5.18, one
staged copy a step by torch's count; 0.5.19 pins them with
``pin_memory=is_pin_memory_available(device)``, as this patch does with the
runtime's ``pinned_tensor`` (and the two per-step copies of the same shape
under MoE expert parallelism and DP attention, pinned by 0.5.19 too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import host_copies, primitives
from patchkit.codemods.common.base import Finding, MethodCodemod, PatchCodemod


def _host_tensors(fn: cst.FunctionDef) -> dict[str, cst.Call]:
    """Names the function assigns from ``torch.tensor(...)`` built on the host."""
    out = {}
    for assign in primitives.find_all_of(
        cst.Assign, fn, m.Assign(targets=[m.AssignTarget(target=m.Name())], value=host_copies.TENSOR)
    ):
        tensor = cst.ensure_type(assign.value, cst.Call)  # as matched: NAME = torch.tensor(...)
        if host_copies.built_on_device(tensor) is None:
            out[cst.ensure_type(assign.targets[0].target, cst.Name).value] = tensor
    return out


def _copied(copy: cst.Call) -> cst.BaseExpression:
    """``X`` of the copy ``X.to(...)``."""
    return cst.ensure_type(copy.func, cst.Attribute).value


def _name(copy: cst.Call) -> str:
    """``NAME`` of one of ``_copies``: ``NAME.to(...)``."""
    return cst.ensure_type(_copied(copy), cst.Name).value


def _copies(fn: cst.FunctionDef) -> list[cst.Call]:
    """Each ``T.to(...)`` copy to a device of one of those names."""
    names = _host_tensors(fn)
    return [
        c
        for c in primitives.find_all_of(cst.Call, fn, host_copies.TO)
        if isinstance(c.func, cst.Attribute)
        and isinstance(c.func.value, cst.Name)
        and c.func.value.value in names
        and host_copies.copy_device(c) is not None
    ]


# The mixin's own base is object; to mypy, the PatchCodemod it is mixed into.
if TYPE_CHECKING:
    _Mixin = PatchCodemod
else:
    _Mixin = object


class _Copies(_Mixin):
    """Detection and rewrite of one function's kv-lens copies (the mixin's
    method up to 0.5.14, ``eagle_utils.eagle_prepare_for_decode`` after)."""

    def detect_copies(self, fn: cst.FunctionDef, anchor: str) -> Finding:
        copies = _copies(fn)
        if not copies and not primitives.contains(fn, host_copies.TENSOR):
            # 0.5.4, 0.5.5: the allocated lengths live on the device (their waits are of another shape).
            # The step waits there anyway (its lengths are read back with .cpu()): nothing of the patch is carried.
            return Finding.superseded(
                anchor, "no host tensor of kv lengths is built here (they stay on the device)", moots_patch=True
            )
        if not copies:
            return Finding.missing(
                anchor,
                f"{self.where(fn)}: no copy of a host tensor (torch.tensor(...) on the CPU) "
                "to the device; the patch needs the kv-lens copies (T.to(device=...)) to make non_blocking",
            )
        blocking = [c for c in copies if host_copies.blocks(c)]
        if blocking:
            return Finding.todo(
                anchor,
                f"{len(blocking)} blocking copy(ies) of host kv lengths to the device "
                f"(first at {self.where(blocking[0])})",
            )
        tensors = _host_tensors(fn)
        if all(host_copies.is_pinned(tensors[_name(c)]) for c in copies):
            return Finding.done(anchor)
        return Finding.done(anchor, "upstream's non_blocking copies (0.5.13+)")

    def transform_copies(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        copies, tensors = _copies(fn), _host_tensors(fn)
        pin: dict[str, cst.BaseExpression] = {}
        for c in copies:
            device = host_copies.copy_device(c)
            assert device is not None  # _copies keeps copies to a device
            pin.setdefault(_name(c), device)
        for c in [c for c in copies if host_copies.blocks(c)]:
            fn = primitives.replace_node(fn, c, host_copies.non_blocking(c))
        for name, device in pin.items():
            if not host_copies.is_pinned(tensors[name]):
                fn = primitives.replace_node(fn, tensors[name], host_copies.pinned(tensors[name], device))
        self.require_import(host_copies.HELPERS, host_copies.PIN)
        return fn


class KvLensCopiesWithoutWait(_Copies, MethodCodemod):
    DESCRIPTION = (
        "EagleDraftInputV2Mixin.prepare_for_decode: the kv-lens host tensors pinned and their copies to the "
        "device non_blocking (as 0.5.13), not .to(device=...) from pageable memory (a host wait every decode step)"
    )
    CLASS = "EagleDraftInputV2Mixin"
    METHOD = "prepare_for_decode"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        return self.detect_copies(fn, self.anchor)

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        return self.transform_copies(fn)


MOVED = "eagle_prepare_for_decode"


class MovedKvLensCopiesWithoutWait(_Copies, PatchCodemod):
    DESCRIPTION = (
        f"eagle_utils.{MOVED} (0.5.15+, where upstream moved the method): the same copies, non_blocking upstream"
    )

    @classmethod
    def reads(cls):
        return {MOVED: None}

    def detect(self, module: cst.Module) -> Finding:
        self.detect_module(module)
        fn = primitives.find_function(module, MOVED)
        if fn is None:
            return Finding.superseded(
                MOVED, "spec-v2 decode preparation is EagleDraftInputV2Mixin's (eagle_info_v2.py) here"
            )
        return self.detect_copies(fn, MOVED)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        fn = primitives.find_function(tree, MOVED)
        assert fn is not None  # detect found it
        return primitives.replace_node(tree, fn, self.transform_copies(fn))


#: ``ForwardBatch.init_new``'s per-step copies of host lists: the extend lengths (every draft
#: extend), the non-padded token count (MoE expert parallelism), the DP token counts.
PER_STEP_COPIES = (
    "extend_seq_lens",
    "extend_prefix_lens",
    "num_token_non_padded",
    "global_num_tokens_gpu",
    "global_num_tokens_for_logprob_gpu",
)
PINNED_TENSOR = host_copies.PINNED_TENSOR
# torch.tensor (the releases), torch.as_tensor (needs-cpu-seq-lens: device lengths pass), ours.
_BUILD = host_copies.TENSOR | primitives.call("torch.as_tensor") | primitives.call(PINNED_TENSOR)
_COPY = m.Assign(
    targets=[m.AssignTarget(target=m.Attribute(attr=m.Name(m.MatchIfTrue(lambda name: name in PER_STEP_COPIES))))],
    value=host_copies.TO,
)


@dataclass(frozen=True)
class _ListCopy:
    """One per-step copy of a host list: ``X.NAME = SRC.to(D, ...)``, where SRC is the
    host tensor ``BUILD(LIST, ...)``, perhaps pinned by the fork (``.pin_memory()``),
    written in place or through a local the method assigned once (``_seq_cpu = ...``)."""

    copy: cst.Call  # SRC.to(D, ...)
    build: cst.Call  # BUILD(LIST, ...)
    own_pin: Optional[cst.Call]  # the fork's BUILD(...).pin_memory(), if it pins itself

    @property
    def pinned(self) -> bool:
        return (
            self.own_pin is not None
            or m.matches(self.build, primitives.call(PINNED_TENSOR))
            or (host_copies.is_pinned(self.build))
        )

    @property
    def waits(self) -> bool:
        return host_copies.blocks(self.copy) or not self.pinned


def _list_copies(fn: cst.FunctionDef) -> dict[str, _ListCopy]:
    """Each per-step copy of a host list to the device (``_ListCopy``), by the attribute it sets."""
    copies, local = {}, primitives.Locals(fn)
    for a in primitives.find_all_of(cst.Assign, fn, _COPY):
        copy = cst.ensure_type(a.value, cst.Call)  # as matched: X.NAME = SRC.to(...)
        source = _copied(copy)
        if isinstance(source, cst.Name) and len(local.values(source)) == 1:  # through a local (a 0.5.10 fork)
            source = local.values(source)[0]
        own_pin = source if isinstance(source, cst.Call) and m.matches(source, host_copies.OWN_PIN) else None
        if own_pin is not None:
            source = _copied(own_pin)
        if (
            isinstance(source, cst.Call)
            and m.matches(source, _BUILD)
            and host_copies.built_on_device(source) is None
            and host_copies.copy_device(copy) is not None
        ):
            name = cst.ensure_type(a.targets[0].target, cst.Attribute).attr.value
            copies[name] = _ListCopy(copy, source, own_pin)
    return copies


class ExtendLensCopiesPinned(MethodCodemod):
    DESCRIPTION = (
        "ForwardBatch.init_new: the extend lengths (and the EP / DP token counts) built as pinned host "
        "tensors before their non_blocking copy (as 0.5.19), not from pageable memory (a staged copy every draft extend)"
    )
    CLASS = "ForwardBatch"
    METHOD = "init_new"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        copies = _list_copies(fn)
        if "extend_seq_lens" not in copies:
            return Finding.missing(
                self.anchor,
                f"{self.where(fn)}: no copy of the extend lengths to the device "
                "(X.extend_seq_lens = torch.tensor(LIST, ...).to(device, ...)); "
                "the patch pins that host tensor",
            )
        waiting = [c.copy for c in copies.values() if c.waits]
        if waiting:
            return Finding.todo(
                self.anchor,
                f"{len(waiting)} copy(ies) of a host list from pageable memory (first at {self.where(waiting[0])})",
            )
        own = [c.own_pin for c in copies.values() if c.own_pin is not None]
        if own and len(own) == len(copies):
            return self.vendors_own(self.anchor, "pins the extend lengths before their non_blocking copy", own[0])
        if all(m.matches(c.build, primitives.call(PINNED_TENSOR)) for c in copies.values() if c.own_pin is None):
            return Finding.done(self.anchor)
        return Finding.done(self.anchor, "upstream's pinned copies (0.5.19+)")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        """Each build left pageable -> ``host_copies.pinned_build``, each blocking copy non_blocking.
        Found again after each rewrite: a build through a local is a statement of its own."""
        for name in [n for n, c in _list_copies(fn).items() if c.waits]:
            found = _list_copies(fn)[name]
            if not found.pinned:
                device = host_copies.copy_device(found.copy)
                assert device is not None  # _list_copies keeps copies to a device
                fn = primitives.replace_node(fn, found.build, host_copies.pinned_build(found.build, device))
                found = _list_copies(fn)[name]
            if host_copies.blocks(found.copy):
                fn = primitives.replace_node(fn, found.copy, host_copies.non_blocking(found.copy))
        self.require_import(host_copies.HELPERS, PINNED_TENSOR)
        return fn
