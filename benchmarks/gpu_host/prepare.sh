#!/usr/bin/env bash
# Prepare, on a machine with network, what the offline GPU host needs to run `python -m benchmarks.cuda`.
#
#   benchmarks/gpu_host/prepare.sh            # -> .whl/ (git-ignored), about 256 MB
#
# Downloads onnxruntime-gpu (a CUDA 13 build) and onnx-ir for CPython 3.12 on manylinux_2_28_x86_64
# (the GPU host's Python), writes SHA256SUMS, and splits the 256 MB onnxruntime-gpu wheel into
# 40 MB parts (PARTS.SHA256SUMS): a part fits where one transfer to the host is limited (the device
# tool carries at most 64 MiB per call). The whole wheel is removed once its parts are checked to
# reassemble into it; run_on_host.sh reassembles them on the host. See benchmarks/README.md, CUDA.
#
# Environment: ORT_VERSION (1.31.1), ONNX_IR_VERSION (1.1.0), PART_SIZE (40M), PYTHON (python3),
# WHL (.whl), KEEP_WHOLE=1 to keep the whole wheel beside its parts.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
ORT_VERSION=${ORT_VERSION:-1.31.1}
ONNX_IR_VERSION=${ONNX_IR_VERSION:-1.1.0}
PART_SIZE=${PART_SIZE:-40M}
PYTHON=${PYTHON:-python3}
WHL=${WHL:-.whl}

mkdir -p "$WHL"
echo "== download onnxruntime-gpu $ORT_VERSION and onnx-ir $ONNX_IR_VERSION for cp312 manylinux_2_28_x86_64 -> $WHL/"
"$PYTHON" -m pip download --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
    --platform manylinux_2_28_x86_64 -d "$WHL" "onnxruntime-gpu==$ORT_VERSION" "onnx-ir==$ONNX_IR_VERSION"

ORT_WHEEL=$(basename "$(ls "$WHL"/onnxruntime_gpu-"$ORT_VERSION"-cp312-cp312-manylinux*_x86_64.whl)")
IR_WHEEL=$(basename "$(ls "$WHL"/onnx_ir-"$ONNX_IR_VERSION"-*.whl)")
cd "$WHL"
sha256sum "$ORT_WHEEL" "$IR_WHEEL" > SHA256SUMS

echo "== split $ORT_WHEEL ($(du -h "$ORT_WHEEL" | cut -f1)) into $PART_SIZE parts"
rm -f "$ORT_WHEEL".part-*
split -b "$PART_SIZE" -d -a 2 "$ORT_WHEEL" "$ORT_WHEEL.part-"
sha256sum "$ORT_WHEEL".part-* > PARTS.SHA256SUMS
# the parts must give back the very wheel
cat "$ORT_WHEEL".part-* | sha256sum | cut -d' ' -f1 | grep -qx "$(grep " $ORT_WHEEL\$" SHA256SUMS | cut -d' ' -f1)" \
    || { echo "error: the parts do not reassemble into $ORT_WHEEL" >&2; exit 1; }
[ "${KEEP_WHOLE:-0}" = 1 ] || rm -f "$ORT_WHEEL"
ls -l
echo "== ready: carry $WHL/SHA256SUMS, $WHL/PARTS.SHA256SUMS, $WHL/$IR_WHEEL and each $WHL/$ORT_WHEEL.part-NN to the"
echo "   host, then run benchmarks/gpu_host/run_on_host.sh there"
