//! The layers of `src/`: its top-level modules (a folder counts as one) use each other
//! without a cycle, and exactly as `docs/layout.md` draws them — each module uses
//! only modules drawn below it. The uses are the `crate::` paths outside comments.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The module a file of `src/` belongs to, or `None` for the crate roots.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_owned())
}

/// The code of Rust source: comments dropped, and the contents of strings, raw strings and
/// characters too (a `//` in a URL starts no comment, a `crate::` in a message uses nothing).
fn code_of(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        match rest {
            ['/', '/', ..] => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ['/', '*', ..] => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i..].starts_with(&['/', '*']) {
                        depth += 1;
                        i += 2;
                    } else if chars[i..].starts_with(&['*', '/']) {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            ['r', '#', ..] | ['r', '"', ..] => {
                let hashes = rest[1..].iter().take_while(|c| **c == '#').count();
                if rest.get(1 + hashes) != Some(&'"') {
                    out.push(chars[i]);
                    i += 1;
                    continue;
                }
                let close: Vec<char> = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                i += 2 + hashes;
                while i < chars.len() && !chars[i..].starts_with(&close) {
                    i += 1;
                }
                i = (i + close.len()).min(chars.len());
                out.push_str("\"\"");
            }
            ['"', ..] => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i = (i + 1).min(chars.len());
                out.push_str("\"\"");
            }
            // A character literal ('"', '\'', '/'), not a lifetime.
            ['\'', '\\', _, ..] | ['\'', _, '\'', ..] => {
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i = (i + 1).min(chars.len());
                out.push_str("' '");
            }
            _ => {
                out.push(chars[i]);
                i += 1;
            }
        }
    }
    out
}

/// Every (module, module it uses) pair of `src/`, with a file that makes it.
fn uses() -> BTreeMap<(String, String), String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(&src).expect("under src/");
            let Some(module) = module_of(relative) else {
                continue;
            };
            let code = code_of(&std::fs::read_to_string(&path).expect("readable"));
            for (at, _) in code.match_indices("crate::") {
                let used: String = code[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !used.is_empty() && used != module {
                    out.entry((module.clone(), used))
                        .or_insert_with(|| relative.display().to_string());
                }
            }
        }
    }
    out
}

/// The layers `docs/layout.md` draws, top first: each a set of module names.
fn drawn_layers() -> Vec<BTreeSet<String>> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/layout.md"))
        .expect("docs/layout.md");
    let marker = "Layers of `src/`, top to bottom";
    let after = &readme[readme
        .find(marker)
        .expect("docs/layout.md draws the layers")..];
    let block = after
        .split("```")
        .nth(1)
        .expect("the drawing is a fenced block");
    block
        .lines()
        .skip(1) // the fence's language
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let names = l.split('—').next().unwrap_or("");
            names.split_whitespace().map(str::to_owned).collect()
        })
        .collect()
}

#[test]
fn modules_use_only_the_layers_below_them_as_the_readme_draws_them() {
    let uses = uses();
    let layers = drawn_layers();
    let count = layers.len();
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |n| (n.as_str(), count - i)))
        .collect();
    let drawn: usize = layers.iter().map(BTreeSet::len).sum();
    assert_eq!(drawn, layer_of.len(), "a module is drawn twice: {layers:?}");
    let modules: BTreeSet<&str> = uses
        .keys()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    let undrawn: Vec<&&str> = modules
        .iter()
        .filter(|m| !layer_of.contains_key(**m))
        .collect();
    assert!(
        undrawn.is_empty(),
        "modules docs/layout.md does not draw: {undrawn:?}"
    );
    let upward: Vec<String> = uses
        .iter()
        .filter(|((a, b), _)| layer_of[a.as_str()] <= layer_of[b.as_str()])
        .map(|((a, b), file)| format!("{a} uses {b} (in src/{file})"))
        .collect();
    assert!(
        upward.is_empty(),
        "uses that go up or across a layer:\n{}",
        upward.join("\n")
    );
}

#[test]
fn comments_and_strings_are_told_apart() {
    let code = code_of(
        "let a = \"http://x\"; // crate::hidden\nlet b = crate::seen; /* crate::gone */ let c = '\"'; crate::also\nlet d = r#\"crate::in_raw\"#;",
    );
    assert!(!code.contains("hidden") && !code.contains("gone") && !code.contains("in_raw"));
    assert!(code.contains("crate::seen") && code.contains("crate::also"));
    assert!(!code.contains("http://x"));
}
