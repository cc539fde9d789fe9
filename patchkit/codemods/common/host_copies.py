"""Host-to-device copies that do not make the host wait: the shapes the
codemods carrying them share (the penalizers' output ids, spec-v2
``prepare_for_decode``'s kv lengths; issue 53).

Two rewrites, both through the runtime's ``pin_memory_for(device)`` (pinned
on CUDA, as before elsewhere):

* a host list built straight on the device, ``torch.tensor(LIST, ...,
  device=D)`` (a blocking copy from pageable memory), becomes upstream's
  (0.5.14) ``torch.tensor(LIST, ..., pin_memory=pin_memory_for(D)).to(D,
  non_blocking=True)``;
* a copy of a host tensor, ``T.to(device=D)``, becomes ``non_blocking``, and
  ``T``'s ``torch.tensor(...)`` is pinned: without pinning the driver still
  stages pageable bytes synchronously.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.shared import code_of
from patchkit.layout import import_path

HELPERS = import_path("runtime")
PIN = "pin_memory_for"
PINNED_TENSOR = "pinned_tensor"
TENSOR = primitives.call("torch.tensor")
TO = primitives.method_call("to")
#: ``X.pin_memory()``: a host tensor a fork pins itself before its copy (issue 69).
OWN_PIN = m.Call(func=m.Attribute(attr=m.Name("pin_memory")), args=[])


def _is_true(arg: Optional[cst.Arg]) -> bool:
    return arg is not None and m.matches(arg.value, m.Name("True"))


def _on_cpu(expr: cst.BaseExpression) -> bool:
    return m.matches(expr, m.SimpleString('"cpu"') | m.SimpleString("'cpu'"))


def built_on_device(call: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """The device ``D`` of ``torch.tensor(LIST, ..., device=D)`` (not the CPU), else None."""
    if not isinstance(call, cst.Call) or not m.matches(call, TENSOR):
        return None
    device = primitives.keyword_argument(call, "device")
    return None if device is None or _on_cpu(device.value) else device.value


def is_pinned_copy(call: cst.CSTNode) -> bool:
    """``torch.tensor(..., pin_memory=...).to(..., non_blocking=True)``: ours and upstream's (0.5.14+)."""
    return (
        isinstance(call, cst.Call)
        and m.matches(call, TO)
        and _is_true(primitives.keyword_argument(call, "non_blocking"))
        and isinstance(call.func, cst.Attribute)
        and isinstance(tensor := call.func.value, cst.Call)
        and m.matches(tensor, TENSOR)
        and primitives.keyword_argument(tensor, "pin_memory") is not None
    )


def pinned_copy(call: cst.Call) -> cst.Call:
    """``torch.tensor(LIST, ..., device=D)`` -> ``torch.tensor(LIST, ...,
    pin_memory=pin_memory_for(D)).to(D, non_blocking=True)`` (the keyword
    where ``device=`` was, the call's layout kept)."""
    device = primitives.keyword_argument(call, "device")
    assert device is not None  # built_on_device found it
    pin = device.with_changes(
        keyword=cst.Name("pin_memory"), value=primitives.parse_expression(f"{PIN}({code_of(device.value)})")
    )
    host = call.with_changes(args=[pin if a is device else a for a in call.args])
    return cst.ensure_type(
        primitives.parse_expression(f"X.to({code_of(device.value)}, non_blocking=True)"), cst.Call
    ).with_changes(func=cst.Attribute(value=host, attr=cst.Name("to")))


def copy_device(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The device a ``.to(...)`` copy goes to (``device=D`` or the first argument)."""
    device = primitives.keyword_argument(call, "device")
    if device is not None:
        return device.value
    first = call.args[0] if call.args else None
    return first.value if first is not None and first.keyword is None else None


def blocks(call: cst.Call) -> bool:
    """A ``.to(...)`` copy without ``non_blocking=True``."""
    return not _is_true(primitives.keyword_argument(call, "non_blocking"))


def non_blocking(call: cst.Call) -> cst.Call:
    return primitives.set_keyword_argument(call, "non_blocking", "True")


def pinned(call: cst.Call, device: cst.BaseExpression) -> cst.Call:
    """``torch.tensor(...)`` built on the host, pinned for ``device``."""
    return primitives.set_keyword_argument(call, "pin_memory", f"{PIN}({code_of(device)})")


def is_pinned(call: cst.Call) -> bool:
    return primitives.keyword_argument(call, "pin_memory") is not None


def pinned_build(build: cst.Call, device: cst.BaseExpression) -> cst.Call:
    """``torch.tensor(LIST, ...)`` / ``torch.as_tensor(LIST, ...)`` -> the runtime's
    ``pinned_tensor(LIST, ..., pin_for=D)``: pinned where ``D`` is a CUDA device, and a
    tensor (needs-cpu-seq-lens's device lengths) kept as it is, never pinned. One call for
    both (a keyword would not do: torch.as_tensor has no ``pin_memory``)."""
    return primitives.set_keyword_argument(build.with_changes(func=cst.Name(PINNED_TENSOR)), "pin_for", code_of(device))
