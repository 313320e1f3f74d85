//! The kernel sources, `kernels/*.cu`, embedded in the binary. Each file is compiled as one
//! NVRTC program with `kernels/common.cuh` prepended (no `#include`: the kernels need no headers).

/// Text prepended to every kernel file.
pub const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// One `kernels/*.cu` file and the `extern "C"` kernels it defines.
pub struct KernelFile {
    /// File stem: `kernels/{name}.cu`.
    pub name: &'static str,
    pub body: &'static str,
    pub functions: &'static [&'static str],
}

impl KernelFile {
    /// The program NVRTC compiles: the common header, then the file (with `#line` so that
    /// compiler messages name the file's own lines).
    pub fn source(&self) -> String {
        format!("{COMMON}\n#line 1 \"{}.cu\"\n{}", self.name, self.body)
    }
}

macro_rules! kernel_file {
    ($name:literal, [$($f:literal),* $(,)?]) => {
        KernelFile {
            name: $name,
            body: include_str!(concat!("../../../kernels/", $name, ".cu")),
            functions: &[$($f),*],
        }
    };
}

/// Every kernel file, in the order they are compiled and loaded.
pub const FILES: &[KernelFile] = &[
    kernel_file!("quantize", ["quantize_q8_1"]),
    kernel_file!(
        "gemv",
        [
            "gemv_q4_0",
            "gemv_q4_1",
            "gemv_q5_0",
            "gemv_q8_0",
            "gemv_q4_k",
            "gemv_q6_k",
            "moe_gemv_q4_0",
            "moe_gemv_q4_1",
            "moe_gemv_q5_0",
            "moe_gemv_q8_0",
            "moe_gemv_q4_k",
            "moe_gemv_q6_k",
            "moe_gemv_mxfp4"
        ]
    ),
    kernel_file!(
        "gemm",
        [
            "gemm_q4_0",
            "gemm_q4_1",
            "gemm_q5_0",
            "gemm_q8_0",
            "gemm_q4_k",
            "gemm_q6_k"
        ]
    ),
    kernel_file!("norm", ["rmsnorm", "layernorm"]),
    kernel_file!("rope", ["rope", "hadamard_64"]),
    kernel_file!(
        "elementwise",
        [
            "silu_mul",
            "gelu_mul",
            "gelu",
            "swiglu_oai_mul",
            "add_scaled",
            "add_bias",
            "scale",
            "softcap"
        ]
    ),
    kernel_file!(
        "moe",
        ["moe_router_f32", "moe_route", "moe_add_bias", "moe_combine"]
    ),
    kernel_file!("embed", ["embed", "put_rows"]),
    kernel_file!("kv", ["kv_append", "kv_copy_block"]),
    kernel_file!(
        "attention",
        [
            "attention_f16_d64",
            "attention_q8_0_d64",
            "attention_q4_0_d64",
            "attention_f16_d128",
            "attention_q8_0_d128",
            "attention_q4_0_d128",
            "attention_f16_d256",
            "attention_q8_0_d256",
            "attention_q4_0_d256",
        ]
    ),
    kernel_file!("sample", ["argmax_rows", "sample_rows"]),
    kernel_file!("dense", ["dense_matmul"]),
    kernel_file!("vit", ["vit_attention", "gather_rows", "pool_squares"]),
    kernel_file!(
        "recurrent",
        [
            "short_conv",
            "conv_silu",
            "l2_norm_heads",
            "delta_rule_d64",
            "delta_rule_d128",
            "split_query",
            "output_gate"
        ]
    ),
];

/// The kernels whose speed matters most (matmuls, the experts' and the encoders' included,
/// attention, and the delta rule, which keeps a head's state in registers): CI fails when
/// ptxas reports a register spill in any of them (`scripts/check-kernels.sh`).
pub fn is_hot(function: &str) -> bool {
    [
        "gemv",
        "gemm",
        "attention",
        "moe_gemv",
        "delta_rule",
        "dense_matmul",
        "vit_attention",
    ]
    .iter()
    .any(|p| function.starts_with(p))
}

/// The kernel file that defines `function`.
pub fn file_of(function: &str) -> Option<&'static KernelFile> {
    FILES.iter().find(|f| f.functions.contains(&function))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_function_is_defined_in_its_file() {
        for f in FILES {
            for func in f.functions {
                let defined = f.body.contains(&format!("void {func}("))
                    || f.body.contains(&format!("KERNEL({func},"))
                    || f.body
                        .lines()
                        .any(|l| l.trim_start().starts_with(&format!("{func}(")));
                assert!(defined, "{func} is not defined in kernels/{}.cu", f.name);
            }
        }
    }

    #[test]
    fn every_kernel_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
        for entry in std::fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if let Some(stem) = name.strip_suffix(".cu") {
                assert!(
                    FILES.iter().any(|f| f.name == stem),
                    "kernels/{name} is not in FILES"
                );
            }
        }
    }
}
