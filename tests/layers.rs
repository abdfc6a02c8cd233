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

/// Every `.rs` file under `src/`, as (its path relative to `src/`, its text).
fn rust_files() -> Vec<(std::path::PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("readable");
                let relative = path.strip_prefix(&src).expect("under src/").to_path_buf();
                out.push((relative, text));
            }
        }
    }
    out
}

/// Every (module, module it uses) pair of `src/`, with a file that makes it.
fn uses() -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for (relative, text) in rust_files() {
        let Some(module) = module_of(&relative) else {
            continue;
        };
        let code = code_of(&text);
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

/// The code of a file outside the items marked `#[cfg(test)]` (its tests), comments and
/// strings dropped.
fn production_code(source: &str) -> String {
    let code = code_of(source);
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        // The item marked: up to its `;` (a `mod tests;`, a `use`), or its block.
        rest = match (item.find('{'), item.find(';')) {
            (Some(open), Some(semi)) if semi < open => &item[semi + 1..],
            (Some(open), _) => &item[block_end(item, open)..],
            _ => "",
        };
    }
    out.push_str(rest);
    out
}

/// Where the block whose `{` stands at `open` in `code` ends (just past its `}`).
fn block_end(code: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// Each function of `code` with a body: its name and how many lines it takes, from its
/// `fn` line to its closing `}`.
fn functions(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = code[at..].find("fn ") {
        let start = at + found;
        at = start + 3;
        // A `fn` keyword, not the end of a longer word.
        if code[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let name: String = code[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let (Some(open), semi) = (code[at..].find('{'), code[at..].find(';')) else {
            continue;
        };
        if name.is_empty() || semi.is_some_and(|s| s < open) {
            continue; // a declaration without a body, or a `fn` type
        }
        let end = block_end(code, at + open);
        out.push((name, code[start..end].lines().count()));
    }
    out
}

#[test]
fn every_file_of_src_is_a_room_a_newcomer_can_hold() {
    // The project's own rule (issue 47): at most 800 lines of code a file, its tests
    // excluded, and no function over 100 lines.
    let mut too_long = Vec::new();
    let mut longest: Vec<(usize, String)> = Vec::new();
    for (relative, text) in rust_files() {
        // Tests are not held to it: `tests.rs` files and `tests/` folders.
        let in_tests = relative
            .components()
            .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
        if in_tests {
            continue;
        }
        let code = production_code(&text);
        let relative = relative.display();
        let lines = code.lines().filter(|l| !l.trim().is_empty()).count();
        if lines > 800 {
            too_long.push(format!("src/{relative}: {lines} lines of code"));
        }
        longest.push((lines, format!("src/{relative}")));
        for (function, lines) in functions(&code) {
            if lines > 100 {
                too_long.push(format!("src/{relative}: fn {function}, {lines} lines"));
            }
        }
    }
    too_long.sort();
    // The longest rooms, for whoever watches them grow (`-- --nocapture`).
    longest.sort_by(|a, b| b.cmp(a));
    for (lines, file) in longest.iter().take(10) {
        eprintln!("{lines:>5} lines of code  {file}");
    }
    assert!(too_long.is_empty(), "too long:\n{}", too_long.join("\n"));
}

#[test]
fn a_files_tests_and_its_functions_are_told_apart() {
    let code = production_code(
        "fn a() {\n    if x { y }\n}\n#[cfg(test)]\nmod tests {\n    fn t() { {} }\n}\n#[cfg(test)]\nmod more;\nfn b(f: fn(u8) -> u8) -> u8 { f(1) }\ntrait T { fn c(&self); }\n",
    );
    assert!(!code.contains("fn t") && !code.contains("mod more"));
    assert_eq!(
        functions(&code),
        vec![("a".to_owned(), 3), ("b".to_owned(), 1)]
    );
}
