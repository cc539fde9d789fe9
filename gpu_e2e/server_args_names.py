"""The harness's Engine settings under the names a release's ``ServerArgs`` has.

The harness names its settings as 0.5.10 … 0.5.13 do. 0.5.17 renamed three of them
(its command line keeps the old flags as deprecated aliases; ``Engine(**kwargs)``
builds the ``ServerArgs`` dataclass directly and takes only the new names):

* ``cuda_graph_max_bs`` -> ``cuda_graph_max_bs_decode``;
* ``disable_piecewise_cuda_graph=True`` -> ``cuda_graph_backend_prefill="disabled"``;
* ``enforce_piecewise_cuda_graph=True`` -> ``cuda_graph_backend_prefill="tc_piecewise"``
  (the values 0.5.17's deprecated flags store).

:func:`for_fields` renames a setting only where the tree's ``ServerArgs`` lacks the
old name and has the new one, so the releases that have the old names get them
unchanged. The runner calls it with the fields of the tree it imports and records
what it renamed (``engine_kwargs_renamed``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

#: old name -> (new name, {old value: new value} or None to keep the value).
RENAMED: dict[str, tuple[str, Any]] = {
    "cuda_graph_max_bs": ("cuda_graph_max_bs_decode", None),
    "disable_piecewise_cuda_graph": ("cuda_graph_backend_prefill", {True: "disabled"}),
    "enforce_piecewise_cuda_graph": ("cuda_graph_backend_prefill", {True: "tc_piecewise"}),
}


def for_fields(kwargs: dict, fields: Optional[Iterable[str]]) -> tuple[dict, dict[str, str]]:
    """(``kwargs`` under the names in ``fields``, {old: new} for each renamed one);
    ``fields`` None (not known): unchanged.

    A switch set to False (a value the new field has no word for) is dropped: False
    is each old switch's default, so leaving it out asks for the same thing."""
    if fields is None:
        return dict(kwargs), {}
    fields = set(fields)
    out: dict[str, Any] = {}
    renamed: dict[str, str] = {}

    def put(key: str, value: Any, asked: str) -> None:
        if key in out and out[key] != value:
            raise ValueError(f"{asked}={kwargs[asked]!r} and another setting both set {key}")
        out[key] = value

    for name, value in kwargs.items():
        if name in fields or name not in RENAMED or RENAMED[name][0] not in fields:
            put(name, value, name)
            continue
        new, values = RENAMED[name]
        renamed[name] = new
        if values is None:
            put(new, value, name)
        elif value in values:
            put(new, values[value], name)
    return out, renamed


def server_args_fields() -> Optional[set[str]]:
    """The fields of the imported sglang's ``ServerArgs`` (a dataclass in every release);
    None where there is none (the tests' stand-in sglang)."""
    import dataclasses

    try:
        from sglang.srt.server_args import ServerArgs

        return {f.name for f in dataclasses.fields(ServerArgs)}
    except (ImportError, TypeError):
        return None
