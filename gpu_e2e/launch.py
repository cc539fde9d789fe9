"""GPU side: the environment one runner process gets (its tree first on ``PYTHONPATH``).

Shared by :mod:`.orchestrate` (one engine after another) and :mod:`.duel` (engines
alive side by side): both start ``python -m pk_gpu_e2e.runner`` the same way, so
a tree imports the same packages whichever drives it.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import engine_env, ranks


def runner_env(
    *,
    tree: Path,
    tree_name: str,
    site_rel: Path,
    site_common: Path,
    bundle: Path,
    info: dict,
    sync_dir: Path,
    asked_env: dict,
) -> dict:
    """``tree`` (its parent holds ``sglang/``) first, then the release's own site, the
    common site and the harness; a patched tree of a bundle built with
    ``--runtime package`` also sees the bundle's runtime package."""
    path = [str(tree), str(site_rel), str(site_common), str(bundle / "e2e")]
    if tree_name != "pristine" and info["runtime_mode"] == "package":
        path.insert(1, str(bundle / "runtime"))
    # PK_E2E_EXTRA_SITE: a folder after all of them (compile_caches.py's FlashInfer modules
    # from an earlier machine: a package no site has, so it shadows nothing)
    path += [p for p in os.environ.get("PK_E2E_EXTRA_SITE", "").split(os.pathsep) if p]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(path),
        PYTHONUNBUFFERED="1",
        PK_E2E_SYNC_DIR=str(sync_dir),
        SGLANG_ENABLE_SPEC_V2="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        **ranks.MULTICAST_OFF,
    )
    env.update(info.get("env", {}))  # what the release needs on this image (wheels.RELEASE_ENV)
    env.update(engine_env.for_runner(asked_env))  # --engine-env (issue 67)
    return env
