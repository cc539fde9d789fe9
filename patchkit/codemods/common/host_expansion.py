"""The host expansion of DeepSeek sparse attention's verify and draft-extend
lengths (0.5.7 .. 0.5.9), and its device form: what patch dsa-no-mirror
rewrites, its release gate reads, and dsa-draft-extend-graph's replay takes
the expansion's name from.

0.5.7 .. 0.5.9 build the per-token lengths of target verify and the draft
extend on the host::

    seqlens_int32_cpu = [D + kv_len for kv_len in forward_batch.seq_lens_cpu.tolist()]
    seqlens_expanded = torch.cat(
        [torch.arange(kv_len - qo_len + 1, kv_len + 1, dtype=..., device=...)
         for qo_len, kv_len in zip(extend_seq_lens_cpu, seqlens_int32_cpu, strict=True)]
    )

(the kv lengths read from the mirror, the query lengths a host list:
``[D] * bs``, ``forward_batch.extend_seq_lens_cpu``, or the accepted counts'
``.tolist()``). 0.5.10 calls ``seqlens_expand_triton(<query lengths on the
device>, <kv lengths on the device>, <total>, D)`` instead. :func:`device_form`
gives that call, on backends.dsa ``seqlens_expand`` (the same expansion in
torch ops): each host list is followed to the device tensor it was read from
(``X_cpu`` -> ``X``, ``X.tolist()`` -> ``X``, ``[A + kv for kv in M.tolist()]``
-> ``M' + A``), a fixed width stays a host ``int`` (no tensor built from a
host list), the total is a host value (``W * bs`` or ``sum(<host list>)``).
An expansion whose lists it cannot follow is left alone (``None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.primitives.values import Locals
from patchkit.codemods.common.shared import code_of

#: The device expansion patchkit writes (backends.dsa), and upstream's kernel (0.5.10+).
EXPAND = "seqlens_expand"
HOST_EXPANSION = m.Call(
    func=attr("cat", m.Name("torch")),
    args=[
        m.Arg(
            m.ListComp(
                elt=m.Call(func=attr("arange", m.Name("torch"))),
                for_in=m.CompFor(
                    target=m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name())]),
                    iter=m.Call(func=m.Name("zip")),
                    inner_for_in=None,
                    ifs=[],
                ),
            )
        ),
        m.ZeroOrMore(),
    ],
)
_TOLIST = m.Call(func=attr("tolist"), args=[])
VERIFY_OR_DRAFT_EXTEND = m.Call(func=attr("is_target_verify|is_draft_extend|is_draft_extend_v2"))


def spec_branches(fn: cst.CSTNode) -> list[cst.If]:
    """The ``if``/``elif`` branches of ``fn`` for target verify or the draft extend."""
    return [
        b for b in primitives.find_all_of(cst.If, fn, m.If()) if primitives.contains(b.test, VERIFY_OR_DRAFT_EXTEND)
    ]


def host_expansions(fn: cst.CSTNode) -> list[tuple[cst.If, cst.Call]]:
    """Each host expansion in a verify / draft-extend branch of ``fn``, with its branch (innermost)."""
    found: dict[int, tuple[cst.If, cst.Call]] = {}
    for branch in spec_branches(fn):
        for call in primitives.find_all_of(cst.Call, branch.body, HOST_EXPANSION):
            found[id(call)] = (branch, call)  # a later (inner) branch wins
    return list(found.values())


@dataclass(frozen=True)
class DeviceForm:
    call: str  # ``seqlens_expand(...)``
    dead: tuple[str, ...]  # host lists only the expansion read: their assignments go


def _strip_cpu(node: cst.BaseExpression) -> Optional[str]:
    """``forward_batch.X_cpu`` -> ``forward_batch.X``, ``X_cpu`` -> ``X`` (None: not a ``*_cpu`` name)."""
    text = code_of(node)
    if isinstance(node, (cst.Name, cst.Attribute)) and text.endswith("_cpu"):
        return text[: -len("_cpu")]
    return None


_AMBIGUOUS = cst.Name("_")  # a local assigned more than once where it is read: not followed


def _local(name: cst.BaseExpression, scopes: tuple[Locals, ...]) -> Optional[cst.BaseExpression]:
    """The one value the local ``name`` is assigned in the innermost scope that
    assigns it (None: not a local; ``_AMBIGUOUS``: assigned more than once)."""
    if not isinstance(name, cst.Name):
        return None
    for scope in scopes:
        defs = scope.defs.get(name.value)
        if defs:
            value = defs[0].value if len(defs) == 1 else None
            return value if value is not None else _AMBIGUOUS
    return None


def _device_of_list(node: cst.BaseExpression) -> Optional[str]:
    """The device tensor a host list was read from: ``M.tolist()`` -> M's device name, ``X_cpu`` -> ``X``."""
    if isinstance(node, cst.Call) and m.matches(node, _TOLIST):
        receiver = cst.ensure_type(node.func, cst.Attribute).value
        return _strip_cpu(receiver) or (code_of(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else None)
    return _strip_cpu(node)


def _kv_lengths(node: cst.BaseExpression, scopes: tuple[Locals, ...]) -> Optional[tuple[str, Optional[str]]]:
    """The kv lengths on the device, and the local host list that goes with them (if any)."""
    local = _local(node, scopes)
    if local is _AMBIGUOUS:
        return None
    value = local if local is not None else node
    if isinstance(value, cst.ListComp):
        target, source = value.for_in.target, _device_of_list(value.for_in.iter)
        simple = value.for_in.inner_for_in is None and not value.for_in.ifs and isinstance(target, cst.Name)
        if not simple or source is None or not m.matches(value.for_in.iter, _TOLIST):
            return None
        loop, elt = cst.ensure_type(target, cst.Name).value, value.elt
        if isinstance(elt, cst.BinaryOperation) and isinstance(elt.operator, cst.Add):
            for mine, other in ((elt.left, elt.right), (elt.right, elt.left)):
                if m.matches(mine, m.Name(loop)) and not primitives.contains(other, m.Name(loop)):
                    return f"({source} + {code_of(other)})", cst.ensure_type(node, cst.Name).value
        return None
    source = _device_of_list(value)
    if source is None:
        return None
    return source, (node.value if local is not None and isinstance(node, cst.Name) else None)


def _query_lengths(node: cst.BaseExpression, scopes: tuple[Locals, ...]) -> Optional[tuple[str, str]]:
    """(the query lengths on the device or a fixed width, their host total)."""
    local = _local(node, scopes)
    if local is _AMBIGUOUS:
        return None
    value = local if local is not None else node
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
        for one, count in ((value.left, value.right), (value.right, value.left)):
            if isinstance(one, cst.List) and len(one.elements) == 1:
                width = code_of(one.elements[0].value)
                return width, f"{width} * {code_of(count)}"
        return None
    source = _device_of_list(value)
    return (source, f"sum({code_of(node)})") if source is not None else None


def _flat(node: cst.CSTNode) -> str:
    return "".join(code_of(node).split())


def device_form(fn: cst.CSTNode, branch: cst.If, call: cst.Call) -> Optional[DeviceForm]:
    """``call`` (a host expansion in ``branch`` of ``fn``) as a device expansion, or None."""
    comp = cst.ensure_type(call.args[0].value, cst.ListComp)
    target = cst.ensure_type(comp.for_in.target, cst.Tuple)
    names = [cst.ensure_type(e.value, cst.Name).value for e in target.elements]
    zipped = [a for a in cst.ensure_type(comp.for_in.iter, cst.Call).args if a.keyword is None]
    arange = cst.ensure_type(comp.elt, cst.Call)
    positional = [a.value for a in arange.args if a.keyword is None]
    if len(zipped) != 2 or len(positional) != 2:
        return None
    for qo, kv in ((0, 1), (1, 0)):  # which loop variable is the query length
        if _flat(positional[0]) == f"{names[kv]}-{names[qo]}+1" and _flat(positional[1]) == f"{names[kv]}+1":
            break
    else:
        return None
    scopes = (Locals(branch.body), Locals(fn))  # type: ignore[arg-type]  # the branch's assignments, then the method's
    kv_side = _kv_lengths(zipped[kv].value, scopes)
    q_side = _query_lengths(zipped[qo].value, scopes)
    if kv_side is None or q_side is None:
        return None
    (kv_dev, kv_local), (q_dev, total) = kv_side, q_side
    dead: tuple[str, ...] = ()
    if kv_local is not None and len(primitives.find_all(fn, m.Name(kv_local))) == 2:  # assigned, then zipped
        dead = (kv_local,)
    return DeviceForm(f"{EXPAND}({q_dev}, {kv_dev}, {total})", dead)
