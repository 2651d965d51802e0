#!/bin/bash
# device_pack.sh: builds what scripts/device_run.sh runs on the GPU machine and packs it into
# .device/ (run here, on the build machine, from the project root):
#   - .device/bin.txz: the stripped binaries of `make CUDA=1 BUILD=build-gpu`, bench_gpu,
#     check_invariance, libktrace.so with libcupti.so.13, and duoserve-test-cuda-clk and
#     bench_gpu-clk (built with -DFA_CLOCKS in build-clk, CUDA and C alike: the flash kernel's
#     phase stamps and the code that prints them, which no other build compiles; CLK=0
#     leaves them out);
#   - the runtime .debs (../shared/device/prepare.sh) and the fixtures the run reads, copied
#     from ../shared (.device/ is git-ignored and never committed).
# Then: the device tool with command "bash scripts/device_run.sh ..." and carry [".device"].
set -euo pipefail
SHARED=${SHARED:-../shared}
J=${J:-2}
[ -f .device/env.sh ] || "$SHARED/device/prepare.sh" .device
mkdir -p .device/models .device/tokenizers
[ -d .device/models/stories260k ] || cp -r "$SHARED/models/stories260k" .device/models/
[ -d .device/traces ] || cp -r "$SHARED/traces" .device/
[ -d .device/tokenizers/llama3 ] || cp -r "$SHARED/tokenizers/llama3" .device/tokenizers/
[ -f .device/llama3_8b_pattern.tsv ] || cp "$SHARED/duo-attention/attn_patterns/Llama-3-8B-Instruct-Gradient-1048k/lr=0.02-reg=0.05-ctx=1000_32000-multi_passkey10/full_attention_heads.tsv" .device/llama3_8b_pattern.tsv
make -j"$J" CUDA=1 BUILD=build-gpu build-gpu/duoserve build-gpu/duoserve-test-cuda build-gpu/duoserve-test-cuda-sampling \
    build-gpu/bench_gpu build-gpu/check_invariance build-gpu/libktrace.so
# the Makefile's NVCCFLAGS, for the builds below that add defines to them
NVF="-O3 -g -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -I."
[ "${CLK:-1}" = 0 ] || make -j"$J" CUDA=1 BUILD=build-clk CFLAGS="-O2 -g -DFA_CLOCKS" NVCCFLAGS="$NVF -DFA_CLOCKS" \
    build-clk/duoserve-test-cuda build-clk/bench_gpu
# VARIANTS="name:-DX=v,-DY=w ...": duoserve-test-cuda-NAME and bench_gpu-NAME built again with those
# nvcc defines (build-NAME, from a copy of build-gpu with the objects that read them rebuilt: VARIANT_OBJS,
# default the objects of the cuda/*.cu files that name one of the macros, every CUDA object where a
# cuda/*.cuh names one; a variant whose macros no file names stops the pack: it would be the main build
# again under another name), for an A/B of a compile-time choice in one run. A macro that a C file
# names too (engine/, server/, tests/, scripts/: e.g. a layout the CPU backend and the kernels share)
# goes to the C compiler as well, and the C objects are rebuilt (the Makefile's flags stamp)
for v in ${VARIANTS:-}; do
    name=${v%%:*}; defs=$(echo "${v#*:}" | tr ',' ' ')
    cdefs=
    for d in $defs; do
        mac=${d#-D}; mac=${mac%%=*}
        if grep -rqw --include='*.c' --include='*.h' -- "$mac" engine server tests scripts; then cdefs="$cdefs $d"; fi
    done
    rm -rf build-$name && cp -a build-gpu build-$name
    # (the copied dependency files name build-gpu's objects: renamed, make rebuilds what a changed
    # header reaches in the copy too; run 69's variant, a copy without this, kept stale objects)
    find build-$name -name '*.d' -exec sed -i "s|^build-gpu/|build-$name/|" {} +
    objs=${VARIANT_OBJS:-}
    if [ -z "$objs" ]; then
        for d in $defs; do
            mac=${d#-D}; mac=${mac%%=*}
            for f in $(grep -lw -- "$mac" cuda/*.cu cuda/*.cuh || true); do
                case $f in *.cuh) objs="$objs $(ls cuda/*.cu | sed 's/\.cu$/.o/')" ;; *) objs="$objs ${f%.cu}.o" ;; esac
            done
        done
        [ -n "$objs" ] || [ -n "$cdefs" ] || { echo "device_pack: variant $name: no file under cuda/ names $defs" >&2; exit 1; }
    fi
    for o in $(echo $objs | tr ' ' '\n' | sort -u); do rm -f build-$name/$o; done
    make -j"$J" CUDA=1 BUILD=build-$name NVCCFLAGS="$NVF $defs" ${cdefs:+CFLAGS="-O2 -g$cdefs"} \
        build-$name/duoserve-test-cuda build-$name/bench_gpu build-$name/duoserve
done
cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
rm -rf /tmp/device_pack && mkdir -p /tmp/device_pack/bin
for f in duoserve duoserve-test-cuda duoserve-test-cuda-sampling bench_gpu check_invariance libktrace.so; do
    cp build-gpu/$f /tmp/device_pack/bin/
done
if [ "${CLK:-1}" != 0 ]; then
    cp build-clk/duoserve-test-cuda /tmp/device_pack/bin/duoserve-test-cuda-clk
    cp build-clk/bench_gpu /tmp/device_pack/bin/bench_gpu-clk
fi
for v in ${VARIANTS:-}; do
    name=${v%%:*}
    for f in duoserve-test-cuda bench_gpu duoserve; do cp build-$name/$f /tmp/device_pack/bin/$f-$name; done
done
cp -L "$cuda"/lib64/libcupti.so.13 /tmp/device_pack/bin/ 2>/dev/null || cp -L "$cuda"/extras/CUPTI/lib64/libcupti.so.13 /tmp/device_pack/bin/
strip /tmp/device_pack/bin/* 2>/dev/null || true
tar cJf .device/bin.txz -C /tmp/device_pack bin
ls -la .device/bin.txz
