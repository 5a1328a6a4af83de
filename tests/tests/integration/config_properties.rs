//! Properties of config checking over generated documents: every valid config generated is
//! accepted, and every corruption of one (a line dropped, doubled, cut short, or a value
//! replaced by one no field takes) is either accepted or refused, never a panic, and a refusal
//! names the file and a line of it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use switchyard_tests::{generated_path, try_pipeline};

const NAME: &str = "properties";

const SCORERS: &[&str] = &[
    "queue-scorer",
    "load-aware-scorer",
    "kv-cache-utilization-scorer",
    "prefix-cache-scorer",
];
const PICKERS: &[&str] = &[
    "max-score-picker",
    "random-picker",
    "weighted-random-picker",
];

/// Values that no field of a config takes in the place they are put.
const BAD_VALUES: &[&str] = &[
    "nan",
    "inf",
    "-inf",
    "-1",
    "1e309",
    "\"\"",
    "\"\\u001b[31m\"",
    "1979-05-27T07:32:00Z",
    "[",
    "{ }",
    "18446744073709551616",
    "\"no-such-plugin\"",
];

/// A valid config, as lines.
#[derive(Debug, Clone)]
struct Document {
    endpoints: usize,
    scorers: Vec<(usize, u32)>,
    picker: usize,
    affinity: bool,
}

fn document() -> impl Strategy<Value = Document> {
    (
        1usize..4,
        proptest::sample::subsequence((0..SCORERS.len()).collect::<Vec<_>>(), 0..=SCORERS.len()),
        proptest::collection::vec(0u32..10, SCORERS.len()),
        0..PICKERS.len(),
        any::<bool>(),
    )
        .prop_map(|(endpoints, chosen, weights, picker, affinity)| Document {
            endpoints,
            scorers: chosen.into_iter().map(|s| (s, weights[s])).collect(),
            picker,
            affinity,
        })
}

impl Document {
    fn lines(&self) -> Vec<String> {
        let mut lines = vec![
            "libraries = [\"prefix_cache_scorer\", \"prefix_cache_affinity_filter\", \
             \"approx_prefix_cache_producer\"]"
                .to_string(),
        ];
        for i in 0..self.endpoints {
            lines.push("[[endpoints]]".into());
            lines.push(format!("name = \"pod{i}\""));
            lines.push(format!("address = \"10.0.0.{}:8000\"", i + 1));
            lines.push("[endpoints.metrics]".into());
            lines.push(format!("waiting_requests = {i}"));
            lines.push("kv_cache_usage = 0.5".into());
        }
        let plugin = |lines: &mut Vec<String>, type_name: &str, parameters: &[&str]| {
            lines.push("[[plugins]]".into());
            lines.push(format!("type = \"{type_name}\""));
            if !parameters.is_empty() {
                lines.push("[plugins.parameters]".into());
                lines.extend(parameters.iter().map(|p| p.to_string()));
            }
        };
        let prefix = self.affinity
            || self
                .scorers
                .iter()
                .any(|(s, _)| SCORERS[*s] == "prefix-cache-scorer");
        if prefix {
            plugin(
                &mut lines,
                "approx-prefix-cache-producer",
                &["blockSizeTokens = 16"],
            );
        }
        if self.affinity {
            plugin(
                &mut lines,
                "prefix-cache-affinity-filter",
                &["affinityThreshold = 0.8"],
            );
        }
        for (scorer, _) in &self.scorers {
            let parameters: &[&str] = match SCORERS[*scorer] {
                "load-aware-scorer" => &["threshold = 64"],
                _ => &[],
            };
            plugin(&mut lines, SCORERS[*scorer], parameters);
        }
        plugin(&mut lines, PICKERS[self.picker], &["maxNumOfEndpoints = 1"]);
        lines.push("[[profiles]]".into());
        lines.push("name = \"default\"".into());
        if self.affinity {
            lines.push("filters = [\"prefix-cache-affinity-filter\"]".into());
        }
        let scorers: Vec<String> = self
            .scorers
            .iter()
            .map(|(s, w)| format!("{{ plugin = \"{}\", weight = {w} }}", SCORERS[*s]))
            .collect();
        lines.push(format!("scorers = [{}]", scorers.join(", ")));
        lines.push(format!("picker = \"{}\"", PICKERS[self.picker]));
        lines
    }
}

#[derive(Debug, Clone)]
enum Corruption {
    Drop,
    Double,
    Cut(usize),
    Value(usize),
}

fn corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        Just(Corruption::Drop),
        Just(Corruption::Double),
        (0usize..40).prop_map(Corruption::Cut),
        (0..BAD_VALUES.len()).prop_map(Corruption::Value),
    ]
}

fn corrupt(lines: &mut Vec<String>, at: usize, how: &Corruption) {
    match how {
        Corruption::Drop => {
            lines.remove(at);
        }
        Corruption::Double => {
            let line = lines[at].clone();
            lines.insert(at, line);
        }
        Corruption::Cut(keep) => {
            let line = &mut lines[at];
            let keep = (*keep).min(line.len());
            let keep = (0..=keep)
                .rev()
                .find(|k| line.is_char_boundary(*k))
                .unwrap_or(0);
            line.truncate(keep);
        }
        Corruption::Value(value) => {
            if let Some((key, _)) = lines[at].split_once(" = ") {
                lines[at] = format!("{key} = {}", BAD_VALUES[*value]);
            }
        }
    }
}

/// What checking `text` does: accepted, or refused with a message; a panic fails the test.
fn check(text: &str) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| try_pipeline(NAME, text).map(|_| ()))) {
        Ok(result) => result,
        Err(_) => panic!("checking panicked on:\n{text}"),
    }
}

/// The line a refusal names, when it starts with `file:line:`.
fn cited_line(message: &str) -> Option<usize> {
    let file = generated_path(NAME);
    let rest = message.strip_prefix(&format!("{}:", file.display()))?;
    rest.split_once(':')?.0.parse().ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn generated_configs_are_accepted(doc in document()) {
        let text = doc.lines().join("\n");
        prop_assert_eq!(check(&text), Ok(()), "{}", text);
    }

    #[test]
    fn corrupted_configs_never_panic_and_refusals_name_a_line(
        doc in document(),
        at in any::<proptest::sample::Index>(),
        how in corruption(),
    ) {
        let mut lines = doc.lines();
        let at = at.index(lines.len());
        corrupt(&mut lines, at, &how);
        let text = lines.join("\n");
        if let Err(message) = check(&text) {
            let line = cited_line(&message);
            prop_assert!(
                line.is_some_and(|n| (1..=lines.len().max(1)).contains(&n)),
                "no line of the file in: {}\n{}", message, text
            );
        }
    }
}
