"""Run-time helper for patch dsa-draft-extend-graph: is the draft-extend backend
DeepSeek sparse attention's, under either of its names?

The spec-v2 worker admits a backend to its draft-extend CUDA graph by class
(sglang 0.5.15, #29413, appends ``DeepseekSparseAttnBackend`` to that list).
The class is ``NativeSparseAttnBackend`` of ``layers/attention/nsa_backend.py``
up to 0.5.12.post1 and ``DeepseekSparseAttnBackend`` of ``dsa_backend.py``
from 0.5.13 (a fork may have either). Whichever the tree has was imported
when the backend was built, so the test looks the classes up among the
modules already imported: no import here (MUSA and NPU builds never load the
sparse-attention stack), and a name the tree lacks is simply not there.

Imported by patched sglang code: standard library only.
"""

from __future__ import annotations

import sys

#: (module, class) of the sparse-attention backend, by release: up to 0.5.12.post1, from 0.5.13.
SPARSE_ATTN_BACKENDS = (
    ("sglang.srt.layers.attention.nsa_backend", "NativeSparseAttnBackend"),
    ("sglang.srt.layers.attention.dsa_backend", "DeepseekSparseAttnBackend"),
)


def is_dsa_backend(backend: object) -> bool:
    """Whether ``backend`` is an instance of the tree's sparse-attention
    backend class (a subclass counts, as ``isinstance`` has it upstream)."""
    for module_name, class_name in SPARSE_ATTN_BACKENDS:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None) if module is not None else None
        if isinstance(cls, type) and isinstance(backend, cls):
            return True
    return False
