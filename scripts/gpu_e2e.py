#!/usr/bin/env python3
"""Prove patchkit on a GPU: patched sglang serves EAGLE3 spec v2 like pristine, minus the sync.

    python scripts/gpu_e2e.py bundle --out DIR [--release 0.5.12.post1 ...]   # here, no GPU
    cd DIR && PYTHONPATH=e2e python3 -m pk_gpu_e2e.orchestrate --out OUT      # on the GPU

FA3 (attention_backend="fa3") needs sglang-kernel's FA3 library, which travels
on its own (gpu_e2e/fa3_kernel.py):

    python scripts/gpu_e2e.py fa3-pack --out DIR                               # here
    python3 gpu_e2e/fa3_kernel.py unpack --src DIR --dest /tmp/pk_fa3          # GPU, call 1
    ... orchestrate --attention-backend fa3 --fa3-lib /tmp/pk_fa3/flash_ops.abi3.so   # call 2

A bundle or FA3 pack bigger than one device call carries travels in parts
(gpu_e2e/bundle_parts.py; issue 57's 0.5.17 bundle):

    python scripts/gpu_e2e.py split --folder .gpubundle-17                      # here
    python3 gpu_e2e/bundle_parts.py join --part .gpubundle-17-a --dest /tmp/b17   # GPU, one call per part

See docs/gpu.md.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_e2e import bundle, wheels  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bundle", help="build the bundle folder (downloads from the registry)")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument(
        "--release",
        action="append",
        choices=wheels.RELEASES + tuple(r for r in wheels.REFERENCE_RELEASES if r not in wheels.RELEASES),
        help="release(s) to carry, pristine and patched (default: 0.5.12.post1); 0.5.17, the "
        "yardstick, is carried as published (as --reference)",
    )
    b.add_argument(
        "--reference",
        action="append",
        default=[],
        choices=wheels.REFERENCE_RELEASES,
        help="release(s) carried as published: the upstream reference",
    )
    b.add_argument(
        "--earlier",
        action="append",
        default=[],
        metavar="NAME=COMMIT",
        help="also carry the tree patchkit at COMMIT writes (variant NAME), to measure "
        "what later commits changed (issue 42: upstream's later fixes)",
    )
    b.add_argument("--limit-mib", type=float, default=64)
    b.add_argument(
        "--site-compression",
        choices=["xz", "gz"],
        default="xz",
        help="the site tars: xz (a third smaller: 0.5.13's fits beside the checkout) or gz (faster)",
    )
    b.add_argument(
        "--reuse-site",
        type=Path,
        default=None,
        help="an earlier bundle: copy its site tars where the pins are the same (no recompression)",
    )
    b.add_argument(
        "--minus",
        action="append",
        default=[],
        metavar="PATCH",
        help="also carry a tree with every patch but PATCH (variant minus-PATCH), to measure "
        "that patch's own effect side by side",
    )
    b.add_argument(
        "--kernel",
        action="append",
        default=[],
        choices=["flashmla"],
        help="also carry this sglang-kernel library in the bundle (FlashMLA: about 4 MiB)",
    )
    b.add_argument(
        "--wheel",
        action="append",
        default=[],
        choices=["sgl-deep-gemm"],
        help="also carry this whole wheel, unpacked into the common site before the engines start "
        "(sgl-deep-gemm 0.1.0: DeepSeek sparse attention's indexer, issue 72; about 4.5 MiB)",
    )
    f = sub.add_parser("fa3-pack", help="pack FA3's kernel library for a device call of its own")
    f.add_argument("--out", required=True, type=Path)
    f.add_argument(
        "--kernel-version",
        default=wheels.COMMON_PINS["sglang-kernel"],
        help="sglang-kernel version whose FA3 library to pack (0.5.13 pins 0.4.3)",
    )
    s = sub.add_parser("split", help="cut a folder (bundle, FA3 pack) into parts that one device call each carries")
    s.add_argument("--folder", required=True, type=Path)
    s.add_argument(
        "--part-mib",
        type=float,
        default=None,
        help="what one part may hold (64 MiB less the checkout; default: bundle_parts.PART_BYTES, 40)",
    )
    t = sub.add_parser("tables", help="issue 23's tables from one or more results.json (e.g. two device calls)")
    t.add_argument("results", nargs="+", type=Path)
    r = sub.add_parser("run", help="run on this (GPU) machine from a built bundle")
    r.add_argument("--bundle", required=True, type=Path)
    r.add_argument("rest", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.cmd == "bundle":
        earlier = dict(item.split("=", 1) for item in args.earlier)
        releases, reference = bundle.carried(
            args.release or ([] if args.reference else ["0.5.12.post1"]), args.reference
        )
        bundle.build(
            args.out,
            releases,
            limit=int(args.limit_mib * bundle.MIB),
            minus=args.minus,
            kernels=args.kernel,
            extra_wheels=args.wheel,
            reference=reference,
            earlier=earlier,
            site_compression=args.site_compression,
            reuse_site=args.reuse_site,
        )
        return 0
    if args.cmd == "split":
        from gpu_e2e import bundle_parts

        bundle_parts.split(
            args.folder, bundle_parts.PART_BYTES if args.part_mib is None else int(args.part_mib * bundle.MIB)
        )
        return 0
    if args.cmd == "tables":
        import json

        from gpu_e2e import issue23_report

        results = [json.loads(p.read_text()) for p in args.results]
        print(issue23_report.issue23_tables(results))
        for problem in issue23_report.issue23_problems(results):
            print("PROBLEM:", problem)
        return 0
    if args.cmd == "fa3-pack":
        from gpu_e2e import fa3_kernel

        version = args.kernel_version
        wheel = wheels.download_wheels({"sglang-kernel": version}, wheels.wheel_cache())["sglang-kernel"]
        fa3_kernel.pack(args.out, wheel, version)
        return 0
    sys.path.insert(0, str(args.bundle.resolve() / "e2e"))
    from pk_gpu_e2e import orchestrate

    return orchestrate.main(["--bundle", str(args.bundle), *args.rest])


if __name__ == "__main__":
    sys.exit(main())
