//! Build script of `weft-transport`.
//!
//! Without the `ofi` feature it does nothing, so the crate builds on machines without
//! libfabric. With `ofi` it (1) finds libfabric through `pkg-config`, (2) compiles the C
//! shims in `csrc/shim.c` (out-of-line wrappers over libfabric's `static inline` calls) and
//! (3) runs bindgen over `csrc/shim.h` (which includes the `rdma/*.h` headers weft uses) with
//! an allowlist, writing `$OUT_DIR/ofi_bindings.rs` for `src/ofi/sys.rs`.
//!
//! With `pmix` it finds PMIx (>= 4.1) through `pkg-config` and runs bindgen over
//! `csrc/pmix.h` (the client calls of `pmix.h` the bootstrap uses), writing
//! `$OUT_DIR/pmix_bindings.rs` for `src/pmix.rs`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_OFI");
    // Cargo sets CARGO_FEATURE_OFI exactly when the build-dependencies of `ofi` are compiled
    // in (cfg feature = "ofi" in a build script); both are checked so the intent is explicit.
    #[cfg(feature = "ofi")]
    if std::env::var_os("CARGO_FEATURE_OFI").is_some() {
        ofi::build();
    }
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_PMIX");
    #[cfg(feature = "pmix")]
    if std::env::var_os("CARGO_FEATURE_PMIX").is_some() {
        pmix::build();
    }
}

/// What both bindings share: `builder` (header and allowlists set) with `Default` derived,
/// unsafe calls wrapped, no layout tests or comments, the library's include paths; generated
/// into `$OUT_DIR/<file>`.
#[cfg(any(feature = "ofi", feature = "pmix"))]
fn generate(builder: bindgen::Builder, include_paths: &[std::path::PathBuf], what: &str, file: &str) {
    let mut builder = builder
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .derive_default(true)
        .wrap_unsafe_ops(true)
        .layout_tests(false)
        .generate_comments(false);
    for path in include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|e| panic!("bindgen over {what} failed: {e}"));
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    bindings.write_to_file(out.join(file)).unwrap_or_else(|e| panic!("write {file}: {e}"));
}

#[cfg(feature = "pmix")]
mod pmix {
    use std::path::PathBuf;

    pub(super) fn build() {
        let lib = pkg_config::Config::new().atleast_version("4.1").probe("pmix").unwrap_or_else(|e| {
            panic!(
                "feature `pmix` needs PMIx >= 4.1 found through pkg-config \
                     (Debian: run .ci/ofi-deps.sh, which installs libpmix-dev): {e}"
            )
        });
        let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let header = manifest.join("csrc").join("pmix.h");
        println!("cargo:rerun-if-changed={}", header.display());
        let builder = bindgen::Builder::default()
            .header(header.display().to_string())
            .allowlist_function(
                "PMIx_Init|PMIx_Finalize|PMIx_Put|PMIx_Commit|PMIx_Fence|PMIx_Fence_nb|PMIx_Query_info_nb|PMIx_Get|PMIx_Error_string|PMIx_Value_load|PMIx_Value_destruct|PMIx_Info_load|PMIx_Register_event_handler|PMIx_Deregister_event_handler",
            )
            .allowlist_type("pmix_.*")
            .allowlist_var("PMIX_.*");
        super::generate(builder, &lib.include_paths, "the PMIx headers", "pmix_bindings.rs");
    }
}

#[cfg(feature = "ofi")]
mod ofi {
    use std::path::PathBuf;

    /// Macros whose values are C `int` error numbers (`fi_errno.h`); every other `FI_*`
    /// integer macro is a 64-bit flag word and is generated as `u64`.
    fn is_errno_macro(name: &str) -> bool {
        name.starts_with("FI_E") && !name.starts_with("FI_EP_") && !name.starts_with("FI_ENDPOINT") && !name.starts_with("FI_EXEC")
    }

    #[derive(Debug)]
    struct FlagMacros;

    impl bindgen::callbacks::ParseCallbacks for FlagMacros {
        fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
            use bindgen::callbacks::IntKind;
            if !name.starts_with("FI_") {
                return None;
            }
            if is_errno_macro(name) {
                Some(IntKind::Int)
            } else {
                Some(IntKind::U64)
            }
        }
    }

    pub(super) fn build() {
        let lib = pkg_config::Config::new().atleast_version("1.17").probe("libfabric").unwrap_or_else(|e| {
            panic!(
                "feature `ofi` needs libfabric >= 1.17 found through pkg-config \
                     (Debian: run .ci/ofi-deps.sh): {e}"
            )
        });

        let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let csrc = manifest.join("csrc");
        println!("cargo:rerun-if-changed={}", csrc.join("shim.c").display());
        println!("cargo:rerun-if-changed={}", csrc.join("shim.h").display());

        let mut cc = cc::Build::new();
        cc.file(csrc.join("shim.c")).include(&csrc).warnings(true);
        for path in &lib.include_paths {
            cc.include(path);
        }
        cc.compile("weft_ofi_shim");

        let builder = bindgen::Builder::default()
            .header(csrc.join("shim.h").display().to_string())
            .parse_callbacks(Box::new(FlagMacros))
            .allowlist_function("weft_fi_.*")
            .allowlist_function("fi_getinfo|fi_freeinfo|fi_dupinfo|fi_fabric|fi_strerror")
            .allowlist_type("fi_.*|fid_.*|fid")
            .allowlist_var("FI_.*")
            .default_enum_style(bindgen::EnumVariation::Consts)
            .prepend_enum_name(false);
        super::generate(builder, &lib.include_paths, "libfabric headers", "ofi_bindings.rs");
    }
}
