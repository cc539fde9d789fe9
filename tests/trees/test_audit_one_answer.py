"""``patchkit audit`` is a function of the tree's bytes alone, and agrees with
apply's safety rule (issue 54, item 11).

On 0.5.7 .. 0.5.9 apply writes needs-cpu-seq-lens (the rule finds nothing
unsafe) and patches ``multi_layer_eagle_worker_v2.py`` for another patch. The
audit of the result used to call that module's read
(``MultiLayerEagleDraftWorker.draft``, ``model_worker_batch.seq_lens_sum``)
the release's own, and safe, only while the release was in patchkit's cache:
without it the module's bytes were no release's and the read "unguarded".
The tree's manifest says patchkit changed the module from the release's own
bytes, which tells the same thing with any cache.
"""

from __future__ import annotations

import json

import pytest

from patchkit.audit import facts

pytestmark = pytest.mark.trees

RELEASES = ["0.5.7", "0.5.8.post1", "0.5.9"]
READ = ("srt/speculative/multi_layer_eagle_worker_v2.py", "MultiLayerEagleDraftWorker.draft")


def _audit(cli, tree) -> tuple[bool, list[tuple]]:
    result = cli("audit", tree, "--format", "json")
    doc = json.loads(result.output)
    return doc["ok"], [(r["file"], r["line"], r["function"], r["verdict"], r["origin"]) for r in doc["reads"]]


@pytest.mark.parametrize("release", RELEASES)
def test_the_audit_gives_one_answer_with_the_cache_empty_warm_or_off(linked_tree, cli, release, tmp_path, monkeypatch):
    tree = linked_tree(release)
    applied = cli("apply", tree)
    assert applied.exit_code == 0 and "refused" not in applied.output, applied.output

    # warm: the release in patchkit's cache, the transform cache filled (twice: the second reads it)
    _audit(cli, tree)
    warm = _audit(cli, tree)
    # off: no transform cache (no audit facts on disk)
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", "off")
    facts._MEMO.clear()
    off = _audit(cli, tree)
    # empty: a cache folder with nothing in it (no release tree, no transforms)
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(tmp_path / "empty-cache" / "transforms"))
    facts._MEMO.clear()
    empty = _audit(cli, tree)

    assert warm == off == empty
    ok, reads = warm
    # apply wrote the decision: the audit agrees that nothing reads the mirror unguarded.
    assert ok, [r for r in reads if r[3] in ("unguarded", "stale")]
    assert [r[3:] for r in reads if r[:1] + r[2:3] == READ] == [("safe", "release")]
