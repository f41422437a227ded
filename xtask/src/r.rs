//! The R package: installing R when it is missing, building and installing the package into
//! `target/rlib`, its testthat suite, `R CMD check`, and its benchmarks.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Res, run, which};

/// What R must have for a task.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// What the package itself needs to build and install: R with its headers and
    /// `codetools`, the one package it imports beyond R's own.
    Package,
    /// Besides, what the tests and benchmarks use: the test framework, the peers the
    /// benchmarks compare against (`parallel` ships with R; `data.table` reads and writes the
    /// CSV files of the cross-language benchmark's peer, and the tests attach it), and the
    /// `future` ecosystem the future backend is tested with.
    Tests,
}

impl Needs {
    /// The Debian packages that provide it.
    fn debian(self) -> Vec<&'static str> {
        let mut p = vec!["r-base-dev", "r-cran-codetools"];
        if self == Needs::Tests {
            p.extend([
                "r-cran-testthat",
                "r-cran-future",
                "r-cran-future.apply",
                "r-cran-furrr",
                "r-cran-purrr",
                "r-cran-progressr",
                "r-cran-data.table",
            ]);
        }
        p
    }

    /// The R packages that must load: those of [`Needs::debian`] (R itself aside).
    fn r_packages(self) -> Vec<&'static str> {
        self.debian()
            .iter()
            .filter_map(|d| d.strip_prefix("r-cran-"))
            .collect()
    }
}

/// Where `cargo xtask rpkg` installs the package (kept out of the system library).
pub fn rlib(root: &Path) -> PathBuf {
    root.join("target/rlib")
}

fn r_ready(needs: Needs) -> bool {
    let Some(rscript) = which("Rscript") else {
        return false;
    };
    let check = format!(
        "for (p in c({})) if (!requireNamespace(p, quietly = TRUE)) quit(status = 1)",
        needs
            .r_packages()
            .iter()
            .map(|p| format!("'{p}'"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Command::new(rscript)
        .args(["-e", &check])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether this process runs as root (then missing Debian packages are installed).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Makes sure R and the R packages `needs` names are installed: from Debian's packages when
/// missing and running as root, else a message saying what to install.
pub fn ensure_r(root: &Path, needs: Needs) -> Res {
    if r_ready(needs) {
        return Ok(());
    }
    let (debian, packages) = (needs.debian(), needs.r_packages());
    if !is_root() || which("apt-get").is_none() {
        return Err(format!(
            "R 4.2+ with the packages {packages:?} is needed here.\n\
             Debian/Ubuntu: sudo apt-get install {}\n\
             (as root, `cargo xtask` installs them itself)",
            debian.join(" ")
        ));
    }
    eprintln!("\n==> R or its packages are missing: installing {debian:?} (apt-get)");
    run(
        root,
        Command::new("apt-get")
            .args(["update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    run(
        root,
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(debian)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    if r_ready(needs) {
        Ok(())
    } else {
        Err("R was installed but the packages still do not load".into())
    }
}

/// An R command with the project's library first on the library path and the workspace
/// known to the package's Makevars.
pub fn r_command(root: &Path, program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("R_LIBS", rlib(root))
        .env("MIZU_WORKSPACE", root)
        .env("MIZU_PYTHON", root.join(".venv/bin/python"));
    cmd
}

/// Builds the native library (cargo, through the package's Makevars) and installs the `mizu`
/// R package into `target/rlib`.
pub fn rpkg(root: &Path) -> Res {
    ensure_r(root, Needs::Package)?;
    let lib = rlib(root);
    std::fs::create_dir_all(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    run(
        root,
        r_command(root, "R")
            .args(["CMD", "INSTALL", "--no-multiarch"])
            .arg(format!("--library={}", lib.display()))
            .arg("mizu-r/pkg"),
    )
}

/// The testthat suite against the installed package, with real worker processes.
pub fn r_tests(root: &Path) -> Res {
    ensure_r(root, Needs::Tests)?;
    rpkg(root)?;
    run(
        root,
        r_command(root, "Rscript").args([
            "-e",
            "testthat::test_dir('mizu-r/pkg/tests/testthat', package = 'mizu', \
             load_package = 'installed', reporter = 'summary', stop_on_failure = TRUE)",
        ]),
    )
}

/// The tarball `R CMD build` made in `dir`.
pub fn built_tarball(dir: &Path) -> Result<PathBuf, String> {
    std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "gz"))
        .ok_or_else(|| "R CMD build made no tarball".into())
}

/// The R binding's decoder under structure-aware fuzzing (`mizu-r/fuzz/codecs.R`), `cases`
/// cases, with the package installed. R printing an error of its own (its default handler
/// reporting an error mizu did not catch first) fails the run too.
pub fn fuzz_r(root: &Path, cases: u64) -> Res {
    let mut cmd = r_command(root, "Rscript");
    cmd.arg("mizu-r/fuzz/codecs.R")
        .arg(cases.to_string())
        .current_dir(root);
    eprintln!("\n==> Rscript mizu-r/fuzz/codecs.R {cases}");
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start Rscript: {e}"))?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprint!("{stdout}");
    if !out.status.success() || stderr.contains("Error") {
        return Err(format!(
            "the R fuzz harness failed ({}):\n{stderr}",
            out.status
        ));
    }
    Ok(())
}

/// The R benchmarks: mizu against parallel (PSOCK, mclapply) and future, compute-bound maps
/// against the machine's limit, then the future backend against future's multisession and
/// cluster backends (`quick`: fewer repetitions, for the demo).
pub fn r_bench(root: &Path, quick: bool) -> Res {
    ensure_r(root, Needs::Tests)?;
    rpkg(root)?;
    for script in [
        "mizu-r/benchmarks/bench.R",
        "mizu-r/benchmarks/maps.R",
        "mizu-r/benchmarks/future.R",
    ] {
        let mut cmd = r_command(root, "Rscript");
        cmd.arg(script);
        if quick {
            cmd.arg("--quick");
        } else if script.ends_with("bench.R") {
            cmd.env("MIZU_BENCH_JSON", crate::results_file(root, "r")?);
        }
        run(root, &mut cmd)?;
    }
    Ok(())
}
