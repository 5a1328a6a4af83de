//! Each plugin's README documents its parameters in a table; the library declares them in its
//! `PluginFactory`. The two must name the same parameters, in the same order, with the same
//! defaults, so neither can drift from the other.

use std::path::Path;

use switchyard_plugin_api::loading::load_library;
use switchyard_tests::{plugin_dir, workspace_root};

/// `(name, default)` per row of the first table whose first header cell is `parameter`.
fn readme_parameters(readme: &str) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in readme.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if !in_table {
            in_table = cells.first() == Some(&"parameter");
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
        {
            continue;
        }
        let name = cells[0].trim_matches('`').to_string();
        rows.push((name, cells.get(1).copied().unwrap_or("").to_string()));
    }
    rows
}

/// A default as a TOML value: the declared defaults are TOML text; a README cell may wrap it
/// in backticks, leave a string unquoted, or add a remark after the value.
fn value(text: &str) -> toml::Value {
    let text = text.trim();
    let code = match text.strip_prefix('`') {
        Some(rest) => rest.split('`').next().unwrap_or(""),
        None => text,
    };
    match format!("v = {code}").parse::<toml::Table>() {
        Ok(mut table) => table.remove("v").expect("the key just parsed"),
        Err(_) => toml::Value::String(code.to_string()),
    }
}

fn number(v: &toml::Value) -> Option<f64> {
    v.as_float().or_else(|| v.as_integer().map(|i| i as f64))
}

/// `0`, `0.0` and `0.00` are one default; other values compare as TOML values.
fn same_default(a: &toml::Value, b: &toml::Value) -> bool {
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The plugin crates: members under `plugins/` that build a `cdylib`, with their library name.
fn plugin_crates() -> Vec<(std::path::PathBuf, String)> {
    let mut crates = Vec::new();
    for entry in std::fs::read_dir(workspace_root().join("plugins")).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let manifest: toml::Table = manifest.parse().expect("a valid manifest");
        let Some(lib) = manifest.get("lib") else {
            continue;
        };
        let cdylib = lib["crate-type"]
            .as_array()
            .is_some_and(|types| types.iter().any(|t| t.as_str() == Some("cdylib")));
        if cdylib {
            crates.push((dir, lib["name"].as_str().unwrap().to_string()));
        }
    }
    crates.sort();
    crates
}

#[test]
fn every_plugin_readme_documents_exactly_the_declared_parameters_and_defaults() {
    let crates = plugin_crates();
    assert!(crates.len() >= 4, "{crates:?}");
    let mut problems = Vec::new();
    for (dir, lib) in &crates {
        let readme_path = dir.join("README.md");
        let readme = std::fs::read_to_string(&readme_path)
            .unwrap_or_else(|e| panic!("{} has a README: {e}", dir.display()));
        let library = load_library(&plugin_dir().join(switchyard::config::library_file_name(lib)))
            .unwrap_or_else(|e| panic!("{lib} loads: {e}"));
        let types = library.types();
        assert_eq!(types.len(), 1, "{lib} carries one type");
        let declared: Vec<(String, String)> = types[0]
            .parameters
            .iter()
            .map(|p| (p.name.to_string(), p.default.to_string()))
            .collect();
        let documented = readme_parameters(&readme);
        let where_ = Path::new(&readme_path)
            .strip_prefix(workspace_root())
            .unwrap()
            .display()
            .to_string();
        let names = |rows: &[(String, String)]| -> Vec<String> {
            rows.iter().map(|(n, _)| n.clone()).collect()
        };
        if names(&declared) != names(&documented) {
            problems.push(format!(
                "{where_}: documents {:?}, the library declares {:?}",
                names(&documented),
                names(&declared)
            ));
            continue;
        }
        for ((name, declared), (_, documented)) in declared.iter().zip(&documented) {
            if !same_default(&value(declared), &value(documented)) {
                problems.push(format!(
                    "{where_}: `{name}` defaults to {declared} in the library, the README says \
                     {documented}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_readme_table_reader_sees_rows_and_defaults() {
    let readme = "# x\n\n| parameter | default | meaning |\n|---|---|---|\n\
                  | `a` | `0.80` | one |\n| `b` | requests | two |\n| `c` | `\"\"` (set at build) | three |\n\nafter\n\
                  | parameter | default |\n|---|---|\n| `ignored` | 1 |\n";
    let rows = readme_parameters(readme);
    assert_eq!(
        rows.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    assert!(same_default(&value("0.8"), &value(&rows[0].1)));
    assert!(same_default(&value("\"requests\""), &value(&rows[1].1)));
    assert!(same_default(&value("\"\""), &value(&rows[2].1)));
    assert!(same_default(&value("0"), &value("`0.0`")));
    assert!(!same_default(&value("1"), &value("`0.0`")));
    assert!(!same_default(&value("\"static\""), &value("`\"matched\"`")));
}
