"""End-to-end proof on a GPU: serve EAGLE3 spec v2 from a pristine and a patched sglang tree.

Host side (no GPU): :mod:`.bundle` builds a folder of at most 64 MiB with what a bare
GPU machine lacks (slimmed sglang-kernel and flashinfer, pinned cp312 wheels, the
pristine tree and the files ``patchkit apply`` changed).

GPU side: :mod:`.orchestrate` unpacks the bundle (:mod:`.unpack`) and runs :mod:`.runner`
once per variant in a fresh process (its options and run keys: :mod:`.call_options`);
the runner times its generate calls with :mod:`.timed_calls`; :mod:`.syncs` (loaded
through the bundle's ``sitecustomize.py`` in every sglang process) counts host syncs on
CUDA tensors by call site; :mod:`.report` compares the variants and prints the table
(issue 23's tables: :mod:`.issue23_report`). Under tensor
parallelism (``--tp N``) :mod:`.ranks` notes each scheduler's TP rank and its
``needs_cpu_seq_lens`` decision in its dump, and :mod:`.rank_report` compares rank by rank.

The GPU-side modules use the standard library (and torch/sglang where they run), and
import each other relatively, so the bundle copies this folder as a standalone package.
"""
