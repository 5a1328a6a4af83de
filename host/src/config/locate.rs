//! Finding the line of a key in the operator's TOML, for error messages.

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// One step of a path into a TOML document.
#[derive(Debug, Clone, Copy)]
pub enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The 1-based line where the value at `path` starts, or the line of the deepest part of the
/// path that exists (so a missing parameter still points at its plugin).
pub fn line_of(source: &str, path: &[Step<'_>]) -> Option<usize> {
    let root = DeTable::parse(source).ok()?;
    let mut best = None;
    let mut current: Option<&Spanned<DeValue<'_>>> = None;
    let mut table = Some(root.get_ref());
    for step in path {
        let next = match (step, current.map(|v| v.get_ref())) {
            (Step::Key(key), None) => table.and_then(|t| find(t, key)),
            (Step::Key(key), Some(DeValue::Table(t))) => find(t, key),
            (Step::Index(i), Some(DeValue::Array(items))) => items.get(*i),
            _ => None,
        };
        match next {
            Some(value) => {
                best = Some(value.span().start);
                current = Some(value);
                table = None;
            }
            None => break,
        }
    }
    best.map(|offset| line_at(source, offset))
}

fn find<'t, 'i>(table: &'t DeTable<'i>, key: &str) -> Option<&'t Spanned<DeValue<'i>>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .map(|(_, v)| v)
}

/// 1-based line number of a byte offset.
pub fn line_at(source: &str, offset: usize) -> usize {
    source[..offset.min(source.len())].matches('\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "title = 1\n\n[[plugins]]\ntype = \"a\"\n\n[[plugins]]\ntype = \"b\"\n[plugins.parameters]\nwindowDurationMs = 0\n";

    #[test]
    fn finds_nested_parameter() {
        let path = [
            Step::Key("plugins"),
            Step::Index(1),
            Step::Key("parameters"),
            Step::Key("windowDurationMs"),
        ];
        assert_eq!(line_of(DOC, &path), Some(9));
    }

    #[test]
    fn missing_key_points_at_the_deepest_existing_part() {
        let path = [
            Step::Key("plugins"),
            Step::Index(0),
            Step::Key("parameters"),
        ];
        let line = line_of(DOC, &path).expect("the plugin entry exists");
        assert!((3..=4).contains(&line), "got line {line}");
        assert_eq!(line_of(DOC, &[Step::Key("title")]), Some(1));
    }
}
