//! Developer tasks for mizu: `cargo xtask test | loom | fuzz | asan | bench | demo | wheel | rpkg |
//! rtarball | futures | joblib | snippets`.
//!
//! Each task prints the commands it runs, so a failure can be reproduced by hand.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

mod r;
mod rsrc;
mod snippets;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let root = workspace_root();
    let res = match task {
        "test" => test(&root),
        "loom" => loom(&root),
        "bench" => bench(&root),
        "demo" => demo(&root),
        "wheel" => wheel(&root),
        "rpkg" => r::rpkg(&root),
        "rtarball" if args.iter().any(|a| a == "--test") => rsrc::offline_check(&root),
        "rtarball" => rsrc::source_tarball(&root).map(drop),
        "futures" => venv(&root).and_then(|py| stdlib_futures_tests(&root, &py)),
        "joblib" => venv(&root).and_then(|py| joblib_suite_tests(&root, &py)),
        "snippets" => venv(&root).and_then(|py| {
            install_wheel(&root, &py)?;
            r::rpkg(&root)?;
            snippets::snippets(&root, &py)
        }),
        "asan" => asan(&root),
        "fuzz" => fuzz_all(&root, args.iter().any(|a| a == "--long")),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n\
                 tasks:\n  \
                 test   fmt check, clippy (-D warnings), every test, then the loom models\n  \
                 loom   the loom models of every atomic protocol (--cfg mizu_loom)\n  \
                 bench  every benchmark, each side by side with its peers, as ratios\n  \
                 demo   the headline comparison: mizu against the peers users run today\n  \
                 wheel  build the pymizu wheel (manylinux2014) and sdist into target/wheels\n  \
                 rpkg   build and install the mizu R package into target/rlib\n  \
                 joblib joblib's own test_parallel.py with mizu among its process backends\n  \
                 snippets  every Python, R and Rust code block of README.md and docs/, run as\n           \
                 written (part of `test`)\n  \
                 rtarball  the R source package that installs offline, anywhere (Rust crates\n           \
                 vendored), into target/rsrc; --test: R CMD check --as-cran of it, installed offline\n           \
                 in an empty place, and a task run with it (part of `test`)\n  \
                 futures  CPython's concurrent.futures tests against pymizu.PoolExecutor\n           \
                 (part of `test`; uses the pymizu installed in .venv)\n  \
                 fuzz   every decoder's structure-aware fuzz harness (Rust, Python, R),\n           \
                 100 000 cases each (part of `test`); --long: ten million each\n  \
                 asan   the Rust tests of mizu-shm, mizu-queue, mizu-wire and mizu-pool (real\n           \
                 processes included) under AddressSanitizer (needs a nightly toolchain)"
            );
            return if task == "help" {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res = Result<(), String>;

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn run(root: &Path, cmd: &mut Command) -> Res {
    cmd.current_dir(root);
    let shown = format!("{cmd:?}").replace('"', "");
    eprintln!("\n==> {shown}");
    let t = Instant::now();
    let st = cmd
        .status()
        .map_err(|e| format!("cannot start {shown}: {e}"))?;
    eprintln!("<== {:.1}s", t.elapsed().as_secs_f64());
    if st.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {st}"))
    }
}

