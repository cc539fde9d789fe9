"""Run-time helpers imported by patched sglang code (scheduler / speculative side).

Standard library only at import time (torch is imported lazily inside the
functions that need it); never libcst or click. Imports inside the runtime are
relative: the same files are vendored into patched trees as
``sglang.srt._patchkit.runtime`` (see patchkit.state.vendoring), and patched code
imports the names below from there (or, in package mode, through a forwarder,
from ``patchkit.runtime``).
"""

from .grouped_copies import copy_grouped
from .host_bound import (
    CHECK_SWITCH,
    OFF_SWITCH,
    SeqLensBound,
    checked_host_bound,
    seq_lens_host_bound,
)
from .host_copies import pin_memory_for, pinned_tensor
from .seq_lens import (
    add_or_none,
    cat_or_none,
    configure_needs_cpu_seq_lens,
    decide_needs_cpu_seq_lens,
    decode_seq_lens,
    decode_total_seq_lens,
    draft_extend_prefix_lens,
    host_list_or_none,
    index_or_none,
    max_of_extend_lens,
    needs_cpu_seq_lens,
    prefix_lens_sum_or_bound,
    rows_total_bound,
    seq_lens_sum_or_bound,
    set_needs_cpu_seq_lens,
    spec_v2_attn_backends_of,
    tree_mask_seq_lens_sum,
)
from .streams import wait_event_on_stream

# The runtime contract: bumped whenever a name here changes incompatibly. A
# tree records the API it was patched against; package mode checks it at import.
RUNTIME_API = 1

__all__ = [
    "CHECK_SWITCH",
    "OFF_SWITCH",
    "RUNTIME_API",
    "SeqLensBound",
    "add_or_none",
    "cat_or_none",
    "checked_host_bound",
    "configure_needs_cpu_seq_lens",
    "copy_grouped",
    "decide_needs_cpu_seq_lens",
    "decode_seq_lens",
    "decode_total_seq_lens",
    "draft_extend_prefix_lens",
    "host_list_or_none",
    "index_or_none",
    "max_of_extend_lens",
    "needs_cpu_seq_lens",
    "pin_memory_for",
    "pinned_tensor",
    "prefix_lens_sum_or_bound",
    "rows_total_bound",
    "seq_lens_host_bound",
    "seq_lens_sum_or_bound",
    "set_needs_cpu_seq_lens",
    "spec_v2_attn_backends_of",
    "tree_mask_seq_lens_sum",
    "wait_event_on_stream",
]
