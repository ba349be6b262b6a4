//! Provides the C eBPF programs in `bpf/` as objects in `OUT_DIR`, and the layout probe the
//! `sys` tests compare the Rust mirrors with.
//!
//! Decision (issue 4): the compiled object is **committed** (`obj/<name>.o`) so that a fresh
//! machine without clang-19 builds and runs fqdnd (the README's main job needs no network);
//! when clang-19 is present the build compiles the source again and compares. A difference
//! is a warning that names the fix, or an error with `FQDND_BPF_CHECK=1` (set by
//! `scripts/test.sh`, hence CI): a committed object never drifts from its source unnoticed.
//! `FQDND_BPF_UPDATE=1` writes the fresh object over the committed one. The compile runs in
//! the crate directory with relative paths so the object (its BTF and line info) is the same
//! bytes from any checkout. Override the compiler with `FQDND_BPF_CLANG`.
//!
//! Each `bpf/<name>.c` of `PROGRAMS` is one compilation unit and one object; `policy.c`
//! includes the programs (`bpf_tc.c`, `bpf_sock.c`) and the headers they share (`bpf/lib/`),
//! so any change under `bpf/` rebuilds and rechecks it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAMS: &[&str] = &["policy"];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let clang = env::var("FQDND_BPF_CLANG").unwrap_or_else(|_| "clang-19".to_owned());
    let check = env::var("FQDND_BPF_CHECK").is_ok_and(|v| v == "1");
    let update = env::var("FQDND_BPF_UPDATE").is_ok_and(|v| v == "1");
    for var in [
        "FQDND_BPF_CLANG",
        "FQDND_BPF_CHECK",
        "FQDND_BPF_UPDATE",
        "CC",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=include/fqdnd_maps.h");
    // A directory: cargo rescans every file under it (the included programs and lib/).
    println!("cargo:rerun-if-changed=bpf");

    abi_version(&manifest);
    layout(&manifest, &out);

    let have_clang = Command::new(&clang)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_clang && check {
        panic!(
            "FQDND_BPF_CHECK=1 but `{clang}` cannot run: install it with \
             `apt-get install -y --no-install-recommends clang-19 libbpf-dev` \
             (scripts/test.sh does)"
        );
    }
    for name in PROGRAMS {
        let src = Path::new("bpf").join(format!("{name}.c"));
        let committed = manifest.join("obj").join(format!("{name}.o"));
        let obj = out.join(format!("{name}.o"));
        println!("cargo:rerun-if-changed={}", manifest.join(&src).display());
        println!("cargo:rerun-if-changed={}", committed.display());
        if !have_clang {
            std::fs::copy(&committed, &obj).unwrap_or_else(|e| {
                panic!(
                    "{clang} is not installed and the committed object {} cannot be read ({e})",
                    committed.display()
                )
            });
            continue;
        }
        let status = Command::new(&clang)
            .current_dir(&manifest)
            .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
            .args(["-I", "include", "-I/usr/include/x86_64-linux-gnu", "-c"])
            // The checkout's path must not reach the debug info (DW_AT_comp_dir).
            .arg(format!("-fdebug-prefix-map={}=.", manifest.display()))
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!(
                "{clang} failed ({s}) compiling {} (is libbpf-dev installed?)",
                src.display()
            ),
            Err(e) => panic!("cannot run `{clang}`: {e}"),
        }
        let fresh = std::fs::read(&obj).unwrap_or_default();
        let same = std::fs::read(&committed).is_ok_and(|c| c == fresh);
        if same {
            continue;
        }
        if update {
            std::fs::create_dir_all(manifest.join("obj"))
                .and_then(|()| std::fs::write(&committed, &fresh))
                .unwrap_or_else(|e| panic!("writing {}: {e}", committed.display()));
        } else if check {
            panic!(
                "the committed {} does not match {} compiled by {clang}: rebuild it with \
                 `FQDND_BPF_UPDATE=1 cargo build -p fqdnd-ebpf` and commit it",
                committed.display(),
                src.display()
            );
        } else {
            println!(
                "cargo:warning=ebpf/obj/{name}.o is stale (differs from bpf/{name}.c compiled by \
                 {clang}); using the fresh build. Refresh it: FQDND_BPF_UPDATE=1 cargo build -p fqdnd-ebpf"
            );
        }
    }
}

/// Exports `FQDND_MAPS_ABI_VERSION` from the header so Rust names the pin directory from it.
fn abi_version(manifest: &Path) {
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
/// The host compiler is `$CC` or `cc` (Rust needs one to link, so it is always there).
fn layout(manifest: &Path, out: &Path) {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    const FIELDS: &[(&str, &[&str])] = &[
        ("fqdnd_ipcache_key4", &["prefixlen", "addr"]),
        ("fqdnd_ipcache_key6", &["prefixlen", "addr"]),
        ("fqdnd_ipcache_value", &["identity"]),
        ("fqdnd_endpoint_value", &["endpoint", "flags", "pad"]),
        (
            "fqdnd_dns_proxy",
            &["addr4", "port4", "pad4", "addr6", "port6", "pad6"],
        ),
        (
            "fqdnd_policy_key",
            &[
                "prefixlen",
                "identity",
                "endpoint",
                "proto",
                "pad",
                "dport",
                "pad2",
            ],
        ),
        ("fqdnd_ep_addr_key", &["ifindex", "family", "pad", "addr"]),
        ("fqdnd_ep_addr_value", &["endpoint", "pad"]),
        ("fqdnd_policy_value", &["flags"]),
        (
            "fqdnd_ct_key",
            &[
                "saddr", "daddr", "sport", "dport", "proto", "family", "zone", "pad",
            ],
        ),
        (
            "fqdnd_ct_value",
            &[
                "created_ns",
                "last_seen_ns",
                "expires_ns",
                "flags",
                "rev_nat",
                "backend",
            ],
        ),
        (
            "fqdnd_settings",
            &[
                "ct_tcp_syn_ns",
                "ct_tcp_established_ns",
                "ct_tcp_closing_ns",
                "ct_other_ns",
            ],
        ),
        (
            "fqdnd_frag_key",
            &["saddr", "daddr", "id", "proto", "family", "pad"],
        ),
        (
            "fqdnd_frag_value",
            &["created_ns", "sport", "dport", "backend", "rev_nat"],
        ),
        (
            "fqdnd_lb_svc_key",
            &["addr", "dport", "slot", "proto", "family", "pad"],
        ),
        (
            "fqdnd_lb_svc_value",
            &["count", "backend", "rev_nat", "pad"],
        ),
        ("fqdnd_lb_backend", &["addr", "port", "proto", "family"]),
        ("fqdnd_lb_revnat", &["addr", "port", "family", "pad"]),
        (
            "fqdnd_drop_event",
            &[
                "ts_ns", "ifindex", "identity", "endpoint", "sport", "dport", "proto", "family",
                "reason", "source", "pad", "saddr", "daddr",
            ],
        ),
        (
            "fqdnd_sock_origin",
            &["addr", "port", "endpoint", "family", "proto", "pad"],
        ),
        ("fqdnd_origin_key", &["addr", "port", "proto", "family"]),
        ("fqdnd_sock_cfg", &["netns_cookie", "endpoints", "pad"]),
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
    let ok = Command::new(&cc)
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
        "compiling the layout probe {} with {cc} failed",
        src.display()
    );
    let output = Command::new(&bin)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    assert!(output.status.success(), "layout probe failed");
    std::fs::write(out.join("layout.txt"), output.stdout)
        .unwrap_or_else(|e| panic!("writing layout.txt: {e}"));
}
