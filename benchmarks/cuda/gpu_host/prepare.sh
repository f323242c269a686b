#!/usr/bin/env bash
# Prepare, on a machine with network, what the offline GPU host needs to run `python -m benchmarks.cuda`.
#
#   benchmarks/cuda/gpu_host/prepare.sh            # -> .whl/ (git-ignored), about 256 MB + the trained models
#
# Downloads onnxruntime-gpu (a CUDA 13 build) and onnx-ir for CPython 3.12 on manylinux_2_28_x86_64
# (the GPU host's Python), writes SHA256SUMS, and splits the 256 MB onnxruntime-gpu wheel into
# PART_SIZE parts (default 40M, 7 parts; PARTS.SHA256SUMS), for a way to the host that limits the size
# of one file or of one copy (PART_SIZE=1G: the wheel in one part). The whole wheel is removed once its
# parts are checked to reassemble into it (KEEP_WHOLE=1 keeps it); run_on_host.sh reassembles them on
# the host. Copy .whl/ into the host's checkout by any means (scp, rsync, a USB disk).
# See benchmarks/README.md, section CUDA.
#
# The real trained models the sweep times (TRAINED, default models/trained/, which
# models/make/fetch_trained_models.py fills: MANIFEST.json and the .onnx files with their external data)
# travel the same way: one tar (TRAINED.SHA256SUMS), split into parts (TRAINED.PARTS.SHA256SUMS);
# run_on_host.sh reassembles it into models/trained/ and checks every model against MANIFEST.json.
# TRAINED_MODELS="stem1 stem2" limits them to those files (default: every .onnx in TRAINED).
#
# Environment: ORT_VERSION (1.31.1), ONNX_IR_VERSION (1.1.0), PART_SIZE (40M), PYTHON (python3),
# WHL (.whl), TRAINED (models/trained), TRAINED_MODELS (all), KEEP_WHOLE=1 to keep the whole wheel
# and tar beside their parts, SKIP_DOWNLOAD=1 to reuse the wheels already in WHL.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)  # benchmarks/cuda/gpu_host/ -> the checkout
cd "$ROOT"
ORT_VERSION=${ORT_VERSION:-1.31.1}
ONNX_IR_VERSION=${ONNX_IR_VERSION:-1.1.0}
PART_SIZE=${PART_SIZE:-40M}
PYTHON=${PYTHON:-python3}
WHL=${WHL:-.whl}
TRAINED=${TRAINED:-models/trained}
TRAINED_MODELS=${TRAINED_MODELS:-}

mkdir -p "$WHL"
if [ "${SKIP_DOWNLOAD:-0}" = 1 ] && ls "$WHL"/onnxruntime_gpu-"$ORT_VERSION"-*.whl > /dev/null 2>&1; then
    echo "== SKIP_DOWNLOAD=1: using the wheels in $WHL/"
else
    echo "== download onnxruntime-gpu $ORT_VERSION and onnx-ir $ONNX_IR_VERSION for cp312 manylinux_2_28_x86_64 -> $WHL/"
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
        --platform manylinux_2_28_x86_64 -d "$WHL" "onnxruntime-gpu==$ORT_VERSION" "onnx-ir==$ONNX_IR_VERSION"
fi

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
cd "$ROOT"

# ---- the trained models -------------------------------------------------------------------------
rm -f "$WHL"/trained.tar "$WHL"/trained.tar.part-* "$WHL"/TRAINED.SHA256SUMS "$WHL"/TRAINED.PARTS.SHA256SUMS
if [ -d "$TRAINED" ] && ls "$TRAINED"/*.onnx > /dev/null 2>&1; then
    files=()
    for f in "$TRAINED"/*.onnx; do
        stem=$(basename "$f" .onnx)
        if [ -n "$TRAINED_MODELS" ] && ! [[ " $TRAINED_MODELS " == *" $stem "* ]]; then continue; fi
        files+=("$(basename "$f")")
        # external data beside the model (onnx's `location`, any name that starts with the model's)
        for d in "$TRAINED/$stem".onnx.data "$TRAINED/$stem".data "$TRAINED/$stem".onnx_data; do
            [ -f "$d" ] && files+=("$(basename "$d")")
        done
    done
    [ -f "$TRAINED/MANIFEST.json" ] && files=("MANIFEST.json" "${files[@]}")
    echo "== pack ${#files[@]} files of $TRAINED into $WHL/trained.tar, $PART_SIZE parts"
    tar -C "$TRAINED" -cf "$WHL/trained.tar" "${files[@]}"
    cd "$WHL"
    sha256sum trained.tar > TRAINED.SHA256SUMS
    split -b "$PART_SIZE" -d -a 2 trained.tar trained.tar.part-
    sha256sum trained.tar.part-* > TRAINED.PARTS.SHA256SUMS
    cat trained.tar.part-* | sha256sum | cut -d' ' -f1 | grep -qx "$(cut -d' ' -f1 TRAINED.SHA256SUMS)" \
        || { echo "error: the parts do not reassemble into trained.tar" >&2; exit 1; }
    [ "${KEEP_WHOLE:-0}" = 1 ] || rm -f trained.tar
    cd "$ROOT"
else
    echo "== no trained models in $TRAINED (models/make/fetch_trained_models.py fills it): the sweep will time none"
fi
ls -l "$WHL"
echo "== ready: copy $WHL/ (its *SHA256SUMS, $IR_WHEEL and every part *.part-NN) into the GPU host's"
echo "   checkout, then run benchmarks/cuda/gpu_host/run_on_host.sh there (--parts: which parts have arrived)"
