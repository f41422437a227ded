//! `cargo xtask snippets` (part of `test`): every Python, R and Rust code block of README.md
//! and docs/*.md, run as a user who pasted it would run it — Python blocks as scripts of the
//! `.venv` interpreter, R blocks with `Rscript`, Rust blocks as the `main` of a program built
//! against the workspace's crates — each from an empty directory.
//!
//! A block is run on its own unless the line before its fence (blank lines skipped) is a
//! marker:
//!
//! * `<!-- snippet: continues -->` — it runs as the continuation of the block of the same
//!   language before it in the file (the two are one script);
//! * `<!-- snippet: not run: <why> -->` — it is not run (a fragment, or something that needs
//!   what a test machine has not, such as a cluster); the reason is required.
//!
//! Blocks of other languages (`sh`, `toml`, `text`) are commands or listings, never run.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Res, cargo, r, run};

/// A code block of one language, as it is run.
struct Block {
    /// Where it starts: `file:line`.
    at: String,
    lang: String,
    code: String,
}

/// The marker comment that precedes a fence, if any.
enum Marker {
    None,
    Continues,
    NotRun,
}

fn marker(prev: Option<&str>) -> Result<Marker, String> {
    let Some(line) = prev.map(str::trim) else {
        return Ok(Marker::None);
    };
    let Some(body) = line
        .strip_prefix("<!-- snippet:")
        .and_then(|b| b.strip_suffix("-->"))
    else {
        return Ok(Marker::None);
    };
    match body.trim() {
        "continues" => Ok(Marker::Continues),
        b if b.starts_with("not run:") && b.len() > "not run:".len() + 3 => Ok(Marker::NotRun),
        other => Err(format!(
            "unknown snippet marker `{other}` (`continues`, or `not run: <why>`)"
        )),
    }
}

/// The runnable blocks of one Markdown file, continuations joined to the block they continue.
fn blocks(path: &Path, name: &str) -> Result<Vec<Block>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{name}: {e}"))?;
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<Block> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let Some(info) = line.trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let lang = info.split_whitespace().next().unwrap_or("").to_lowercase();
        let prev = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .copied();
        let mark = marker(prev).map_err(|e| format!("{name}:{}: {e}", i + 1))?;
        let start = i + 1;
        let mut code = String::new();
        i += 1;
        while i < lines.len() && lines[i].trim_start() != "```" {
            let l = lines[i];
            code.push_str(
                l.get(indent.min(l.len() - l.trim_start().len())..)
                    .unwrap_or(""),
            );
            code.push('\n');
            i += 1;
        }
        if i == lines.len() {
            return Err(format!("{name}:{start}: a code block that never ends"));
        }
        i += 1;
        let runnable = matches!(lang.as_str(), "python" | "r" | "rust");
        match mark {
            Marker::NotRun => {}
            _ if !runnable => {}
            Marker::Continues => {
                let Some(b) = out.iter_mut().rev().find(|b| b.lang == lang) else {
                    return Err(format!(
                        "{name}:{start}: continues no block of {lang} before it"
                    ));
                };
                b.code.push_str(&code);
            }
            Marker::None => out.push(Block {
                at: format!("{name}:{start}"),
                lang,
                code,
            }),
        }
    }
    Ok(out)
}

/// The Markdown files whose blocks are run.
fn documents(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map_err(|e| format!("docs/: {e}"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    Ok(docs)
}

/// The scratch package Rust blocks are built in: the workspace's library crates as
/// dependencies (by path, as README.md shows), its lock file, its target directory.
fn rust_package(root: &Path, dir: &Path) -> Res {
    let deps: String = [
        "mizu-shm",
        "mizu-queue",
        "mizu-wire",
        "mizu-rng",
        "mizu-pool",
    ]
    .iter()
    .map(|c| format!("{c} = {{ path = \"{}\" }}\n", root.join(c).display()))
    .collect();
    let manifest = format!(
        "[package]\nname = \"snippets\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\n{deps}\n[workspace]\n"
    );
    std::fs::create_dir_all(dir.join("src/bin")).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("Cargo.toml"), manifest).map_err(|e| e.to_string())?;
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).map_err(|e| e.to_string())?;
    Ok(())
}

