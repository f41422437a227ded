//! The R source package that installs anywhere: `R CMD INSTALL mizu_*.tar.gz` on a machine with
//! R and a Rust toolchain, without network and without this repository. The tarball carries
//! the Rust crates it builds (`src/rust`: the runtime's library crates and `mizu-r`, with their
//! tests, benches and test helpers left out) and every crate they depend on, vendored
//! (`src/rust/vendor`, read through `src/rust/cargo/vendor.toml`); `src/Makevars` builds from there,
//! offline, when it finds them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::r::{ensure_r, r_command};
use crate::{Res, cargo, run};

/// The crates the R package builds, in dependency order.
const CRATES: &[&str] = &[
    "mizu-shm",
    "mizu-queue",
    "mizu-rng",
    "mizu-wire",
    "mizu-pool",
    "mizu-r",
];

/// Builds the self-contained source tarball into `target/rsrc`; its path.
pub fn source_tarball(root: &Path) -> Result<PathBuf, String> {
    ensure_r(root)?;
    let out = root.join("target/rsrc");
    let _ = std::fs::remove_dir_all(&out);
    let pkg = out.join("mizu");
    copy_dir(&root.join("mizu-r/pkg"), &pkg, &|p| {
        // Build products of an in-place install.
        !matches!(
            p.extension().and_then(|x| x.to_str()),
            Some("o" | "so" | "dll")
        )
    })?;
    let rust = pkg.join("src/rust");
    std::fs::create_dir_all(&rust).map_err(|e| e.to_string())?;
    // The workspace: the root manifest with only the R crate as a member (the library crates
    // are path dependencies inside it, so members too), and the root's lock file.
    let manifest = read(&root.join("Cargo.toml"))?;
    let members = manifest
        .lines()
        .find(|l| l.starts_with("members"))
        .ok_or("the root Cargo.toml has no members line")?;
    write(
        &rust.join("Cargo.toml"),
        &manifest.replace(members, "members = [\"mizu-r\"]"),
    )?;
    std::fs::copy(root.join("Cargo.lock"), rust.join("Cargo.lock")).map_err(|e| e.to_string())?;
    for c in CRATES {
        copy_dir(&root.join(c).join("src"), &rust.join(c).join("src"), &|p| {
            // Test helper programs: not part of the library.
            !p.components().any(|c| c.as_os_str() == "bin")
        })?;
        let m = read(&root.join(c).join("Cargo.toml"))?;
        write(&rust.join(c).join("Cargo.toml"), &library_manifest(&m))?;
    }
    let vendored = Command::new(cargo())
        .current_dir(&rust)
        .args(["vendor", "vendor"])
        .output()
        .map_err(|e| format!("cargo vendor: {e}"))?;
    if !vendored.status.success() {
        return Err(format!(
            "cargo vendor failed:\n{}",
            String::from_utf8_lossy(&vendored.stderr)
        ));
    }
    slim_vendored(&rust.join("vendor"))?;
    // Paths in a cargo configuration file are relative to the parent of its directory.
    std::fs::create_dir_all(rust.join("cargo")).map_err(|e| e.to_string())?;
    write(
        &rust.join("cargo/vendor.toml"),
        "[source.crates-io]\nreplace-with = \"vendored-sources\"\n\n\
         [source.vendored-sources]\ndirectory = \"vendor\"\n",
    )?;
    run(
        &out,
        r_command(root, "R")
            .args(["CMD", "build", "--no-build-vignettes"])
            .arg(&pkg),
    )?;
    let tarball = crate::r::built_tarball(&out)?;
    let mb = std::fs::metadata(&tarball)
        .map_err(|e| e.to_string())?
        .len() as f64
        / 1e6;
    eprintln!("\n==> {} ({mb:.1} MB)", tarball.display());
    Ok(tarball)
}

