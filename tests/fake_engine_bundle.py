"""A bundle of one release ("9.9") whose trees hold a stand-in sglang: the harness's
runner starts its Engine on CPU as it would the real one (tests of the TP and duel paths)."""

from __future__ import annotations

import json
import tarfile
import textwrap
from pathlib import Path

from gpu_e2e import bundle


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# A stand-in sglang: its Engine records what it was given, checks the
# environment, and writes per-rank sync dumps as TP scheduler processes would
# (pristine: one prepare_for_decode copy per decode step on each rank; patched:
# none, and each rank's decision). PK_FAKE_RANK1 makes rank 1 misbehave; PK_FAKE_CALL_S
# makes each generate take that long (twice that in the pristine tree). Each generate logs
# sglang's decode lines (the first, then the steady batch at 100 tok/s pristine, 200 patched).
FAKE_ENGINE = """
    import json, os, sys, time
    from pathlib import Path
    from sglang._fake_variant import VARIANT

    PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"
    CALL = "call|sglang.srt.speculative.eagle_info_v2:EagleDraftInputV2Mixin.prepare_for_decode"
    WORKER = "call|sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2.forward_batch_generation@"

    class Engine:
        def __init__(self, **kwargs):
            assert os.environ["NCCL_NVLS_ENABLE"] == "0", "multicast must stay off"
            if kwargs.get("enable_two_batch_overlap"):  # as 0.5.12.post1 refuses or fails it
                if not kwargs.get("moe_a2a_backend"):
                    raise ValueError("When enabling two batch overlap, moe_a2a_backend cannot be 'none'.")
                if os.environ.get("PK_FAKE_SCHEDULER_DIES"):  # dp-tbo's log (0.5.12.post1, 4 H200s)
                    print("[2026-11-27 02:16:47 DP0 TP0 EP0] Scheduler hit an exception: Traceback (most recent "
                          "call last):\\n  File \\"deepep.py\\", line 317, in __init__\\n    raise ImportError(\\n"
                          "ImportError: DeepEP is not installed.\\n", flush=True)
                    raise RuntimeError("Rank 0 scheduler died during initialization (exit code: -3).")
                print("Traceback (most recent call last):\\n  File \\"deepep.py\\", line 47, in <module>\\n"
                      "ModuleNotFoundError: No module named 'deep_ep'", flush=True)
                os.kill(os.getpid(), 9)  # sglang kills its process tree when a scheduler fails
            self.tp = kwargs["tp_size"]
            self.dp_attention = kwargs.get("enable_dp_attention", False)
            self.steps, self.idle, self.sent = [0] * self.tp, [0] * self.tp, 0
            self.dir = os.environ["PK_E2E_SYNC_DIR"]
            os.makedirs(self.dir, exist_ok=True)
            self._dump()

        def _dump(self):
            for rank in range(self.tp):
                odd = rank == 1 and os.environ.get("PK_FAKE_RANK1")
                syncing = VARIANT == "pristine" or odd
                counts = {CALL: self.steps[rank], WORKER + "decode": self.steps[rank], WORKER + "idle": self.idle[rank]}
                if syncing:
                    counts[f"cpu|{PFD}:174"] = self.steps[rank]
                notes = {"rank": {"tp_rank": rank, "source": "Scheduler.__init__ arguments"}}
                if VARIANT == "patched":
                    notes["needs_cpu_seq_lens"] = [bool(odd)]
                Path(self.dir, f"syncs-{1000 + rank}.json").write_text(
                    json.dumps({"pid": 1000 + rank, "counts": counts, "notes": notes}))

        def generate(self, input_ids, sampling_params):
            time.sleep(float(os.environ.get("PK_FAKE_CALL_S", "0")) * (2 if VARIANT == "pristine" else 1))
            n = sampling_params["max_new_tokens"]
            # DP attention: the controller deals requests round robin; a rank with none runs idle
            busy = {(self.sent + i) % self.tp for i in range(len(input_ids))} if self.dp_attention else range(self.tp)
            self.sent += len(input_ids)
            if os.environ.get("SGLANG_LOG_GC") == "1":  # sglang's own GC log, as its scheduler writes it
                print("[2026-11-28 00:00:00 TP0] GC end: Time 1.0 | Generation 2 | Duration: 0.0500s | "
                      "Collected: 1 | Uncollectable: 0 ", file=sys.stderr, flush=True)
            rate = 100.0 if VARIANT == "pristine" else 200.0
            for running, got in ((1, 5.0), (len(input_ids), rate), (len(input_ids), rate)):
                print(f"[2026-11-28 00:00:00 TP0] Decode batch, #running-req: {running}, #token: 9, token usage: 0.00, "
                      f"accept len: 1.00, cuda graph: False, gen throughput (token/s): {got:.2f}, #queue-req: 0",
                      file=sys.stderr, flush=True)
            for rank in range(self.tp):
                if rank in busy:
                    self.steps[rank] += n
                else:
                    self.idle[rank] += n
            self._dump()
            return [{"output_ids": list(range(n)), "meta_info": {"completion_tokens": n, "spec_verify_ct": n}}
                    for _ in input_ids]

        def shutdown(self):
            pass
    """


def fake_bundle(root: Path) -> Path:
    """A bundle of one release whose pristine tree is the stand-in sglang; the
    overlay turns it into the 'patched' one."""
    import hashlib

    src = root / "src"
    for pkg in ("sglang", "sglang/srt", "sglang/srt/entrypoints"):
        _write(src / pkg / "__init__.py", "")
    _write(src / "sglang" / "srt" / "entrypoints" / "engine.py", FAKE_ENGINE)
    _write(src / "sglang" / "_fake_variant.py", 'VARIANT = "pristine"\n')
    patched = _write(root / "over" / "sglang" / "_fake_variant.py", 'VARIANT = "patched"\n')
    b = root / "bundle"
    (b / "site").mkdir(parents=True)
    for group in ("common", "9.9"):
        with tarfile.open(b / "site" / f"{group}.tar.gz", "w:gz"):
            pass
    tdir = b / "trees" / "9.9"
    tdir.mkdir(parents=True)
    with tarfile.open(tdir / "pristine.tar.gz", "w:gz") as tar:
        tar.add(src / "sglang", arcname="sglang")
    with tarfile.open(tdir / "overlay.tar.gz", "w:gz") as tar:
        tar.add(root / "over" / "sglang", arcname="sglang")
    (tdir / "overlay.json").write_text(
        json.dumps({"_fake_variant.py": hashlib.sha256(patched.read_bytes()).hexdigest()})
    )
    (b / "manifest.json").write_text(json.dumps({"releases": {"9.9": {"runtime_mode": "vendored"}}}))
    bundle.copy_e2e_package(b)
    return b
