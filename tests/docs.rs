//! The documentation keeps up with the code: the README stays short, every link between the
//! pages lands on a file and a heading that exist, and `docs/configuration.md` documents
//! exactly the keys `refusal-gate default-config` prints — each key of its table is one the
//! default configuration has (set, or shown commented out), and each key the default
//! configuration has is in the table (or under a key of it that the table describes whole).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// GitHub's anchor for a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of a Markdown page outside its fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn the_readme_stays_short() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(lines < 250, "the README has {lines} lines");
}

#[test]
fn every_link_between_the_pages_lands() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page");
        let dir = page.parent().expect("a directory");
        for line in prose(&text) {
            for target in line.split("](").skip(1).filter_map(|t| t.split(')').next()) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                if !file.exists() {
                    broken.push(format!("{}: {target} (no such file)", page.display()));
                    continue;
                }
                if !anchor.is_empty() {
                    let there = std::fs::read_to_string(&file).expect("the target");
                    if !anchors(&there).contains(anchor) {
                        broken.push(format!("{}: {target} (no such heading)", page.display()));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// Every key the default configuration has, set or shown commented out, as dotted paths
/// (`interfaces[].discovery.paths`), and which of them are leaves.
fn default_keys() -> (BTreeSet<String>, BTreeSet<String>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_refusal-gate"))
        .arg("default-config")
        .output()
        .expect("default-config runs");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let key = |s: &str| -> Option<(bool, String, String)> {
        let (item, s) = match s.strip_prefix("- ") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let (name, value) = s.split_once(':')?;
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        valid.then(|| (item, name.to_owned(), value.to_owned()))
    };
    // (indent, path) of the keys the current line may be under.
    let mut stack: Vec<(usize, String)> = Vec::new();
    let (mut all, mut parents) = (BTreeSet::new(), BTreeSet::new());
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let rest = line.trim_start();
        // A commented-out key: `# key: value` stands where `key: value` would.
        let (indent, rest) = match rest.strip_prefix('#') {
            Some(c) => {
                let content = c.strip_prefix(' ').unwrap_or(c);
                let spaces = content.len() - content.trim_start().len();
                (indent + spaces, content.trim_start())
            }
            None => (indent, rest),
        };
        let Some((item, name, value)) = key(rest) else {
            continue;
        };
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let parent = stack.last().map(|(_, p)| p.clone());
        let (indent, parent) = if item {
            // `- key:` opens an item of the list `parent`, whose keys stand 2 further in.
            let list = format!("{}[]", parent.clone().unwrap_or_default());
            stack.push((indent, list.clone()));
            (indent + 2, Some(list))
        } else {
            (indent, parent)
        };
        let path = match &parent {
            Some(p) if p.ends_with("[]") => format!("{p}.{name}"),
            Some(p) => format!("{p}.{name}"),
            None => name.clone(),
        };
        if let Some(p) = &parent {
            parents.insert(p.trim_end_matches("[]").to_owned());
        }
        all.insert(path.clone());
        // A flow mapping's keys: `auth: { tokens: [], token_files: [] }`.
        let value = value.split(" #").next().unwrap_or_default().trim();
        if let Some(inner) = value.strip_prefix('{').and_then(|v| v.split('}').next()) {
            for part in inner.split(',') {
                if let Some((k, _)) = part.split_once(':') {
                    let k = k.trim();
                    if !k.is_empty() {
                        all.insert(format!("{path}.{k}"));
                        parents.insert(path.clone());
                    }
                }
            }
        }
        stack.push((indent, path));
    }
    let leaves = all
        .iter()
        .filter(|k| !parents.contains(k.as_str()))
        .cloned()
        .collect();
    (all, leaves)
}

/// The keys `docs/configuration.md`'s table documents: each row's first cell, a key or
/// several separated by commas, each in backquotes.
fn documented_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs/configuration.md"))
        .expect("docs/configuration.md");
    prose(&text)
        .iter()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            l.split('|')
                .nth(1)
                .unwrap_or_default()
                .split(',')
                .map(|k| k.trim().trim_matches('`').to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_configuration_page_documents_exactly_the_keys_default_config_prints() {
    let (all, leaves) = default_keys();
    let documented = documented_keys();
    assert!(documented.len() > 40, "{documented:?}");
    let unknown: Vec<_> = documented.iter().filter(|k| !all.contains(*k)).collect();
    assert!(
        unknown.is_empty(),
        "documented but not in default-config: {unknown:?}\n(default-config: {all:?})"
    );
    let covered = |leaf: &str| {
        documented.iter().any(|d| {
            leaf == d || leaf.starts_with(&format!("{d}.")) || leaf.starts_with(&format!("{d}[]"))
        })
    };
    let undocumented: Vec<_> = leaves.iter().filter(|k| !covered(k)).collect();
    assert!(
        undocumented.is_empty(),
        "in default-config but not documented: {undocumented:?}"
    );
}

/// The code in a page: its fenced blocks' lines and its inline code spans.
fn code(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push(line.to_owned());
        } else {
            out.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
        }
    }
    out
}

fn help(command: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_refusal-gate"))
        .args(command)
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{command:?} --help");
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn every_command_the_pages_show_is_one_the_binary_takes() {
    const COMMANDS: [&str; 4] = ["serve", "validate", "default-config", "replay"];
    let mut wrong = Vec::new();
    let mut seen = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page");
        for snippet in code(&text) {
            let Some(at) = snippet.find("refusal-gate ") else {
                continue;
            };
            let words: Vec<&str> = snippet[at + "refusal-gate ".len()..]
                .split_whitespace()
                .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
                .collect();
            let Some(command) = words.first().filter(|w| COMMANDS.contains(w)) else {
                continue;
            };
            seen += 1;
            let help = help(&[command]);
            for (i, word) in words.iter().enumerate() {
                if !word.starts_with("--") {
                    continue;
                }
                if !help.contains(word) {
                    wrong.push(format!("{}: `{snippet}`: {word}", page.display()));
                }
                // `--format table|json|html`: each value one the command takes.
                if let Some(values) = words.get(i + 1).filter(|v| v.contains('|')) {
                    for value in values.split('|') {
                        if !help.contains(&format!("{value},"))
                            && !help.contains(&format!("{value}]"))
                        {
                            wrong.push(format!("{}: `{snippet}`: {word} {value}", page.display()));
                        }
                    }
                }
            }
        }
    }
    assert!(seen >= 5, "only {seen} commands found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
