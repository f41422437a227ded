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
    ensure_r(root, crate::r::Needs::Package)?;
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
    // are path dependencies inside it, so members too) and no default members (they name
    // crates the package does not carry), and the root's lock file.
    let manifest = read(&root.join("Cargo.toml"))?;
    if !manifest.lines().any(|l| l.starts_with("members")) {
        return Err("the root Cargo.toml has no members line".into());
    }
    let tarball_manifest: String = manifest
        .lines()
        .filter(|l| !l.starts_with("default-members"))
        .map(|l| {
            if l.starts_with("members") {
                "members = [\"mizu-r\"]\n".to_owned()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    write(&rust.join("Cargo.toml"), &tarball_manifest)?;
    std::fs::copy(root.join("Cargo.lock"), rust.join("Cargo.lock")).map_err(|e| e.to_string())?;
    for c in CRATES {
        copy_dir(&root.join(c).join("src"), &rust.join(c).join("src"), &|p| {
            // Test helper programs: not part of the library.
            !p.components().any(|c| c.as_os_str() == "bin")
        })?;
        let m = read(&root.join(c).join("Cargo.toml"))?;
        write(&rust.join(c).join("Cargo.toml"), &library_manifest(&m))?;
    }
    cargo_output(&rust, &["vendor", "vendor"])?;
    slim_vendored(&rust.join("vendor"))?;
    // Paths in a cargo configuration file are relative to the parent of its directory.
    std::fs::create_dir_all(rust.join("cargo")).map_err(|e| e.to_string())?;
    write(
        &rust.join("cargo/vendor.toml"),
        "[source.crates-io]\nreplace-with = \"vendored-sources\"\n\n\
         [source.vendored-sources]\ndirectory = \"vendor\"\n",
    )?;
    stub_unbuilt(&rust)?;
    pack_vendored(&rust)?;
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

/// The platforms the package builds on (mizu's runtime is Linux-only: futexes, pidfds).
const TARGETS: &[&str] = &[
    "x86_64-unknown-linux-gnu",
    "aarch64-unknown-linux-gnu",
    "x86_64-unknown-linux-musl",
    "aarch64-unknown-linux-musl",
];

/// Empties the vendored crates that no build on [`TARGETS`] compiles: other platforms' system
/// bindings (`windows-sys` alone is most of the vendored bytes) and what only the loom models
/// use (`--cfg mizu_loom`). Cargo still reads their manifests (it resolves the whole lock
/// file), so each keeps its manifest and checksum, with empty sources.
fn stub_unbuilt(rust: &Path) -> Res {
    let mut built = std::collections::BTreeSet::new();
    for t in TARGETS {
        let tree = cargo_output(
            rust,
            &[
                "tree",
                "--offline",
                "--config",
                "cargo/vendor.toml",
                "-e",
                "normal,build",
                "--prefix",
                "none",
                "-f",
                "{p}",
                "--target",
                t,
            ],
        )?;
        // "name v1.2.3", "name v1.2.3 (*)", "name v1.2.3 (proc-macro)", "name v0.1.0 (/path)".
        for line in tree.lines() {
            let mut w = line.split_whitespace();
            if let (Some(name), Some(v)) = (w.next(), w.next()) {
                built.insert((name.to_string(), v.trim_start_matches('v').to_string()));
            }
        }
    }
    let mut stubbed = Vec::new();
    for e in std::fs::read_dir(rust.join("vendor")).map_err(|e| e.to_string())? {
        let krate = e.map_err(|e| e.to_string())?.path();
        let manifest = read(&krate.join("Cargo.toml"))?;
        let id = package_id(&manifest)
            .ok_or_else(|| format!("{}: no package name or version", krate.display()))?;
        if built.contains(&id) {
            continue;
        }
        for f in std::fs::read_dir(&krate).map_err(|e| e.to_string())? {
            let f = f.map_err(|e| e.to_string())?;
            let name = f.file_name();
            if name == "Cargo.toml" || name == ".cargo-checksum.json" {
                continue;
            }
            let p = f.path();
            let gone = if f.file_type().map_err(|e| e.to_string())?.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            gone.map_err(|e| format!("{}: {e}", p.display()))?;
        }
        // What cargo looks for when it reads the manifest: the library and a build script.
        std::fs::create_dir_all(krate.join("src")).map_err(|e| e.to_string())?;
        let mut files = vec!["src/lib.rs".to_string()];
        files.extend(manifest_paths(&manifest));
        for f in files {
            let p = krate.join(&f);
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            }
            let body = if f.ends_with("build.rs") {
                "fn main() {}\n"
            } else {
                ""
            };
            write(&p, body)?;
        }
        stubbed.push(id.0);
    }
    stubbed.sort();
    eprintln!(
        "==> {} vendored crates not built on Linux left as empty stubs: {}",
        stubbed.len(),
        stubbed.join(", ")
    );
    Ok(())
}

/// `(name, version)` of a crate's manifest (`[package]` comes first in a published one).
fn package_id(manifest: &str) -> Option<(String, String)> {
    let field = |key: &str| {
        let mut in_package = false;
        for line in manifest.lines() {
            let t = line.trim();
            if t.starts_with('[') {
                in_package = t == "[package]";
            } else if in_package
                && let Some(rest) = t.strip_prefix(key)
                && let Some(v) = rest.trim_start().strip_prefix('=')
            {
                return Some(v.trim().trim_matches('"').to_string());
            }
        }
        None
    };
    Some((field("name")?, field("version")?))
}

/// The source files a manifest names (`path = "…"` of its targets, `build = "…"`).
fn manifest_paths(manifest: &str) -> Vec<String> {
    let mut in_dependency = false;
    let mut out = Vec::new();
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_dependency = t.contains("dependencies");
            continue;
        }
        for key in ["path", "build"] {
            if let Some(rest) = t.strip_prefix(key)
                && let Some(v) = rest.trim_start().strip_prefix('=')
                && let v = v.trim()
                && v.starts_with('"')
                && !(key == "path" && in_dependency)
            {
                out.push(v.trim_matches('"').to_string());
            }
        }
    }
    out
}