/// `cargo xtask snippets`: see the module docs. `py` is the `.venv` interpreter with pymizu
/// installed; the R package must be installed in `target/rlib`.
pub fn snippets(root: &Path, py: &Path) -> Res {
    let dir = root.join("target/snippets");
    let _ = std::fs::remove_dir_all(&dir);
    let mut all = Vec::new();
    for doc in documents(root)? {
        let name = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        all.extend(blocks(&doc, &name)?);
    }
    let rust = dir.join("rust");
    if all.iter().any(|b| b.lang == "rust") {
        rust_package(root, &rust)?;
    }
    let mut failed = Vec::new();
    for (k, b) in all.iter().enumerate() {
        let work = dir.join(format!("run{k}"));
        std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
        eprintln!("\n--- {} ({})", b.at, b.lang);
        // A hang guard only: the slowest block takes seconds.
        let mut cmd = Command::new("timeout");
        cmd.arg("600");
        match b.lang.as_str() {
            "python" => {
                let f = work.join("snippet.py");
                std::fs::write(&f, &b.code).map_err(|e| e.to_string())?;
                cmd.arg(py).arg(&f);
            }
            "r" => {
                let f = work.join("snippet.R");
                std::fs::write(&f, &b.code).map_err(|e| e.to_string())?;
                cmd.arg("Rscript").arg(&f);
            }
            _ => {
                let bin = format!("block{k}");
                std::fs::write(rust.join(format!("src/bin/{bin}.rs")), &b.code)
                    .map_err(|e| e.to_string())?;
                cmd.arg(cargo())
                    .args(["run", "-q", "--bin", &bin, "--manifest-path"])
                    .arg(rust.join("Cargo.toml"))
                    .env("CARGO_TARGET_DIR", root.join("target/snippets-build"));
            }
        }
        // R finds the mizu package, and Python workers the .venv's pymizu, as the tests do.
        cmd.env("R_LIBS", r::rlib(root))
            .env("MIZU_PYTHON", py)
            .env_remove("PYTHONPATH");
        if let Err(e) = run(&work, &mut cmd) {
            failed.push(format!("{}: {e}", b.at));
        }
    }
    if failed.is_empty() {
        eprintln!("\nsnippets: all {} blocks ran", all.len());
        Ok(())
    } else {
        Err(format!(
            "code blocks that fail as written:\n  {}",
            failed.join("\n  ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(md: &str) -> Result<Vec<Block>, String> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("mizu-snippets-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.md");
        std::fs::write(&f, md).unwrap();
        let r = blocks(&f, "t.md");
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn blocks_are_taken_continued_and_skipped_by_their_markers() {
        let md = "text\n\n```python\na = 1\n```\n\n<!-- snippet: continues -->\n```python\nprint(a)\n```\n\n\
                  <!-- snippet: not run: needs a cluster -->\n```r\nstop()\n```\n\n```sh\nrm -rf /\n```\n\n\
                  * item\n\n  ```r\n  x <- 1\n  ```\n";
        let b = parse(md).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(
            (b[0].lang.as_str(), b[0].code.as_str()),
            ("python", "a = 1\nprint(a)\n")
        );
        assert_eq!((b[1].lang.as_str(), b[1].code.as_str()), ("r", "x <- 1\n"));
        assert_eq!(b[1].at, "t.md:23", "the line of its fence");
    }

    #[test]
    fn a_marker_without_a_reason_or_unknown_is_an_error() {
        assert!(parse("<!-- snippet: not run: -->\n```r\nx\n```\n").is_err());
        assert!(parse("<!-- snippet: skip -->\n```r\nx\n```\n").is_err());
        assert!(parse("<!-- snippet: continues -->\n```r\nx\n```\n").is_err());
        assert!(parse("```r\nx\n").is_err());
    }
}
