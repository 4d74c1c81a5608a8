//! The runtime's layers, checked from its sources: a module names only modules of its own
//! layer or of layers below it, so the layering cannot erode silently.
//!
//! ```text
//! api       lib.rs runtime.rs comm.rs request.rs wait.rs datatype.rs counters.rs (and the
//!           API-level unit tests: rendezvous_faults.rs)
//! progress  progress/          the modes, parking, waits; implements the executor's Drive
//! engine    engine/            one rank's state and the mechanisms that act on it
//! matching  matching/          the matching engine of one communicator
//! executor  executor/          the task pool; knows the runtime only through Drive
//! base      lock/ loom.rs config.rs buffer.rs provider.rs operation.rs spares.rs deferred.rs
//! ```
//!
//! `matching` and `executor` sit side by side: neither names the other. What counts is
//! code outside comments and outside test modules (tests may use the public API). Paths
//! through the crate root count as the root's layer (`crate::Error` is a re-export of
//! `lib.rs`, the API), so a lower layer writes `weft_sync::Error` instead.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Layers, lowest first; a file may name its own layer and every layer below, except the
/// pair that are side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Base,
    Matching,
    Executor,
    Engine,
    Progress,
    Api,
}

impl Layer {
    /// The layer of a source file, by its path relative to `src/`.
    fn of_file(rel: &str) -> Layer {
        let top = rel.split('/').next().unwrap_or(rel);
        match top {
            "progress" => Layer::Progress,
            "engine" => Layer::Engine,
            "matching" => Layer::Matching,
            "executor" => Layer::Executor,
            "lock" | "loom.rs" | "config.rs" | "buffer.rs" | "provider.rs" | "operation.rs" | "spares.rs" | "deferred.rs" => Layer::Base,
            "lib.rs"
            | "runtime.rs"
            | "comm.rs"
            | "group.rs"
            | "create.rs"
            | "coll.rs"
            | "coll_steps.rs"
            | "nbc.rs"
            | "request.rs"
            | "wait.rs"
            | "datatype.rs"
            | "counters.rs"
            | "rma"
            | "dlock"
            | "probe.rs"
            | "persistent.rs"
            | "persistent_coll.rs"
            | "continuation.rs"
            | "partitioned.rs"
            | "rendezvous_faults.rs" => Layer::Api,
            other => panic!("src/{rel}: no layer for `{other}`: add it to runtime/tests/layers.rs"),
        }
    }

    /// The layer of the module a `crate::<first>` path starts with.
    fn of_module(first: &str) -> Layer {
        match first {
            "progress" => Layer::Progress,
            "engine" => Layer::Engine,
            "matching" => Layer::Matching,
            "executor" => Layer::Executor,
            "lock" | "loom" | "config" | "buffer" | "provider" | "operation" | "spares" | "deferred" => Layer::Base,
            // Another module of lib.rs, or an item of the root (a re-export).
            _ => Layer::Api,
        }
    }

    /// Whether code of layer `self` may name layer `to`.
    fn may_name(self, to: Layer) -> bool {
        let side_by_side = matches!((self, to), (Layer::Matching, Layer::Executor) | (Layer::Executor, Layer::Matching));
        to <= self && !side_by_side
    }
}

/// The source without comments and without test modules (`#[cfg(test)]` or
/// `#[cfg(all(test, ...))]` followed by `mod` or `pub(crate) mod`), which may use the public
/// API.
fn code_of(src: &str) -> String {
    let mut out = String::new();
    let mut lines = src.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(")
            && t.contains("test")
            && lines.peek().is_some_and(|n| {
                let n = n.trim_start();
                n.starts_with("mod ") || n.starts_with("pub(crate) mod ")
            })
        {
            // Skip the module: up to the line where its braces balance.
            let mut depth = 0i32;
            let mut opened = false;
            for l in lines.by_ref() {
                let code = l.split("//").next().unwrap_or("");
                depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
                opened |= code.contains('{');
                if opened && depth <= 0 {
                    break;
                }
            }
            continue;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line.split(" //").next().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The first segment of every `crate::` path in `code`, including each item of a
/// `crate::{a::b, c}` group.
fn crate_modules(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in code.match_indices("crate::") {
        // `$crate::` in a macro names the crate too.
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The group's items at its top level (`a::{b, c}` is one item, `a`).
            let mut depth = 0;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        item_start = false;
                        let name = ident(&group[j..]);
                        if !name.is_empty() && name != "self" {
                            found.insert(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// Every violation in one file: `(module named, its layer)`.
fn violations(rel: &str, src: &str) -> Vec<String> {
    let layer = Layer::of_file(rel);
    let code = code_of(src);
    let mut out: Vec<String> = crate_modules(&code)
        .into_iter()
        .filter(|m| !layer.may_name(Layer::of_module(m)))
        .map(|m| format!("src/{rel} ({layer:?}) names crate::{m} ({:?})", Layer::of_module(&m)))
        .collect();
    // `super::super::` from a directory module reaches the crate root's modules.
    if rel.matches('/').count() == 1 && code.contains("super::super::") {
        out.push(format!("src/{rel} ({layer:?}) reaches the crate root through super::super::"));
    }
    out
}

fn sources(dir: &Path, base: &Path, out: &mut Vec<(String, PathBuf)>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            sources(&path, base, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(base).expect("under src/").to_string_lossy().replace('\\', "/");
            out.push((rel, path));
        }
    }
}

#[test]
fn no_layer_names_a_layer_above_it() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&base, &base, &mut files);
    assert!(files.len() > 20, "found only {} source files under {}", files.len(), base.display());
    let mut all = Vec::new();
    for (rel, path) in &files {
        let src = std::fs::read_to_string(path).expect("read source");
        all.extend(violations(rel, &src));
    }
    assert!(all.is_empty(), "layering violations:\n{}", all.join("\n"));
}

/// The check itself finds what it must: an engine file naming the progress layer, a
/// matching file naming the executor, a lower layer naming a root re-export, and it
/// ignores comments and test modules.
#[test]
fn the_check_finds_upward_names() {
    assert_eq!(violations("engine/x.rs", "use crate::progress::Want;\n").len(), 1);
    assert_eq!(violations("engine/x.rs", "use crate::{config::Config, progress::{self, Want}};\n").len(), 1);
    assert_eq!(violations("matching/x.rs", "fn f() { crate::executor::help(); }\n").len(), 1);
    assert_eq!(violations("lock/x.rs", "fn f() -> crate::Error { todo() }\n").len(), 1);
    assert_eq!(violations("executor/x.rs", "fn f() { super::super::engine::thread_token(); }\n").len(), 1);
    assert!(violations("progress/x.rs", "use crate::engine::Engine;\nuse crate::lock::path::PathLock;\n").is_empty());
    assert!(violations("engine/x.rs", "// crate::progress is above\nuse crate::lock::Mutex; // not crate::Runtime\n").is_empty());
    assert!(violations("engine/x.rs", "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::Runtime;\n}\n").is_empty());
}
