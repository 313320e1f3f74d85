#!/usr/bin/env bash
# The CUDA kernels without a GPU: installs NVRTC and ptxas from NVIDIA's PyPI wheels into
# target/cuda-wheels/ (pinned; no toolkit, no driver), runs tests/cuda_kernels.rs with the
# `cuda` feature (every kernels/*.cu compiled by NVRTC for sm_87 and sm_90 through the runtime's
# own code path, PTX written to target/cuda-ptx/; and the no-GPU fallback of `edgelm run` and
# `edgelm serve`), then runs `ptxas -v` on each PTX for each architecture and fails when a hot
# kernel (gemv*, gemm*, attention*, moe_gemv*, delta_rule*) spills registers. Writes target/cuda-ptx/ptxas-report.txt
# (registers, stack, spills per kernel and architecture).
#
# The kernels include no CUDA header (kernels/common.cuh), so the runtime wheel (headers) is
# installed for completeness of the toolchain but nothing is compiled against it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# CUDA 12.6 (JetPack 6.1+): the same version as cudarc's `cuda-12060` bindings.
wheels=(
    nvidia-cuda-nvrtc-cu12==12.6.77
    nvidia-cuda-runtime-cu12==12.6.77
    nvidia-cuda-nvcc-cu12==12.6.85
)
dest="$root/target/cuda-wheels"
out="$root/target/cuda-ptx"
log() { echo "check-kernels: $*" >&2; }

stamp="$dest/.installed"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${wheels[*]}" ]; then
    log "pip install --target ${dest#"$root"/} ${wheels[*]}"
    rm -rf "$dest"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dest" \
        "${wheels[@]}"
    echo "${wheels[*]}" >"$stamp"
fi
nvrtc_lib="$dest/nvidia/cuda_nvrtc/lib"
ptxas="$dest/nvidia/cuda_nvcc/bin/ptxas"
[ -d "$nvrtc_lib" ] || { log "FAILED: no $nvrtc_lib in the nvrtc wheel"; exit 1; }
[ -f "$ptxas" ] || { log "FAILED: no ptxas in the nvcc wheel"; exit 1; }
chmod +x "$ptxas"
rm -rf "$out"
mkdir -p "$out"
log "cargo test --profile suite --features cuda --lib --test cuda_kernels (NVRTC from the wheel)"
# The library's backend::cuda unit tests and every test of tests/cuda_kernels.rs (the filters
# select both; the device tests stay #[ignore]d and are reported as such, not as passes).
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" EDGELM_PTX_OUT="$out" \
    cargo test --profile suite --features cuda --lib --test cuda_kernels -- --test-threads=1 \
    backend::cuda:: every_kernel cuda_build device_

report="$out/ptxas-report.txt"
failed=0
printf '%-8s %-22s %5s %6s %7s %7s\n' arch kernel regs stack spill_st spill_ld >"$report"
for arch_dir in "$out"/sm_*; do
    arch="$(basename "$arch_dir")"
    for ptx in "$arch_dir"/*.ptx; do
        if ! "$ptxas" -v -arch="$arch" -o /dev/null "$ptx" >"$ptx.ptxas" 2>&1; then
            cat "$ptx.ptxas" >&2
            log "FAILED: ptxas -arch=$arch rejects ${ptx#"$root"/}"
            failed=1
            continue
        fi
        # "Compiling entry function 'X' for 'sm_87'", then "N bytes stack frame, N bytes spill
        # stores, N bytes spill loads", then "Used N registers".
        awk -v arch="$arch" '
            /Compiling entry function/ { split($0, q, "'"'"'"); fn = q[2] }
            /bytes stack frame/ { st = $1; ss = $5; sl = $9 }
            /Used [0-9]+ registers/ && fn != "" {
                for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1)
                printf "%-8s %-22s %5s %6s %7s %7s\n", arch, fn, regs, st, ss, sl
                fn = ""
            }' "$ptx.ptxas" >>"$report"
    done
done
cat "$report"
kernels="$(tail -n +2 "$report" | wc -l)"
expected="$(cat "$out"/sm_*/*.ptx | grep -c '^\.visible \.entry' || true)"
if [ "$kernels" -ne "$expected" ] || [ "$kernels" -eq 0 ]; then
    log "FAILED: ptxas reported $kernels kernels, the PTX has $expected"
    failed=1
fi
while read -r arch fn regs stack ss sl; do
    case "$fn" in gemv* | gemm* | attention* | moe_gemv* | delta_rule* | dense_matmul* | vit_attention*) ;;
        *) continue ;;
    esac
    if [ "$ss" != 0 ] || [ "$sl" != 0 ]; then
        log "FAILED: hot kernel $fn spills on $arch ($ss bytes stored, $sl loaded)"
        failed=1
    fi
done < <(tail -n +2 "$report")
[ "$failed" -eq 0 ] || exit 1
log "ok: $kernels kernel builds checked by ptxas, no spills in the hot kernels (kernels.rs is_hot)"
