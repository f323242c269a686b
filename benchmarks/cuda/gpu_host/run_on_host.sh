#!/usr/bin/env bash
# On the offline GPU host: install what prepare.sh fetched, prove CUDA works, run the CUDA sweep.
#
#   benchmarks/cuda/gpu_host/run_on_host.sh [ARGS for python -m benchmarks.cuda]   # everything
#   benchmarks/cuda/gpu_host/run_on_host.sh --check-only                          # stop after the CUDA check
#   benchmarks/cuda/gpu_host/run_on_host.sh --rehearse                            # on a machine without a GPU (below)
#   benchmarks/cuda/gpu_host/run_on_host.sh --parts                               # which wheel parts are present
#
# Steps, each stopping the script with its reason when it fails:
#   1. reassemble the onnxruntime-gpu wheel from its parts in $WHL (sha256 of every part and of the wheel);
#      the trained models' tar likewise (TRAINED.*SHA256SUMS), unpacked into models/trained/, every model
#      checked against the sha256 MANIFEST.json records;
#   2. pip install --no-index --no-deps --target $SITE onnxruntime-gpu and onnx-ir (the host must have
#      their dependencies: numpy, protobuf, flatbuffers, packaging, sympy, onnx, ml_dtypes; and torch for
#      CUDA 13), PYTHONPATH=$SITE first, so `import onnxruntime` is the GPU build even where a CPU
#      onnxruntime is installed;
#   3. make the CUDA 13 libraries findable: LD_LIBRARY_PATH gets every lib/ folder of the `nvidia`
#      packages (torch's cuBLAS, cuDNN, cuRAND, CUDA runtime), and benchmarks.cuda imports torch before
#      onnxruntime, which loads them into the process;
#   4. check that onnxruntime is the installed 1.31.1 from $SITE and that a session really runs on
#      CUDAExecutionProvider with CPU fallback disabled (benchmarks.cuda refuses CPU figures anyway);
#   5. python -m benchmarks.cuda.costs --out $COSTS_OUT (default benchmarks/results/cuda/costs;
#      --max-seconds CUDA_COSTS_SECONDS, default 150): the cost table for CUDA (onnx-lnfold calibrate
#      --provider CUDA -> cuda_costs.json, COSTS.md) and onnx-lnfold bench of the trained models and GPT-2
#      folded by it (BENCH.md, bench.json); then python -m benchmarks.cuda "$@" with --max-seconds
#      SWEEP_SECONDS (default 250) unless given (results in --out DIR, default benchmarks/results/cuda/),
#      about 8 minutes in all: ~25 s of steps 1-4, <= ~175 s of step 5's first part, <= 250 s of sweep.
#
# The mode (--check-only, --rehearse, --parts) must be the first argument; any other arguments go to
# python -m benchmarks.cuda (e.g. --out DIR, --max-seconds S, --skip-gpt2).
#
# --rehearse (a machine with another Python and no GPU): steps 1-3 as on the host, the install made
# for cp312 manylinux_2_28_x86_64 explicitly; step 4 only up to where CUDA is needed: onnx-ir imports
# from $SITE, the onnxruntime package there is the expected version, and the CUDA provider library's
# needed libraries are listed as found / not found; step 5 as `python -m benchmarks.cuda --smoke=min`
# on this machine's CPU onnxruntime (the cp312 GPU build does not import here), with the trained
# models unpacked in step 1 (REHEARSE_TRAINED=0: without them), into $REHEARSE_OUT, after
# `python -m benchmarks.cuda.costs --smoke` (calibrate and bench on the CPU EP at toy sizes) into
# $REHEARSE_OUT/costs. Nothing is run on a GPU.
#
# Environment: WHL (.whl), SITE (/tmp/site), PYTHON (python3), ORT_VERSION (1.31.1),
# REHEARSE_OUT (/tmp/lnfold-rehearse), REHEARSE_TRAINED (1), COSTS_OUT (benchmarks/results/cuda/costs),
# CUDA_COSTS_SECONDS (150), SWEEP_SECONDS (250).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)  # benchmarks/cuda/gpu_host/ -> the checkout
cd "$ROOT"
WHL=${WHL:-.whl}
SITE=${SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
ORT_VERSION=${ORT_VERSION:-1.31.1}
MODE=run
case "${1:-}" in
    --check-only|--rehearse|--parts) MODE=${1#--}; shift ;;
esac
die() { echo "run_on_host: $*" >&2; exit 2; }

# ---- 1. reassemble --------------------------------------------------------------------------------
[ -f "$WHL/SHA256SUMS" ] || die "no $WHL/SHA256SUMS: run benchmarks/cuda/gpu_host/prepare.sh where there is network, then copy $WHL/ into this checkout"
ORT_WHEEL=$(awk '{print $2}' "$WHL/SHA256SUMS" | grep "^onnxruntime_gpu-$ORT_VERSION-") || die "SHA256SUMS names no onnxruntime_gpu $ORT_VERSION wheel"
IR_WHEEL=$(awk '{print $2}' "$WHL/SHA256SUMS" | grep '^onnx_ir-') || die "SHA256SUMS names no onnx_ir wheel"
if [ "$MODE" = parts ]; then
    for list in PARTS.SHA256SUMS TRAINED.PARTS.SHA256SUMS; do
        [ -f "$WHL/$list" ] || continue
        awk '{print $2}' "$WHL/$list" | while read -r p; do
            if [ -f "$WHL/$p" ]; then echo "present  $p"; else echo "MISSING  $p"; fi
        done
    done
    exit 0
fi
if [ ! -f "$WHL/$ORT_WHEEL" ]; then
    [ -f "$WHL/PARTS.SHA256SUMS" ] || die "neither $WHL/$ORT_WHEEL nor its parts list"
    missing=$(awk '{print $2}' "$WHL/PARTS.SHA256SUMS" | while read -r p; do [ -f "$WHL/$p" ] || echo "$p"; done)
    [ -z "$missing" ] || die "wheel parts missing: $(echo $missing)"
    echo "== 1. reassemble $ORT_WHEEL from $(wc -l < "$WHL/PARTS.SHA256SUMS") parts"
    (cd "$WHL" && sha256sum --quiet -c PARTS.SHA256SUMS) || die "a wheel part is damaged (sha256)"
    awk '{print $2}' "$WHL/PARTS.SHA256SUMS" | sort | sed "s|^|$WHL/|" | xargs cat > "$WHL/$ORT_WHEEL.tmp"
    mv "$WHL/$ORT_WHEEL.tmp" "$WHL/$ORT_WHEEL"
fi
(cd "$WHL" && sha256sum --quiet -c SHA256SUMS) || die "sha256 of the wheels does not match SHA256SUMS"
echo "== 1. wheels verified: $ORT_WHEEL, $IR_WHEEL"

if [ -f "$WHL/TRAINED.SHA256SUMS" ]; then
    missing=$(awk '{print $2}' "$WHL/TRAINED.PARTS.SHA256SUMS" | while read -r p; do [ -f "$WHL/$p" ] || echo "$p"; done)
    [ -z "$missing" ] || die "trained model parts missing: $(echo $missing)"
    (cd "$WHL" && sha256sum --quiet -c TRAINED.PARTS.SHA256SUMS) || die "a trained model part is damaged (sha256)"
    awk '{print $2}' "$WHL/TRAINED.PARTS.SHA256SUMS" | sort | sed "s|^|$WHL/|" | xargs cat > "$WHL/trained.tar"
    (cd "$WHL" && sha256sum --quiet -c TRAINED.SHA256SUMS) || die "sha256 of trained.tar does not match TRAINED.SHA256SUMS"
    mkdir -p models/trained
    tar -C models/trained -xf "$WHL/trained.tar" && rm -f "$WHL/trained.tar"
    "$PYTHON" - <<'PY' || die "a trained model does not match MANIFEST.json"
import hashlib, json, pathlib, sys
root = pathlib.Path("models/trained")
manifest = json.loads((root / "MANIFEST.json").read_text()).get("models", {}) if (root / "MANIFEST.json").exists() else {}
for model in sorted(root.glob("*.onnx")):
    want = manifest.get(model.stem, {}).get("sha256")
    got = hashlib.sha256(model.read_bytes()).hexdigest()
    if want and got != want:
        sys.exit(f"   {model.name}: sha256 {got} is not the manifest's {want}")
    print(f"   {model.name}: {model.stat().st_size / 1e6:.1f} MB, sha256 {'matches MANIFEST.json' if want else 'not in MANIFEST.json'}")
PY
    echo "== 1. trained models unpacked into models/trained/"
fi

# ---- 2. install into a target folder --------------------------------------------------------------
PIP_PLATFORM=()
if [ "$MODE" = rehearse ]; then
    PIP_PLATFORM=(--only-binary=:all: --implementation cp --python-version 3.12 --platform manylinux_2_28_x86_64)
fi
if "$PYTHON" -m pip --version > /dev/null 2>&1; then
    echo "== 2. pip install --no-index --no-deps --target $SITE"
    "$PYTHON" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "${PIP_PLATFORM[@]}" \
        "$WHL/$ORT_WHEEL" "$WHL/$IR_WHEEL" || die "pip install into $SITE failed"
else  # a wheel of pure Python or of compiled modules installs into a target folder by unpacking it
    echo "== 2. no pip for $PYTHON: unpacking the wheels into $SITE"
    mkdir -p "$SITE"
    for w in "$WHL/$ORT_WHEEL" "$WHL/$IR_WHEEL"; do "$PYTHON" -m zipfile -e "$w" "$SITE" || die "unpacking $w failed"; done
fi
OLD_PYTHONPATH=${PYTHONPATH:-}
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# ---- 3. CUDA libraries ----------------------------------------------------------------------------
NV_LIBS=$("$PYTHON" - <<'PY'
import importlib.util, os
dirs = []
spec = importlib.util.find_spec("nvidia")
for base in (list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []):
    for top, subdirs, files in os.walk(base):
        depth = top[len(base):].count(os.sep)
        if depth >= 3:
            subdirs[:] = []
        if os.path.basename(top) == "lib" and any(".so" in f for f in files):
            dirs.append(top)
print(":".join(sorted(set(dirs))))
PY
)
if [ -n "$NV_LIBS" ]; then
    export LD_LIBRARY_PATH="$NV_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "== 3. LD_LIBRARY_PATH += $(echo "$NV_LIBS" | tr ':' '\n' | wc -l) lib folders of the nvidia packages"
else
    echo "== 3. no nvidia packages in $PYTHON's site-packages: relying on torch / the system for CUDA libraries"
fi

# ---- 4. checks ------------------------------------------------------------------------------------
if [ "$MODE" = rehearse ]; then
    echo "== 4. rehearsal: import checks up to where CUDA is needed"
    "$PYTHON" - "$SITE" "$ORT_VERSION" <<'PY' || die "rehearsal check failed"
import os, re, shutil, subprocess, sys
site, want = sys.argv[1], sys.argv[2]
import onnx_ir
assert onnx_ir.__file__.startswith(site), f"onnx_ir imported from {onnx_ir.__file__}, not {site}"
print(f"   onnx_ir {onnx_ir.__version__} imports from {os.path.dirname(onnx_ir.__file__)}")
pkg = os.path.join(site, "onnxruntime")
init = open(os.path.join(pkg, "__init__.py")).read()
version = re.search(r'__version__ = "([^"]+)"', init).group(1)
assert version == want, f"onnxruntime in {site} is {version}, not {want}"
capi = os.path.join(pkg, "capi")
so = [f for f in os.listdir(capi) if f.startswith("onnxruntime_pybind11_state")]
print(f"   onnxruntime {version} installed in {pkg} ({', '.join(so)}: needs CPython 3.12, this is {sys.version.split()[0]})")
cuda_so = os.path.join(capi, "libonnxruntime_providers_cuda.so")
needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                    subprocess.run(["readelf", "-d", cuda_so], capture_output=True, text=True).stdout)
paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p] + ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64", capi]
for lib in needed:
    where = next((p for p in paths if os.path.exists(os.path.join(p, lib))), None)
    print(f"   CUDA provider needs {lib:28s} {'found in ' + where if where else 'NOT FOUND here (the GPU host needs it: torch for CUDA 13 or the driver)'}")
