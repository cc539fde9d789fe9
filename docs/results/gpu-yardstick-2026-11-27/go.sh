#!/bin/bash
# Second machine of the lease: deep_gemm for 0.5.17 (its EAGLE v2 graph capture imports
# dsa_backend, which imports deep_gemm at module level), fa3-r1-b12 kept from the first machine.
mkdir -p /tmp/dg17 && python3 -m zipfile -e /tmp/whl17/sgl_deep_gemm-0.1.5.post1-py3-none-manylinux2014_x86_64.whl /tmp/dg17
printf '\nimport sys as _s; _s.path.append("/tmp/dg17")  # sgl-deep-gemm 0.1.5.post1, 0.5.17 only\n' >> /tmp/b17/e2e/sitecustomize.py
mkdir -p /tmp/pkrun/fa3-r1-b12 && touch /tmp/pkrun/fa3-r1-b12/.done
cp -r .gpubundle-y12 /tmp/b12.tmp && mv /tmp/b12.tmp /tmp/b12
cp docs/results/gpu-yardstick/plan.sh /tmp/ && (setsid nohup bash /tmp/plan.sh >/dev/null 2>&1 &)