/// Packs the vendored crates into `vendor.tar.xz`, which `src/Makevars` unpacks before building:
/// a third of the size, and no long paths or hidden files in the R package itself.
fn pack_vendored(rust: &Path) -> Res {
    let mut tar = Command::new("tar");
    tar.args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
        .args(["-cJf", "vendor.tar.xz", "vendor"])
        .env("XZ_OPT", "-9");
    run(rust, &mut tar)?;
    std::fs::remove_dir_all(rust.join("vendor")).map_err(|e| e.to_string())
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

/// The notes `R CMD check --as-cran` gives this package, each for a reason that stays (see
/// `docs/r.md`); any other note, and every warning and error, fails [`offline_check`].
const EXPECTED_NOTES: &[&str] = &[
    // A first submission (given only where the check reaches CRAN).
    "checking CRAN incoming feasibility",
    // The Rust runtime linked in (~10 MB of code, ~6 MB of debug information).
    "checking installed package size",
    // The check asks a time server; this machine has no network.
    "checking for future file timestamps",
    // Makevars uses GNU make's conditionals; GNU make is in SystemRequirements.
    "checking for GNU extensions in Makefiles",
];

/// The tarball installed and checked as a user and CRAN would: copied into an empty
/// directory, `R CMD check --as-cran` (which installs it into a fresh library) with cargo
/// offline and an empty cargo home, so nothing but what the tarball carries builds it; then
/// that installed copy is loaded and runs a task. The tests are not run here (`r_tests` runs
/// them against the workspace's build) nor the manual made (it needs LaTeX).
pub fn offline_check(root: &Path) -> Res {
    let tarball = source_tarball(root)?;
    let dir = std::env::temp_dir().join(format!("mizu-rsrc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let copy = dir.join(tarball.file_name().ok_or("no tarball name")?);
    std::fs::copy(&tarball, &copy).map_err(|e| e.to_string())?;
    let isolated = |c: &mut Command| {
        c.env_remove("MIZU_WORKSPACE")
            .env("CARGO_NET_OFFLINE", "true")
            .env("CARGO_HOME", dir.join("cargo-home"))
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
    let mut check = r_command(root, "R");
    check
        .args(["CMD", "check", "--as-cran", "--no-manual", "--no-tests"])
        .arg(&copy)
        // No network: CRAN's index and the time server are not asked.
        .env("_R_CHECK_CRAN_INCOMING_REMOTE_", "false")
        .env("_R_CHECK_FORCE_SUGGESTS_", "false");
    isolated(&mut check);
    crate::install_check_profile(&mut check);
    let r = run(&dir, &mut check)
        .and_then(|()| check_log(&dir.join("mizu.Rcheck/00check.log")))
        .and_then(|()| {
            let mut task = Command::new("Rscript");
            task.args([
                "-e",
                "library(mizu); p <- mizu_pool(1); \
                 stopifnot(identical(mizu_collect(mizu_submit(p, x * 2L, x = 21L)), 42L)); \
                 mizu_pool_stop(p); cat('the source package installed offline runs tasks\\n')",
            ])
            .env("R_LIBS", dir.join("mizu.Rcheck"));
            isolated(&mut task);
            run(&dir, &mut task)
        });
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Fails on any warning or error in an `R CMD check` log, and on a note not in
/// [`EXPECTED_NOTES`].
fn check_log(log: &Path) -> Res {
    let text = read(log)?;
    let mut bad = Vec::new();
    let mut notes = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("* checking")) {
        let what = line
            .split(" ...")
            .next()
            .unwrap_or(line)
            .trim_start_matches("* ");
        if line.ends_with("WARNING") || line.ends_with("ERROR") {
            bad.push(line);
        } else if line.ends_with("NOTE") {
            if EXPECTED_NOTES.contains(&what) {
                notes.push(what);
            } else {
                bad.push(line);
            }
        }
    }
    if bad.is_empty() {
        eprintln!(
            "\n==> R CMD check --as-cran: no errors, no warnings; the expected notes: {}",
            notes.join("; ")
        );
        Ok(())
    } else {
        Err(format!(
            "R CMD check --as-cran reported: {bad:?} (see {})",
            log.display()
        ))
    }
}

/// What `cargo <args>` run in `dir` prints; its error output when it fails.
fn cargo_output(dir: &Path, args: &[&str]) -> Result<String, String> {
    let shown = format!("cargo {}", args.join(" "));
    let out = Command::new(cargo())
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("{shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
