//! Generates Rust declarations of the ORT ABI from kiln's own header
//! (`include/kiln_ort_abi.h`), or from official ORT headers when
//! `ORT_INCLUDE_DIR` points at a folder holding `onnxruntime_c_api.h` and
//! `onnxruntime_ep_c_api.h`. Either way the crate sees the same names.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=include/kiln_ort_abi.h");
    println!("cargo:rerun-if-env-changed=ORT_INCLUDE_DIR");

    let builder = match env::var_os("ORT_INCLUDE_DIR") {
        Some(dir) => official_headers(PathBuf::from(dir)),
        None => bindgen::Builder::default().header("include/kiln_ort_abi.h"),
    };
    let bindings = builder
        .allowlist_type("Ort.*|ONNX.*")
        .allowlist_var("ORT_.*|ONNX_.*|Ort.*")
        .allowlist_function("OrtGetApiBase")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen failed on the ORT ABI header: {e}\n\
                 kiln needs libclang: run `apt-get install libclang-dev` (or `make deps`)"
            )
        });
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("ort_abi.rs");
    bindings.write_to_file(&out).expect("write ort_abi.rs");
}

fn official_headers(dir: PathBuf) -> bindgen::Builder {
    let wrapper = PathBuf::from(env::var("OUT_DIR").unwrap()).join("ort_official.h");
    let text = format!(
        "#include \"{0}/onnxruntime_c_api.h\"\n#include \"{0}/onnxruntime_ep_c_api.h\"\n",
        dir.display()
    );
    std::fs::write(&wrapper, text).expect("write wrapper header");
    println!("cargo:rerun-if-changed={}", dir.display());
    bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_arg(format!("-I{}", dir.display()))
}