/// Leaves out of each vendored crate what building its library never reads (tests, benches,
/// examples: most of the size, and paths too long for portable tar files), and lets cargo
/// check each crate by its package checksum alone (the per-file list would name the files
/// left out).
fn slim_vendored(vendor: &Path) -> Res {
    for e in std::fs::read_dir(vendor).map_err(|e| e.to_string())? {
        let krate = e.map_err(|e| e.to_string())?.path();
        for d in ["tests", "benches", "examples"] {
            let _ = std::fs::remove_dir_all(krate.join(d));
        }
        let sums = krate.join(".cargo-checksum.json");
        let text = read(&sums)?;
        // {"files":{...},"package":"<sha>"}: the package checksum is kept.
        let package = text
            .rfind("\"package\":")
            .map(|at| &text[at..])
            .ok_or_else(|| format!("{}: no package checksum", sums.display()))?;
        write(&sums, &format!("{{\"files\":{{}},{package}"))?;
    }
    Ok(())
}

/// A member crate's manifest as the tarball needs it: without dev-dependencies, benches and
/// test helper programs (whose sources it does not carry).
fn library_manifest(m: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in m.lines() {
        if line.starts_with('[') {
            let t = line.trim();
            skipping = t == "[dev-dependencies]" || t == "[[bench]]" || t == "[[bin]]";
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The tarball installed as a user would: copied into an empty directory, `R CMD INSTALL`ed
/// into a fresh library with cargo offline and an empty cargo home (nothing but what the
/// tarball carries), then loaded and made to run a task.
pub fn offline_install_test(root: &Path) -> Res {
    let tarball = source_tarball(root)?;
    let dir = std::env::temp_dir().join(format!("mizu-rsrc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).map_err(|e| e.to_string())?;
    let copy = dir.join(tarball.file_name().ok_or("no tarball name")?);
    std::fs::copy(&tarball, &copy).map_err(|e| e.to_string())?;
    let isolated = |c: &mut Command| {
        c.env_remove("MIZU_WORKSPACE")
            .env("CARGO_NET_OFFLINE", "true")
            .env("CARGO_HOME", dir.join("cargo-home"))
            .env("R_LIBS", &lib)
            // The toolchain stays reachable: rustup finds it through RUSTUP_HOME.
            .env(
                "RUSTUP_HOME",
                std::env::var_os("RUSTUP_HOME").unwrap_or_else(|| {
                    std::env::home_dir()
                        .unwrap_or_default()
                        .join(".rustup")
                        .into()
                }),
            );
    };
    let mut install = Command::new("R");
    install
        .args(["CMD", "INSTALL", "--no-multiarch"])
        .arg(format!("--library={}", lib.display()))
        .arg(&copy);
    isolated(&mut install);
    let r = run(&dir, &mut install).and_then(|()| {
        let mut check = Command::new("Rscript");
        check.args([
            "-e",
            "library(mizu); p <- mizu_pool(1); \
             stopifnot(identical(mizu_collect(mizu_submit(p, x * 2L, x = 21L)), 42L)); \
             mizu_pool_stop(p); cat('the source package installed offline runs tasks\\n')",
        ]);
        isolated(&mut check);
        run(&dir, &mut check)
    });
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn read(p: &Path) -> Result<String, String> {
    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
}

fn write(p: &Path, s: &str) -> Res {
    std::fs::write(p, s).map_err(|e| format!("{}: {e}", p.display()))
}

/// Copies the files under `from` that `keep` accepts into `to`.
fn copy_dir(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> Res {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for e in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        let p = e.path();
        let rel = p.strip_prefix(from).map_err(|e| e.to_string())?;
        if !keep(rel) {
            continue;
        }
        if e.file_type().map_err(|e| e.to_string())?.is_dir() {
            copy_dir(&p, &to.join(rel), &|q| keep(&rel.join(q)))?;
        } else {
            std::fs::copy(&p, to.join(rel)).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    Ok(())
}
