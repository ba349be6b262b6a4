//! Compiles the C eBPF programs in `bpf/` with clang-19 into `OUT_DIR`.
//!
//! Decision (issue 4): the object is built by every `cargo build`, not committed. clang-19
//! compiles it in well under a second and a committed object would need a CI step to prove
//! it matches its source. Override the compiler with `FQDND_BPF_CLANG`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: &[&str] = &["policy"];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let clang = env::var("FQDND_BPF_CLANG").unwrap_or_else(|_| "clang-19".to_owned());
    println!("cargo:rerun-if-env-changed=FQDND_BPF_CLANG");
    println!("cargo:rerun-if-changed=include/fqdnd_maps.h");

    abi_version(&manifest);
    layout(&clang, &manifest, &out);

    for name in PROGRAMS {
        let src = manifest.join("bpf").join(format!("{name}.c"));
        let obj = out.join(format!("{name}.o"));
        println!("cargo:rerun-if-changed={}", src.display());
        let status = Command::new(&clang)
            .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
            .arg("-I")
            .arg(manifest.join("include"))
            .arg("-I/usr/include/x86_64-linux-gnu")
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("{clang} failed ({s}) compiling {}", src.display()),
            Err(e) => panic!(
                "cannot run `{clang}` ({e}): the eBPF programs need clang 19 and the libbpf \
                 headers. Install them with \
                 `apt-get install -y --no-install-recommends clang-19 libbpf-dev` \
                 (or point FQDND_BPF_CLANG at another clang >= 19)"
            ),
        }
    }
}

/// Exports `FQDND_MAPS_ABI_VERSION` from the header so Rust names the pin directory from it.
fn abi_version(manifest: &std::path::Path) {
    let header = std::fs::read_to_string(manifest.join("include/fqdnd_maps.h"))
        .unwrap_or_else(|e| panic!("reading include/fqdnd_maps.h: {e}"));
    let version = header
        .lines()
        .find_map(|l| l.strip_prefix("#define FQDND_MAPS_ABI_VERSION "))
        .map(str::trim)
        .unwrap_or_else(|| panic!("FQDND_MAPS_ABI_VERSION not found in fqdnd_maps.h"));
    println!("cargo:rustc-env=FQDND_MAPS_ABI_VERSION={version}");
}

/// Compiles and runs a host program that prints `struct field offset size` for every field of
/// the shared structs, as the C compiler lays them out; the Rust tests compare it with
/// `offset_of!` on the `#[repr(C)]` mirrors (src/sys.rs).
fn layout(clang: &str, manifest: &std::path::Path, out: &std::path::Path) {
    const FIELDS: &[(&str, &[&str])] = &[
        ("fqdnd_ipcache_key4", &["prefixlen", "addr"]),
        ("fqdnd_ipcache_key6", &["prefixlen", "addr"]),
        ("fqdnd_ipcache_value", &["identity"]),
        ("fqdnd_endpoint_value", &["endpoint", "flags", "pad"]),
        (
            "fqdnd_policy_key",
            &["identity", "endpoint", "dport", "proto", "pad"],
        ),
        ("fqdnd_policy_value", &["flags"]),
        (
            "fqdnd_ct_key",
            &["saddr", "daddr", "sport", "dport", "proto", "family", "pad"],
        ),
        (
            "fqdnd_ct_value",
            &["created_ns", "last_seen_ns", "flags", "pad"],
        ),
        (
            "fqdnd_drop_event",
            &[
                "ts_ns", "ifindex", "identity", "endpoint", "sport", "dport", "proto", "family",
                "reason", "pad", "saddr", "daddr",
            ],
        ),
    ];
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"fqdnd_maps.h\"\nint main(void) {\n",
    );
    for (s, fields) in FIELDS {
        c += &format!("printf(\"{s} - 0 %zu\\n\", sizeof(struct {s}));\n");
        for f in *fields {
            c += &format!(
                "printf(\"{s} {f} %zu %zu\\n\", offsetof(struct {s}, {f}), \
                 sizeof(((struct {s} *)0)->{f}));\n"
            );
        }
    }
    c += "return 0; }\n";
    let src = out.join("layout.c");
    let bin = out.join("layout");
    std::fs::write(&src, c).unwrap_or_else(|e| panic!("writing {}: {e}", src.display()));
    let ok = Command::new(clang)
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "compiling the layout probe {} with {clang} failed",
        src.display()
    );
    let output = Command::new(&bin)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    assert!(output.status.success(), "layout probe failed");
    std::fs::write(out.join("layout.txt"), output.stdout)
        .unwrap_or_else(|e| panic!("writing layout.txt: {e}"));
}