print("   a CUDA session needs the GPU host: the sweep is rehearsed on this machine's CPU onnxruntime")
PY
    REHEARSE_OUT=${REHEARSE_OUT:-/tmp/lnfold-rehearse}
    TRAINED_ARGS=(--no-trained)
    if [ "${REHEARSE_TRAINED:-1}" = 1 ] && ls models/trained/*.onnx > /dev/null 2>&1; then TRAINED_ARGS=(--trained models/trained); fi
    mkdir -p "$REHEARSE_OUT"
    echo "== 5. rehearsal: python -m benchmarks.cuda.costs --smoke --out $REHEARSE_OUT/costs (CPU onnxruntime)"
    PYTHONPATH="$ROOT${OLD_PYTHONPATH:+:$OLD_PYTHONPATH}" LNFOLD_TRAINED_DIR="$ROOT/models/trained" "$PYTHON" -m benchmarks.cuda.costs \
        --smoke --out "$REHEARSE_OUT/costs" --max-seconds "${CUDA_COSTS_SECONDS:-150}" > "$REHEARSE_OUT.costs.log" 2>&1 \
        || { tail -5 "$REHEARSE_OUT.costs.log" >&2; die "the smoke calibration and bench failed (log: $REHEARSE_OUT.costs.log)"; }
    grep -E "^\[" "$REHEARSE_OUT.costs.log" | tail -12
    echo "== 5. rehearsal: python -m benchmarks.cuda --smoke=min ${TRAINED_ARGS[*]} --out $REHEARSE_OUT (CPU onnxruntime)"
    PYTHONPATH="$ROOT${OLD_PYTHONPATH:+:$OLD_PYTHONPATH}" "$PYTHON" -m benchmarks.cuda --smoke=min "${TRAINED_ARGS[@]}" \
        --out "$REHEARSE_OUT" > "$REHEARSE_OUT.log" 2>&1 || { tail -5 "$REHEARSE_OUT.log" >&2; die "the smoke sweep failed (log: $REHEARSE_OUT.log)"; }
    grep -E "^\[|done in" "$REHEARSE_OUT.log" | grep -v "W:onnxruntime" | tail -20
    exit 0
fi
echo "== 4. CUDA check"
"$PYTHON" - "$SITE" "$ORT_VERSION" <<'PY' || die "CUDA is not usable: nothing was run"
import sys
site, want = sys.argv[1], sys.argv[2]
try:
    import torch  # its CUDA 13 libraries, loaded before onnxruntime's CUDA provider looks for them
    print(f"   torch {torch.__version__}, CUDA {torch.version.cuda}, GPU visible: {torch.cuda.is_available()}")
except ImportError:
    print("   no torch: CUDA libraries come from LD_LIBRARY_PATH")
import onnxruntime as ort
assert ort.__file__.startswith(site), f"onnxruntime imported from {ort.__file__}, not {site}"
assert ort.__version__ == want, f"onnxruntime {ort.__version__}, not {want}"
from benchmarks.cuda.sweep import Device, SweepRefused, _kernel_model
try:
    info = Device("cuda").check(_kernel_model("ln", 64, "float32", 1))
except SweepRefused as e:
    sys.exit(f"   {e}")
print(f"   onnxruntime {ort.__version__} from {site}: a session runs on {info['execution_provider']} "
      f"({info.get('gpu', '?')}, {info.get('gpu_memory', '?')}, driver {info.get('driver', '?')})")
PY
[ "$MODE" = check-only ] && exit 0

# ---- 5. the cost table, the bench, the sweep -------------------------------------------------------
COSTS_OUT=${COSTS_OUT:-benchmarks/results/cuda/costs}
echo "== 5. python -m benchmarks.cuda.costs --out $COSTS_OUT --max-seconds ${CUDA_COSTS_SECONDS:-150}"
LNFOLD_TRAINED_DIR="$ROOT/models/trained" "$PYTHON" -m benchmarks.cuda.costs --out "$COSTS_OUT" \
    --max-seconds "${CUDA_COSTS_SECONDS:-150}" || echo "run_on_host: the cost table / bench part failed (exit $?); the sweep still runs" >&2
SWEEP_ARGS=("$@")
case " $* " in *" --max-seconds "*) ;; *) SWEEP_ARGS+=(--max-seconds "${SWEEP_SECONDS:-250}") ;; esac
echo "== 5. python -m benchmarks.cuda ${SWEEP_ARGS[*]}"
exec "$PYTHON" -m benchmarks.cuda "${SWEEP_ARGS[@]}"
