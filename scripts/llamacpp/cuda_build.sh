#!/usr/bin/env bash
# Builds the llama.cpp that llama-cpp-python 0.3.36 vendors with CUDA and RPC, for record_cuda.py,
# on a machine with nvcc, cmake, ninja and gcc and no network:
#
#   scripts/llamacpp/cuda_build.sh SDIST.tar.gz PREFIX [CUDA_ARCHS]      (CUDA_ARCHS: 90 unless given)
#
# SDIST is `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` (docs, vocab models
# and other backends may be stripped from it). Builds only libllama and the ggml libraries it
# links (ggml-base, ggml-cpu, ggml-cuda, ggml-rpc), copies them into the unpacked package's
# llama_cpp/lib and the headers into its include/ (where record.py looks), and writes
# PREFIX/env.sh with the PYTHONPATH and LD_LIBRARY_PATH to source before record_cuda.py.
# A toolkit assembled from pip wheels may lack cuBLAS or the driver library's link name: then
# links to the ones found elsewhere (the nvidia-cublas wheel that PyTorch brings, the driver's
# libcuda.so.1) go in PREFIX/cuda-extra; with no libcuda at all, the build turns off VMM.
set -euo pipefail
SDIST=$(readlink -f "$1"); PREFIX=$(mkdir -p "$2" && cd "$2" && pwd); ARCHS=${3:-90}
tar xzf "$SDIST" -C "$PREFIX"
SRC=$(ls -d "$PREFIX"/llama_cpp_python-*/ | head -1); SRC=${SRC%/}
LLAMA=$SRC/vendor/llama.cpp
BUILD=$PREFIX/build
EXTRA=$PREFIX/cuda-extra
mkdir -p "$EXTRA/lib" "$EXTRA/include"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
# nvcc may be a wrapper script: ask it where its toolkit is
CUDA_HOME=$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1 || true)
CUDA_HOME=$(readlink -f "${CUDA_HOME:-$(dirname "$(readlink -f "$NVCC")")/..}")
CUDA_MAJOR=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
SEARCH="$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true) \
/usr/local /usr/lib /usr/lib64 /opt ${CUDA_EXTRA_SEARCH:-}"
STD_LIBS="$CUDA_HOME/lib64 $CUDA_HOME/lib64/stubs $CUDA_HOME/lib $(echo "$CUDA_HOME"/targets/*/lib) \
$(echo "$CUDA_HOME"/targets/*/lib/stubs) /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/lib64"
echo "cuda_build: nvcc $NVCC (CUDA $CUDA_MAJOR), toolkit $CUDA_HOME"

linkable() {   # is lib$1.so (the name the linker and CMake look for) in a standard place?
    local d
    for d in $STD_LIBS; do [ -e "$d/lib$1.so" ] && return 0; done
    return 1
}
FOUND=$PREFIX/found.txt
candidates() { # the files of interest under SEARCH, looked for once (a large image takes seconds)
    [ -e "$FOUND" ] || find $SEARCH \( -name 'libcublas*.so*' -o -name 'cublas_v2.h' \
        -o -name 'libcudart.so.[0-9]*' \) -print 2>/dev/null > "$FOUND" || true
    cat "$FOUND"
}
provide() {    # link lib$1.so* found anywhere under SEARCH into EXTRA, unversioned name too
    local found
    found=$(candidates | grep -E "/lib$1\.so(\.[0-9][0-9.]*)?$" | sort \
            | awk -v m="lib$1.so.$CUDA_MAJOR" '{ if (index($0, m)) print "0 " $0; else print "1 " $0 }' \
            | sort -s -k1,1 | head -1 | cut -d' ' -f2- || true)   # the toolkit's major version first
    [ -n "$found" ] || return 1
    for f in "$(dirname "$found")"/lib"$1".so*; do ln -sf "$f" "$EXTRA/lib/"; done
    ln -sf "$found" "$EXTRA/lib/lib$1.so"
    echo "cuda_build: lib$1 from $(dirname "$found")"
}
VMM=()
for lib in cublas cublasLt; do
    linkable $lib || provide $lib || { echo "cuda_build: no lib$lib anywhere" >&2; exit 1; }
done
if ! linkable cuda; then
    found=$( (ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF}'; \
              find /usr/local/nvidia /usr/lib /usr/lib64 -name 'libcuda.so.1' 2>/dev/null) | head -1 || true)
    if [ -n "$found" ]; then
        ln -sf "$found" "$EXTRA/lib/libcuda.so"; echo "cuda_build: libcuda from $found"
    else
        VMM=(-DGGML_CUDA_NO_VMM=ON); echo "cuda_build: no libcuda.so: VMM off"
    fi
fi
if ! ls "$CUDA_HOME"/include/cublas_v2.h "$CUDA_HOME"/targets/*/include/cublas_v2.h >/dev/null 2>&1; then
    header=$(candidates | grep '/cublas_v2\.h$' | head -1 || true)
    [ -n "$header" ] || { echo "cuda_build: no cublas_v2.h anywhere" >&2; exit 1; }
    for f in "$(dirname "$header")"/cublas*.h; do ln -sf "$f" "$EXTRA/include/"; done
    echo "cuda_build: cuBLAS headers from $(dirname "$header")"
fi

GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$LLAMA" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_CUDA=ON -DGGML_RPC=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" -DCMAKE_CUDA_COMPILER="$NVCC" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DGGML_CCACHE=OFF \
    -DCMAKE_LIBRARY_PATH="$EXTRA/lib" -DCMAKE_CUDA_FLAGS="-I$EXTRA/include" \
    -DCMAKE_CXX_FLAGS="-I$EXTRA/include" "${VMM[@]}"
[ -n "${CONFIGURE_ONLY:-}" ] && exit 0
cmake --build "$BUILD" -j "$(nproc)" --target llama ggml-rpc
mkdir -p "$SRC/llama_cpp/lib" "$SRC/include"
cp -a "$BUILD"/bin/*.so* "$SRC/llama_cpp/lib/"
cp "$LLAMA"/include/*.h "$LLAMA"/ggml/include/*.h "$SRC/include/"
cudart=$( (find "$CUDA_HOME" -name 'libcudart.so.[0-9]*' 2>/dev/null; candidates) | head -1 || true)
cat > "$PREFIX/env.sh" <<EOF
export PYTHONPATH=$SRC:$LLAMA/gguf-py\${PYTHONPATH:+:\$PYTHONPATH}
export LD_LIBRARY_PATH=$EXTRA/lib:$CUDA_HOME/lib64:$CUDA_HOME/lib${cudart:+:$(dirname "$cudart")}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export LLAMA_CUDA_BUILD="cmake Release, GGML_CUDA=ON GGML_RPC=ON CMAKE_CUDA_ARCHITECTURES=$ARCHS ${VMM[*]:-}"
EOF
echo "cuda_build: done; source $PREFIX/env.sh"
