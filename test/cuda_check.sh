#!/usr/bin/env bash
# The checks that need a CUDA GPU, for a machine that has one (CI has none).
#
#   bash test/cuda_check.sh OUTDIR [STEP ...]
#
# Needs PyTorch with CUDA, numpy, safetensors, sentencepiece and pytest in
# $PYTHON (default python3); no ROS: only the ROS-free core runs. Run from the
# repository root. Each step has a time limit, writes its log (and JSON, for
# the benchmarks) into OUTDIR, and a failed or timed-out step does not stop
# the next. Steps (default: the first four, in this order):
#
#   env          the GPU, torch and compiler versions (fails without a CUDA device)
#   pi05-pieces  random pi05 weights, bfloat16, 3 cameras: the pieces alone,
#                eager and compiled, and the prefill against plain matmuls
#   tests        test/test_cuda_frames.py: compiled frames (CUDA graphs) = eager
#   default      the embedded default model, float32: baseline and oxygen, eager
#                and compiled side by side (the README's compiled-frames table)
#   pi05-frames  the same pi05 model's frames: baseline and oxygen, eager and
#                compiled (every bucket of a pi05 engine: a long compile)
#   no-preload   the default model's pieces, compiled, without the preload: on a
#                machine whose libraries crash without it, the eager figures and
#                "compiled: not run: ... LD_PRELOAD=..." (load_probe.py)
#
# Seen on an H200 (16 cores), 2026-12-04: the pi05 eager pieces took 28 s; a
# tiny-model package took about 25 s to build, a pi05 one 20 s or more;
# `tests` took 178 s. The pi05 denoise package of the whole 10-step loop was
# still compiling when pi05-pieces' 8 minutes ran out (on CUDA it is now one
# step's package, as on the CPU, where it built in 44 s). A 15-minute
# lease in two calls of at most 10 minutes: `env pi05-pieces`, then `tests
# default`, back to back (a machine goes back after 30 s idle), with
# OXYGEN_COMPILE_CACHE outside OUTDIR (OUTDIR is emptied before each call).
#
# Compiling is the slow part; the compile cache is OUTDIR/compile-cache unless
# OXYGEN_COMPILE_CACHE says otherwise. The exit status is the number of
# steps that failed.
#
# The steps run with the system's C++ runtime preloaded (LD_PRELOAD, unless
# CXX_PRELOAD=0): on the H200 machine tried (torch 2.11+cu130, g++ 13) every
# AOTInductor CUDA library crashed the process that created its container
# without it, and loaded with it (oxygen_ros/core/model/load_probe.py). With
# CXX_PRELOAD=0 the compiled steps show what a user without it gets: the
# engine runs eager and says why, and --pieces-only gives eager and the reason.
set -u
out=${1:?usage: bash test/cuda_check.sh OUTDIR [STEP ...]}
shift
steps=${*:-env pi05-pieces tests default}
PYTHON=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OXYGEN_COMPILE_CACHE=${OXYGEN_COMPILE_CACHE:-$out/compile-cache}
if [ "${CXX_PRELOAD:-1}" != 0 ] && runtime=$(g++ -print-file-name=libstdc++.so.6 2>/dev/null) && [ -e "$runtime" ]; then
    runtime=$(realpath "$runtime")
    export LD_PRELOAD="$runtime${LD_PRELOAD:+ $LD_PRELOAD}"
    echo "cuda_check: LD_PRELOAD=$LD_PRELOAD"
fi
bench=("$PYTHON" -m oxygen_ros.tools.bench --device cuda)
failed=0

step() {  # step NAME SECONDS COMMAND...: run it, log it, count a failure
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout --signal=INT --kill-after=20 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

for s in $steps; do
    case $s in
    env) step env 60 "$PYTHON" -c "
import shutil, sys, torch
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)
print('device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NONE')
print('g++', shutil.which('g++'), 'nvcc', shutil.which('nvcc'))
sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: the other steps cannot run here')" ;;
    tests) step tests 300 "$PYTHON" -m pytest -q -rs -p no:cacheprovider test/test_cuda_frames.py ;;
    default) step default 300 "${bench[@]}" --settings baseline,oxygen --compile on,off --frames 200 \
        --json "$out/default.json" ;;
    pi05-pieces) step pi05-pieces 480 "${bench[@]}" --pieces-only --preset pi05 --dtype bfloat16 --cameras 3 \
        --threads 2 --compile on,off --repeats 10 --json "$out/pi05-pieces.json" ;;
    pi05-frames) step pi05-frames 540 "${bench[@]}" --preset pi05 --dtype bfloat16 --cameras 3 --threads 2 \
        --settings baseline,oxygen --compile on,off --frames 30 --warmup 5 --json "$out/pi05-frames.json" ;;
    no-preload) step no-preload 150 env -u LD_PRELOAD OXYGEN_COMPILE_CACHE="$out/no-preload-cache" \
        "${bench[@]}" --pieces-only --compile on,off --repeats 3 --json "$out/no-preload.json" ;;
    *) echo "unknown step $s (env tests default pi05-pieces pi05-frames no-preload)"; failed=$((failed + 1)) ;;
    esac
done
echo "cuda_check: $failed step(s) failed"
exit "$failed"