fn test(root: &Path) -> Res {
    let t = Instant::now();
    // Before anything builds the workspace: `mizu-r`'s bindings (extendr) need R at build
    // time, so on a fresh machine clippy would fail before the R tests could install it.
    r::ensure_r(root, r::Needs::Tests)?;
    run(
        root,
        Command::new(cargo()).args(["fmt", "--all", "--", "--check"]),
    )?;
    run(
        root,
        Command::new(cargo()).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run(root, Command::new(cargo()).args(["test", "--workspace"]))?;
    examples(root)?;
    package(root)?;
    let py = venv(root)?;
    // numpy today must produce the golden vectors the Rust tests compare mizu-rng with.
    run(
        root,
        Command::new(&py).args([
            "mizu-rng/tests/numpy_golden.py",
            "--check",
            "mizu-rng/tests/data/numpy_philox.txt",
        ]),
    )?;
    fuzz_rust(root, FUZZ_CASES)?;
    python_tests(root, &py)?;
    fuzz_python(root, &py, FUZZ_CASES)?;
    stdlib_futures_tests(root, &py)?;
    joblib_suite_tests(root, &py)?;
    fresh_installs(root, &py)?;
    r::r_tests(root)?;
    snippets::snippets(root, &py)?;
    small_dev_shm_tests(root, &py)?;
    r::fuzz_r(root, FUZZ_CASES)?;
    rsrc::offline_check(root)?;
    loom(root)?;
    leak_check()?;
    eprintln!(
        "\nxtask test: everything passed in {:.0}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The library crates packaged for crates.io as they would be published, each verified by
/// building it from its package (in dependency order, against the others' packages).
fn package(root: &Path) -> Res {
    let verify = root.join("target/package-verify");
    forget_packaged_copies(&verify);
    let mut cmd = Command::new(cargo());
    cmd.args(["package", "--allow-dirty"]);
    cmd.env("CARGO_TARGET_DIR", &verify);
    for krate in [
        "mizu-shm",
        "mizu-rng",
        "mizu-queue",
        "mizu-wire",
        "mizu-pool",
    ] {
        cmd.args(["-p", krate]);
    }
    run(root, &mut cmd)
}

/// `cargo package` builds each crate against the others' packages through a temporary local
/// registry, whose crates cargo takes as immutable: it extracts one once per name and version
/// under `$CARGO_HOME/registry/src/-<hash>/`, and reuses what it built of it, so a copy or a
/// build an earlier run left would be used instead of the crate just packaged. This
/// workspace's copies there, and what the verification (in `verify`) built of them, are
/// removed first.
fn forget_packaged_copies(verify: &Path) {
    for dir in ["debug/.fingerprint", "debug/deps"] {
        for e in std::fs::read_dir(verify.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("mizu-")
                || name.starts_with("libmizu_")
                || name.starts_with("mizu_")
            {
                let _ =
                    std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
            }
        }
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    let Some(Ok(registries)) = home.map(|h| std::fs::read_dir(h.join("registry/src"))) else {
        return;
    };
    for reg in registries.flatten() {
        if !reg.file_name().to_string_lossy().starts_with('-') {
            continue; // a real registry (crates.io), not a temporary local one
        }
        for krate in std::fs::read_dir(reg.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if krate.file_name().to_string_lossy().starts_with("mizu-") {
                let _ = std::fs::remove_dir_all(krate.path());
            }
        }
    }
}

/// Each library crate's example program, run (each checks what it shows and fails otherwise).
fn examples(root: &Path) -> Res {
    for (krate, example) in [
        ("mizu-shm", "counter"),
        ("mizu-queue", "ring_between_processes"),
        ("mizu-wire", "large_value"),
        ("mizu-rng", "parallel_draws"),
        ("mizu-pool", "upper"),
    ] {
        run(
            root,
            Command::new(cargo()).args(["run", "-q", "-p", krate, "--example", example]),
        )?;
    }
    Ok(())
}

/// Cases per fuzz harness in `cargo xtask test` and `cargo xtask fuzz`.
const FUZZ_CASES: u64 = 100_000;
/// Cases per harness in `cargo xtask fuzz --long` (before a release).
const FUZZ_CASES_LONG: u64 = 10_000_000;

/// `cargo xtask fuzz [--long]`: every decoder's harness — Rust's, then the Python binding's,
/// then the R binding's (each binding installed first).
fn fuzz_all(root: &Path, long: bool) -> Res {
    let cases = if long { FUZZ_CASES_LONG } else { FUZZ_CASES };
    fuzz_rust(root, cases)?;
    let py = venv(root)?;
    install_wheel(root, &py)?;
    fuzz_python(root, &py, cases)?;
    r::rpkg(root)?;
    r::fuzz_r(root, cases)
}

/// The Rust harnesses (proptest, structure-aware; `cases` each): the segment header
/// (`mizu-shm/tests/fuzz.rs`), the wire format's decoders (`mizu-wire/tests/fuzz.rs` and the
/// value decoder's in `values.rs`), and what the pool reads of other processes (`mizu-pool/
/// tests/fuzz.rs`).
fn fuzz_rust(root: &Path, cases: u64) -> Res {
    for (krate, tests) in [
        ("mizu-shm", &["fuzz"][..]),
        ("mizu-wire", &["fuzz", "values"][..]),
        ("mizu-pool", &["fuzz"][..]),
    ] {
        let mut cmd = Command::new(cargo());
        cmd.args(["test", "--profile", "checks", "-p", krate]);
        for t in tests {
            cmd.args(["--test", t]);
        }
        cmd.args(["--", "never_panic", "--nocapture"])
            .env("PROPTEST_CASES", cases.to_string());
        run(root, &mut cmd)?;
    }
    Ok(())
}

/// The Python binding's decoders (`mizu-py/tests/fuzz_codecs.py`), `cases` each; needs pymizu
/// installed in the venv.
fn fuzz_python(root: &Path, py: &Path, cases: u64) -> Res {
    run(
        root,
        Command::new(py)
            .arg("mizu-py/tests/fuzz_codecs.py")
            .arg(cases.to_string()),
    )
}

fn python_tests(root: &Path, py: &Path) -> Res {
    install_wheel(root, py)?;
    // Cross-language tests start R workers: the mizu R package must be installed (in
    // target/rlib, which R_LIBS points R at).
    r::rpkg(root)?;
    run(
        root,
        Command::new(py)
            .args(["-m", "pytest", "-q", "mizu-py/tests"])
            .env("R_LIBS", r::rlib(root)),
    )
}

/// CPython's own `concurrent.futures` process-pool tests, run against `pymizu.PoolExecutor`
/// (mizu-py/tests/stdlib_futures.py). The test file is Debian's (`libpython3.11-testsuite`):
/// the installed one, else the package fetched with `apt-get download` and unpacked into
/// `target/`. When neither works the step fails; it never skips.
fn stdlib_futures_tests(root: &Path, py: &Path) -> Res {
    const FILE: &str = "usr/lib/python3.11/test/test_concurrent_futures.py";
    let installed = Path::new("/").join(FILE);
    let unpacked = root.join("target/cpython-tests");
    let file = if installed.is_file() {
        installed
    } else {
        if !unpacked.join(FILE).is_file() {
            fetch_debian_package(root, "libpython3.11-testsuite", &unpacked)?;
        }
        unpacked.join(FILE)
    };
    if !file.is_file() {
        return Err(format!(
            "{} is missing: CPython's concurrent.futures tests come from Debian's \
             libpython3.11-testsuite package",
            file.display()
        ));
    }
    run(
        root,
        Command::new(py)
            .arg("mizu-py/tests/stdlib_futures.py")
            .arg(&file)
            .env("PYTHONPATH", root.join("mizu-py/tests")),
    )
}

/// joblib's own `test_parallel.py`, with pymizu's backend among its process backends
/// (mizu-py/tests/joblib_suite.py). The file comes from the source distribution of the joblib
/// pinned in requirements-dev.txt, fetched by pip into `target/` once; when that fails the step
/// fails, it never skips.
fn joblib_suite_tests(root: &Path, py: &Path) -> Res {
    let reqs = root.join("requirements-dev.txt");
    let pinned = std::fs::read_to_string(&reqs)
        .map_err(|e| format!("{}: {e}", reqs.display()))?
        .lines()
        .find_map(|l| l.trim().strip_prefix("joblib==").map(str::to_owned))
        .ok_or("requirements-dev.txt pins no joblib")?;
    let dir = root.join("target/joblib-sdist");
    let unpacked = dir.join(format!("joblib-{pinned}"));
    if !unpacked.join("joblib/test/test_parallel.py").is_file() {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        run(
            root,
            Command::new(py)
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(["--no-deps", "--no-binary", ":all:", "--dest"])
                .arg(&dir)
                .arg(format!("joblib=={pinned}")),
        )?;
        let sdist = dir.join(format!("joblib-{pinned}.tar.gz"));
        run(
            root,
            Command::new("tar")
                .arg("-xzf")
                .arg(&sdist)
                .arg("-C")
                .arg(&dir),
        )?;
    }
    run(
        root,
        Command::new(py)
            .arg("mizu-py/tests/joblib_suite.py")
            .arg(&unpacked)
            .args(["-W", "ignore::pytest.PytestUnknownMarkWarning", "-rxX"]),
    )
}

/// `apt-get download <package>` and `dpkg-deb -x` it into `into` (no installation, no root
/// needed while the package lists are there; as root they are refreshed when the first try
/// fails).
fn fetch_debian_package(root: &Path, package: &str, into: &Path) -> Res {
    let debs = root.join("target/debs");
    std::fs::create_dir_all(&debs).map_err(|e| format!("{}: {e}", debs.display()))?;
    let download = || {
        run(
            &debs,
            Command::new("apt-get").args(["download", "-q", package]),
        )
    };
    if download().is_err() {
        if !r::is_root() {
            return Err(format!(
                "cannot fetch Debian's {package} (apt-get download failed); install it: \
                 sudo apt-get install {package}"
            ));
        }
        run(root, Command::new("apt-get").args(["update", "-q"]))?;
        download()?;
    }
    let deb = std::fs::read_dir(&debs)
        .map_err(|e| format!("{}: {e}", debs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(package) && n.ends_with(".deb"))
        })
        .ok_or_else(|| format!("apt-get download left no {package} .deb"))?;
    run(root, Command::new("dpkg-deb").arg("-x").arg(&deb).arg(into))
}

/// The wheel (built by `python_tests`) and the source distribution installed as users install
/// them: each into a fresh venv by pip (which fetches the dependencies, and builds the sdist
/// through maturin), then a task run with it, away from the checkout.
fn fresh_installs(root: &Path, py: &Path) -> Res {
    maturin(root, py, &["sdist", "--out", "target/wheels"])?;
    let wheels = root.join("target/wheels");
    let find = |suffix: &str| {
        std::fs::read_dir(&wheels)
            .map_err(|e| format!("{}: {e}", wheels.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with(suffix))
            .ok_or_else(|| format!("no {suffix} in {}", wheels.display()))
    };
    let dir = std::env::temp_dir().join(format!("pymizu-installs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let r = [("wheel", find(".whl")?), ("sdist", find(".tar.gz")?)]
        .into_iter()
        .try_for_each(|(kind, package)| {
            let venv = dir.join(kind);
            run(&dir, Command::new(py).args(["-m", "venv"]).arg(&venv))?;
            let vpy = venv.join("bin/python");
            let mut pip = pip_command(&vpy, &[], &package);
            if kind == "sdist" {
                install_check_profile(&mut pip);
            }
            run(&dir, &mut pip)?;
            run(
                &dir,
                Command::new(&vpy).args([
                    "-c",
                    &format!(
                        "import operator, pymizu\n\
                         with pymizu.Pool(1) as p:\n    \
                         assert p.submit(operator.add, 2, 3).result(timeout=60) == 5\n\
                         print('pymizu installed from its {kind} runs tasks')"
                    ),
                ]),
            )
        });
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// For a build that checks a package installs from its sources (the sdist, the R source
/// tarball): the release profile without link-time optimisation and in many compilation
/// units. The same code is built with the full profile for the wheel and the R package the
/// tests run. In a fresh-clone run on two CPUs the sdist install took 190 s and
/// `R CMD check` 244 s with the full profile, 128 s and 151 s with this one.
pub(crate) fn install_check_profile(c: &mut Command) -> &mut Command {
    c.env("CARGO_PROFILE_RELEASE_LTO", "off")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
}

/// Builds the pymizu wheel and installs it into the venv (what users get, stubs included).
fn install_wheel(root: &Path, py: &Path) -> Res {
    let out = root.join("target/wheels");
    let _ = std::fs::remove_dir_all(&out);
    build_wheel(root, py)?;
    let wheel = std::fs::read_dir(&out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or("maturin built no wheel")?;
    pip_install(root, py, &["--no-deps", "--force-reinstall"], &wheel)
}

/// `python -m pip install --quiet <flags> <target>`.
fn pip_install(root: &Path, py: &Path, flags: &[&str], target: &Path) -> Res {
    run(root, &mut pip_command(py, flags, target))
}

/// `py -m pip install` of `target`, quietly.
fn pip_command(py: &Path, flags: &[&str], target: &Path) -> Command {
    let mut c = Command::new(py);
    c.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .args(flags)
    .arg(target);
    c
}

fn maturin(root: &Path, py: &Path, args: &[&str]) -> Res {
    let venv = py
        .parent()
        .and_then(Path::parent)
        .ok_or("venv python has no parent")?;
    let bin = venv.join("bin");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(bin.join("maturin"));
    cmd.args(args)
        .args(["--manifest-path", "mizu-py/Cargo.toml"])
        .env("VIRTUAL_ENV", venv)
        .env("PATH", path);
    run(root, &mut cmd)
}

/// The wheel users install: `manylinux2014` (glibc 2.17 and later), linked by zig (the
/// `ziglang` package pinned in requirements-dev.txt) against that glibc's symbols whatever
/// this machine's glibc is; maturin refuses to tag a library that uses newer symbols. The test
/// suite runs against exactly this wheel.
fn build_wheel(root: &Path, py: &Path) -> Res {
    maturin(
        root,
        py,
        &[
            "build",
            "--release",
            "--zig",
            "--compatibility",
            "manylinux2014",
            "--out",
            "target/wheels",
        ],
    )
}

/// `cargo xtask wheel`: the manylinux2014 wheel and the source distribution.
fn wheel(root: &Path) -> Res {
    let py = venv(root)?;
    let _ = std::fs::remove_dir_all(root.join("target/wheels"));
    build_wheel(root, &py)?;
    maturin(root, &py, &["sdist", "--out", "target/wheels"])
}

/// The loom build gets its own target directory so it does not invalidate the normal one.
/// `LOOM_MAX_PREEMPTIONS` (if set) overrides each model's own preemption bound.
fn loom(root: &Path) -> Res {
    let mut cmd = Command::new(cargo());
    cmd.args([
        "test",
        "--profile",
        "checks",
        "-p",
        "mizu-shm",
        "-p",
        "mizu-queue",
        "-p",
        "mizu-wire",
        "-p",
        "mizu-pool",
        "--test",
        "loom",
        "--",
        "--nocapture",
    ])
    .env("RUSTFLAGS", "--cfg mizu_loom")
    .env("CARGO_TARGET_DIR", root.join("target-loom"));
    run(root, &mut cmd)
}

/// The Rust tests of the crates that own shared memory, real-process tests included (their
/// helper binaries are built with the sanitizer too), under AddressSanitizer. ASan needs a
/// nightly compiler and an explicit `--target`, so that build scripts and proc macros are
/// built without it.
fn asan(root: &Path) -> Res {
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output();
    match nightly {
        Ok(o) if o.status.success() => {
            eprintln!("asan: {}", String::from_utf8_lossy(&o.stdout).trim());
        }
        _ => {
            return Err(
                "AddressSanitizer needs a nightly toolchain, and none is installed: \
                 run `rustup toolchain install nightly` (the sanitizer itself ships with it)"
                    .into(),
            );
        }
    }
    let target = "x86_64-unknown-linux-gnu";
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "test", "--target", target]);
    for p in ["mizu-shm", "mizu-queue", "mizu-wire", "mizu-pool"] {
        cmd.args(["-p", p]);
    }
    cmd.env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("CARGO")
        .env("RUSTFLAGS", "-Zsanitizer=address")
        .env("RUSTDOCFLAGS", "-Zsanitizer=address")
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        .env("CARGO_TARGET_DIR", root.join("target-asan"));
    run(root, &mut cmd)?;
    leak_check()
}

/// What a container's 64 MiB `/dev/shm` must carry (values spilling to files, both languages,
/// across languages, `kill -9` of an owner, a full spill directory): `mizu-py/tests/small_shm`
/// and `mizu-r/small_shm`, each run in a private mount namespace (`unshare -m`) with a 64 MiB
/// tmpfs over `/dev/shm`. Mounting needs root, as CI runs; another user is told so.
fn small_dev_shm_tests(root: &Path, py: &Path) -> Res {
    if !r::is_root() || which("unshare").is_none() {
        eprintln!(
            "\n==> the 64 MiB /dev/shm tests need root and `unshare` (a private mount \
             namespace); not run here (CI runs them)"
        );
        return Ok(());
    }
    run(
        root,
        &mut in_small_dev_shm(root, py, "mizu-py/tests/small_shm/check.py"),
    )?;
    run(
        root,
        &mut in_small_dev_shm(root, Path::new("Rscript"), "mizu-r/small_shm/check.R"),
    )
}

/// `program script` in a private mount namespace with a 64 MiB tmpfs over `/dev/shm` (a
/// container's default), R_LIBS naming the R package's library (needs root).
fn in_small_dev_shm(root: &Path, program: &Path, script: &str) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=64m tmpfs /dev/shm && exec \"$0\" \"$@\"")
        .arg(program)
        .arg(script)
        .env("R_LIBS", r::rlib(root));
    cmd
}

/// After every test process has exited, nothing of ours may remain in /dev/shm.
fn leak_check() -> Res {
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map_err(|e| format!("cannot list /dev/shm: {e}"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("mizu_"))
        .collect();
    if left.is_empty() {
        eprintln!("\n==> /dev/shm holds no mizu_* entries after the tests");
        Ok(())
    } else {
        Err(format!(
            "the tests left {} entries in /dev/shm: {left:?}",
            left.len()
        ))
    }
}

fn bench(root: &Path) -> Res {
    let py = venv(root)?;
    run(
        root,
        Command::new(cargo()).args(["bench", "-p", "mizu-queue", "--bench", "ring"]),
    )?;
    run(
        root,
        Command::new(cargo())
            .args(["bench", "-p", "mizu-rng", "--bench", "fill"])
            .env("MIZU_PYTHON", &py),
    )?;
    run(
        root,
        Command::new(cargo()).args(["bench", "-p", "mizu-wire", "--bench", "decode"]),
    )?;
    pool_bench(root)?;
    python_bench(root, false)?;
    r::r_bench(root, false)?;
    interop_bench(root, false)?;
    // The two main tables' results, drawn (docs/benchmarks.md shows them).
    run(
        root,
        Command::new(&py)
            .arg("mizu-py/benchmarks/charts.py")
            .arg(results_file(root, "python")?)
            .arg(results_file(root, "r")?),
    )
}

/// Where a full benchmark run writes `language`'s main table as JSON (beside the chart drawn
/// from it): `docs/bench/<language>.json`.
fn results_file(root: &Path, language: &str) -> Result<PathBuf, String> {
    let dir = root.join("docs/bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir.join(format!("{language}.json")))
}

/// Python and R serving each other (`mizu-py/benchmarks/interop.py`): trivial calls both ways
/// beside each language's own, and a data frame relayed Python -> R -> Python beside CSV and
/// Arrow IPC files (`quick`: fewer repetitions and a smaller frame, for the demo).
fn interop_bench(root: &Path, quick: bool) -> Res {
    let py = venv(root)?;
    r::rpkg(root)?;
    let mut cmd = Command::new(&py);
    cmd.arg("mizu-py/benchmarks/interop.py")
        .env("R_LIBS", r::rlib(root))
        .env("MIZU_PYTHON", &py);
    if quick {
        cmd.arg("--quick");
    }
    run(root, &mut cmd)
}

fn pool_bench(root: &Path) -> Res {
    run(
        root,
        Command::new(cargo()).args(["bench", "-p", "mizu-pool", "--bench", "pool"]),
    )
}

/// The project's Python environment: `.venv` with `requirements-dev.txt` installed. Rebuilt
/// when the requirements file changes (a stamp inside the venv records what was installed).
fn venv(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join(".venv");
    let py = dir.join("bin/python");
    let reqs = root.join("requirements-dev.txt");
    let wanted = std::fs::read_to_string(&reqs).map_err(|e| format!("{}: {e}", reqs.display()))?;
    let stamp = dir.join("mizu-requirements.txt");
    if py.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(py);
    }
    let python3 = which("python3").ok_or(
        "python3 is not installed: install Python 3.11+ with venv support \
         (Debian: apt-get install python3 python3-venv), then run this again",
    )?;
    if !py.exists() {
        run(root, Command::new(&python3).args(["-m", "venv"]).arg(&dir)).map_err(|e| {
            format!(
                "{e}\n(creating a venv needs the venv module: Debian: apt-get install python3-venv)"
            )
        })?;
    }
    pip_install(root, &py, &["-r"], &reqs)?;
    std::fs::write(&stamp, wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(py)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// pymizu against the Python peers, the R package against the R peers, then the process pool
/// against the architecture of `ProcessPoolExecutor`/mirai (request/response over socketpairs)
/// and a thread pool, then the ring underneath it.
fn demo(root: &Path) -> Res {
    eprintln!(
        "mizu demo: pymizu (Pool and PoolExecutor) against ProcessPoolExecutor,\n\
         multiprocessing.Pool, loky and ThreadPoolExecutor on the same work; the mizu R package\n\
         against parallel (PSOCK cluster, mclapply/mcparallel) and future (multisession); Python\n\
         and R serving each other (beside CSV and Arrow IPC files for data frames); then\n\
         the Rust pool against a socketpair request/response pool (how ProcessPoolExecutor and\n\
         mirai work) and a thread pool; then the shared-memory ring underneath — all side by\n\
         side in one run."
    );
    python_bench(root, true)?;
    r::r_bench(root, true)?;
    interop_bench(root, true)?;
    pool_bench(root)?;
    run(
        root,
        Command::new(cargo()).args(["bench", "-p", "mizu-queue", "--bench", "ring"]),
    )
}

/// pymizu against ProcessPoolExecutor, multiprocessing.Pool, loky and ThreadPoolExecutor
/// (`--quick`: fewer repetitions, for the demo).
fn python_bench(root: &Path, quick: bool) -> Res {
    let py = venv(root)?;
    install_wheel(root, &py)?;
    let mut cmd = Command::new(&py);
    cmd.arg("mizu-py/benchmarks/bench.py");
    if quick {
        cmd.arg("--quick");
    } else {
        cmd.env("MIZU_BENCH_JSON", results_file(root, "python")?);
    }
    run(root, &mut cmd)?;
    // Compute-bound maps against the machine's limit, every way of waiting for a completion
    // (as_completed, callbacks, asyncio, ...), starting a pool, then one big input read by many tasks (shared,
    // passed each time, joblib's memory maps), then joblib, Dask and Dask distributed on
    // pymizu beside their own process backends.
    for bench in [
        "mizu-py/benchmarks/maps.py",
        "mizu-py/benchmarks/waits.py",
        "mizu-py/benchmarks/startup.py",
        "mizu-py/benchmarks/share.py",
        "mizu-py/benchmarks/ecosystem.py",
    ] {
        let mut cmd = Command::new(&py);
        cmd.arg(bench);
        if quick {
            cmd.arg("--quick");
        }
        run(root, &mut cmd)?;
    }
    // Large values: with this machine's /dev/shm, then (as root) with a container's 64 MiB,
    // where they spill to files: what spilling costs, beside the peers.
    if !quick {
        run(root, Command::new(&py).arg("mizu-py/benchmarks/spill.py"))?;
        if r::is_root() && which("unshare").is_some() {
            run(
                root,
                &mut in_small_dev_shm(root, &py, "mizu-py/benchmarks/spill.py"),
            )?;
        }
    }
    Ok(())
}
