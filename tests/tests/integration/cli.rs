//! The `switchyard` binary as a user runs it: check, plugins, replay and simulate.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use switchyard_tests::live::binary;
use switchyard_tests::{plugin_dir, workspace_root};

fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .current_dir(workspace_root())
        .env_remove("SWITCHYARD_PLUGIN_DIR")
        .output()
        .expect("switchyard runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn plugin_dir_arg() -> String {
    plugin_dir().display().to_string()
}

#[test]
fn check_prints_the_effective_default_config() {
    let out = run(&[
        "check",
        "--config",
        "configs/default.toml",
        "--plugin-dir",
        &plugin_dir_arg(),
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}\n{}", text, stderr(&out));
    assert!(
        text.starts_with("# effective configuration of configs/default.toml"),
        "{text}"
    );
    // Parameters left out of the file are printed with their default, marked as such.
    assert!(
        text.contains("maxPrefixTokensToMatch = 0  # default"),
        "{text}"
    );
    assert!(
        text.contains("matchLengthScaleTokens = 8192  # default"),
        "{text}"
    );
    assert!(
        text.contains("ttftSource = \"prefillThroughput\"  # default"),
        "{text}"
    );
    // Parameters given in the file are not marked.
    assert!(text.contains("\nwindowDurationMs = 100\n"), "{text}");
    assert!(text.contains("source built-in"), "{text}");
    assert!(text.contains("libburst_prefix_cache_producer.so"), "{text}");
    assert!(
        text.contains(
            "# producer order: \"token-producer\", \"approx-prefix-cache-producer\", \
             \"inflight-load-producer\", \"burst-prefix-cache-producer\""
        ),
        "{text}"
    );
}

#[test]
fn check_shows_auto_created_producers() {
    let dir = temp_dir("auto");
    let default = std::fs::read_to_string(workspace_root().join("configs/default.toml")).unwrap();
    let without_load = default.replace("[[plugins]]\ntype = \"inflight-load-producer\"\n", "");
    assert_ne!(
        without_load, default,
        "the default config lists the load producer"
    );
    let path = dir.join("auto.toml");
    std::fs::write(&path, without_load).unwrap();
    let out = run(&[
        "check",
        "--config",
        path.to_str().unwrap(),
        "--plugin-dir",
        &plugin_dir_arg(),
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}\n{}", text, stderr(&out));
    let block = text
        .split("[[plugins]]")
        .find(|b| b.contains("type = \"inflight-load-producer\""))
        .expect("the load producer is printed");
    assert!(block.contains("created automatically"), "{block}");
    assert!(text.contains("\"inflight-load-producer\""), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `switchyard plugins` for the default config, which must succeed.
fn default_plugins_listing() -> String {
    let out = run(&[
        "plugins",
        "--config",
        "configs/default.toml",
        "--plugin-dir",
        &plugin_dir_arg(),
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}\n{}", text, stderr(&out));
    text
}

#[test]
fn plugins_lists_types_with_kind_stability_api_and_source() {
    let text = default_plugins_listing();
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["TYPE", "KIND", "STABILITY", "API", "SOURCE"]);
    let row = |type_name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(type_name))
            .unwrap_or_else(|| panic!("{type_name} listed: {text}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let burst = row("burst-prefix-cache-producer");
    assert_eq!(&burst[1..3], ["producer", "alpha"]);
    assert!(
        burst[4].ends_with("libburst_prefix_cache_producer.so"),
        "{burst:?}"
    );
    assert!(Path::new(&burst[4]).is_absolute(), "{burst:?}");
    let filter = row("prefix-cache-affinity-filter");
    assert_eq!(&filter[1..3], ["filter", "beta"]);
    assert!(filter[4].ends_with("libprefix_cache_affinity_filter.so"));
    let scorer = row("prefix-cache-scorer");
    assert_eq!(scorer[1], "scorer");
    assert!(scorer[4].ends_with("libprefix_cache_scorer.so"));
    let approx = row("approx-prefix-cache-producer");
    assert!(approx[4].ends_with("libapprox_prefix_cache_producer.so"));
    for builtin in [
        "token-producer",
        "inflight-load-producer",
        "max-score-picker",
        "load-aware-scorer",
    ] {
        assert_eq!(row(builtin)[4], "built-in", "{builtin}");
    }
    assert_eq!(row("max-score-picker")[1], "picker");
    assert_eq!(burst[3], row("token-producer")[3], "one API version");
}

#[test]
fn replay_writes_one_line_per_request_with_records() {
    let dir = temp_dir("replay");
    let input = dir.join("requests.jsonl");
    std::fs::write(
        &input,
        "{\"arrival_ms\":0,\"id\":\"a\",\"model\":\"m\",\"tokens\":[1,2,3,4]}\n\
         # a comment line\n\
         {\"arrival_ms\":1,\"id\":\"b\",\"model\":\"m\",\"tokens\":[1,2,3,4]}\n\
         {\"arrival_ms\":500,\"id\":\"c\",\"model\":\"m\",\"tokens\":[9,9]}\n",
    )
    .unwrap();
    let out = run(&[
        "replay",
        "--config",
        "configs/default.toml",
        "--plugin-dir",
        &plugin_dir_arg(),
        "--input",
        input.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}\n{}", text, stderr(&out));
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    let ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    // a and b share the window opened at 0, sealed 2 ms after b arrived (`windowQuietMs`):
    // co-located on one replica.
    assert_eq!(lines[0]["endpoints"], lines[1]["endpoints"]);
    for line in &lines[..2] {
        assert_eq!(line["decided_ms"], 3.0);
        assert_eq!(line["endpoints"].as_array().unwrap().len(), 1);
        let decision = &line["decision"];
        assert_eq!(decision["window"]["batch_size"], 2);
        assert_eq!(decision["window"]["opened_ms"], 0.0);
        assert_eq!(decision["picked"], line["endpoints"]);
        assert_eq!(decision["candidates"].as_array().unwrap().len(), 4);
    }
    // c is alone in a window opened at 500.
    assert_eq!(lines[2]["decided_ms"], 502.0);
    assert_eq!(lines[2]["decision"]["window"]["batch_size"], 1);
    assert_eq!(lines[2]["endpoints"].as_array().unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn replay_names_a_bad_line_and_fails() {
    let dir = temp_dir("replay-bad");
    let input = dir.join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"arrival_ms\":0,\"id\":\"a\",\"tokens\":[1,2]}\n{\"arrival\":1,\"tokens\":[1]}\n",
    )
    .unwrap();
    let out = run(&[
        "replay",
        "--config",
        "configs/default.toml",
        "--plugin-dir",
        &plugin_dir_arg(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("bad.jsonl:2: "), "{err}");
    assert!(err.contains("arrival"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn simulate_writes_a_report_per_pipeline() {
    let dir = temp_dir("simulate");
    let out = run(&[
        "simulate",
        "--config",
        "configs/default.toml",
        "--plugin-dir",
        &plugin_dir_arg(),
        "--set",
        "steps=1",
        "--output",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let run = &report["run"];
    let args: Vec<&str> = run["command_line"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        &args[1..4],
        ["simulate", "--config", "configs/default.toml"]
    );
    assert_eq!(run["workload"], "rl-rollout");
    assert_eq!(run["workload_parameters"]["steps"], 1);
    assert_eq!(
        run["workload_parameters"]["samples"], 16,
        "defaults filled in"
    );
    assert_eq!(run["replicas"], 8);
    assert_eq!(run["seed"], 0);
    assert_eq!(run["switchyard_version"], env!("CARGO_PKG_VERSION"));
    let config = &run["configs"][0];
    assert_eq!(config["path"], "configs/default.toml");
    let bytes = std::fs::read(workspace_root().join("configs/default.toml")).unwrap();
    assert_eq!(
        config["sha256"],
        switchyard::plugins::supply::sha256_hex(&bytes)
    );
    let pipelines = report["pipelines"]
        .as_array()
        .expect("one object per pipeline");
    let names: Vec<&str> = pipelines
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "default", "{names:?}");
    assert!(names.contains(&"round-robin"), "{names:?}");
    assert!(names.contains(&"least-in-flight"), "{names:?}");
    let requests = pipelines[0]["requests"].as_u64().unwrap();
    assert!(requests > 0);
    for p in pipelines {
        assert_eq!(
            p["requests"].as_u64(),
            Some(requests),
            "same workload for {}",
            p["name"]
        );
        assert!(p.get("cache_hit_rate").is_some());
    }
    assert!(dir.join("report.html").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// The effective config as data: comments (the header naming the file, `# default` marks,
/// sources) and number spellings do not count.
fn effective_table(text: &str) -> toml::Table {
    text.parse()
        .unwrap_or_else(|e| panic!("check printed invalid TOML: {e}\n{text}"))
}

#[test]
fn check_output_is_a_config_that_checks_the_same_for_every_example() {
    let dir = temp_dir("round-trip");
    let mut examples: Vec<PathBuf> = std::fs::read_dir(workspace_root().join("configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 3);
    for example in examples {
        let first = run(&[
            "check",
            "--config",
            example.to_str().unwrap(),
            "--plugin-dir",
            &plugin_dir_arg(),
        ]);
        assert!(
            first.status.success(),
            "{}: {}",
            example.display(),
            stderr(&first)
        );
        let saved = dir.join(example.file_name().unwrap());
        std::fs::write(&saved, &first.stdout).unwrap();
        let second = run(&[
            "check",
            "--config",
            saved.to_str().unwrap(),
            "--plugin-dir",
            &plugin_dir_arg(),
        ]);
        assert!(
            second.status.success(),
            "{} does not check: {}",
            saved.display(),
            stderr(&second)
        );
        assert_eq!(
            effective_table(&stdout(&first)),
            effective_table(&stdout(&second)),
            "{}",
            example.display()
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plugins_shows_each_types_description_and_parameter_names() {
    let text = default_plugins_listing();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.split_whitespace().next() == Some("prefix-cache-scorer"))
        .unwrap_or_else(|| panic!("prefix-cache-scorer listed: {text}"));
    assert!(
        lines[at + 1]
            .trim_start()
            .starts_with("Scores endpoints by the share"),
        "{text}"
    );
    assert_eq!(
        lines[at + 2].trim(),
        "parameters: prefixMatchInfoProducerName, matchLengthWeight, matchLengthScaleTokens"
    );
    assert!(text.contains("plugins inspect"), "{text}");
}

#[test]
fn plugins_inspect_describes_a_library_without_a_config() {
    let library = plugin_dir().join("libprefix_cache_scorer.so");
    // Run where no default config exists: inspect needs none.
    let dir = temp_dir("inspect");
    let out = Command::new(binary())
        .args(["plugins", "inspect", library.to_str().unwrap()])
        .current_dir(&dir)
        .output()
        .expect("switchyard runs");
    let text = stdout(&out);
    assert!(out.status.success(), "{}\n{}", text, stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!("library     {}", library.canonicalize().unwrap().display())
    );
    let api = switchyard_plugin_api::ApiVersion::CURRENT;
    assert_eq!(
        lines[1],
        format!(
            "plugin API  {}.{}.{} (this switchyard loads 1.0 to 1.{})",
            api.major, api.minor, api.patch, api.minor
        )
    );
    assert_eq!(lines[2], "types       1");
    assert_eq!(lines[4], "prefix-cache-scorer");
    assert_eq!(lines[5], "  kind         scorer");
    assert_eq!(lines[6], "  stability    beta");
    assert!(
        lines[7].starts_with("  description  Scores endpoints by the share"),
        "{text}"
    );
    assert_eq!(lines[8], "  parameters");
    let block = lines[9..].join("\n");
    assert!(
        block.contains("matchLengthWeight            number, default 0.0\n"),
        "{block}"
    );
    assert!(block.contains("valid: [0, 1]\n"), "{block}");
    assert!(
        block.contains("Share of the score given to the absolute"),
        "{block}"
    );
    assert!(
        block.contains("matchLengthScaleTokens       integer, default 8192\n"),
        "{block}"
    );
    assert!(
        block.contains("prefixMatchInfoProducerName  string, default \"\"\n"),
        "{block}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plugins_inspect_shows_the_api_version_a_library_was_built_against() {
    let library = switchyard_tests::fixture_library("older-minor-plugin");
    let out = run(&["plugins", "inspect", library.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}\n{}", text, stderr(&out));
    assert!(
        text.contains("\nplugin API  1.0.0 (this switchyard loads 1.0 to 1."),
        "{text}"
    );
    assert!(text.contains("\nolder-minor-scorer\n"), "{text}");
    assert!(text.contains("\n  parameters   none\n"), "{text}");
}

#[test]
fn plugins_inspect_refuses_what_the_host_would_refuse() {
    let dir = temp_dir("inspect-refused");
    let text_file = dir.join("notes.so");
    std::fs::write(&text_file, "not a library\n").unwrap();
    let out = run(&["plugins", "inspect", text_file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with("error: cannot open plugin library "),
        "{err}"
    );
    assert!(!err.contains("config"), "{err}");
    let missing = dir.join("libgone.so");
    let out = run(&["plugins", "inspect", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("No such file or directory"), "{err}");
    // No config is involved, so its error names none.
    assert!(!err.contains("config"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plugins_inspect_takes_a_bare_library_name_as_configs_do() {
    // A copy of a library in a directory of its own: --plugin-dir and the environment
    // variable are searched before the binary's directory, so the copy is the one shown.
    let dir = temp_dir("inspect-bare");
    let copy = dir.join("libprefix_cache_scorer.so");
    std::fs::copy(plugin_dir().join("libprefix_cache_scorer.so"), &copy).unwrap();
    let shown = format!("library     {}\n", copy.canonicalize().unwrap().display());
    let by_flag = run(&[
        "plugins",
        "inspect",
        "prefix_cache_scorer",
        "--plugin-dir",
        dir.to_str().unwrap(),
    ]);
    let text = stdout(&by_flag);
    assert!(by_flag.status.success(), "{text}\n{}", stderr(&by_flag));
    assert!(text.starts_with(&shown), "{text}");
    assert!(text.contains("\nprefix-cache-scorer\n"), "{text}");

    let by_env = Command::new(binary())
        .args(["plugins", "inspect", "prefix_cache_scorer"])
        .current_dir(workspace_root())
        .env("SWITCHYARD_PLUGIN_DIR", &dir)
        .output()
        .expect("switchyard runs");
    assert!(by_env.status.success(), "{}", stderr(&by_env));
    assert!(stdout(&by_env).starts_with(&shown), "{}", stdout(&by_env));

    let missing = run(&[
        "plugins",
        "inspect",
        "no_such_plugin",
        "--plugin-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(!missing.status.success());
    let err = stderr(&missing);
    assert!(
        err.starts_with("error: plugin library 'no_such_plugin' not found; looked for"),
        "{err}"
    );
    assert!(
        err.contains(&dir.join("libno_such_plugin.so").display().to_string()),
        "{err}"
    );
    assert!(!err.contains("config"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The option lines of `args --help`, one string.
fn help(args: &[&str]) -> String {
    let mut args = args.to_vec();
    args.push("--help");
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

/// The help line of `flag` (from its flag to the next option's line).
fn help_line<'a>(text: &'a str, flag: &str) -> &'a str {
    let start = text
        .find(&format!("  {flag} "))
        .unwrap_or_else(|| panic!("{flag} in\n{text}"));
    let rest = &text[start + 2..];
    let end = rest.find("\n  -").unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn help_names_values_defaults_and_the_environment() {
    let simulate = help(&["simulate"]);
    let workload = help_line(&simulate, "--workload");
    assert!(
        workload.contains("[possible values: rl-rollout, shared-prefix, multi-turn, kv-pressure]"),
        "{workload}"
    );
    assert!(
        help_line(&simulate, "--replicas").contains("[default: 8]"),
        "{simulate}"
    );
    let seed = help_line(&simulate, "--seed");
    assert!(seed.starts_with("--seed <SEED>  "), "{seed}");
    assert!(seed.contains("scheduler"), "{seed}");
    assert!(help_line(&simulate, "--output").starts_with("--output <DIR> "));

    let serve = help(&["serve"]);
    assert!(
        help_line(&serve, "--log-format").contains("[possible values: text, json]"),
        "{serve}"
    );

    for command in [
        &["check"][..],
        &["simulate"],
        &["serve"],
        &["replay"],
        &["plugins"],
        &["plugins", "inspect"],
        &["config", "import"],
    ] {
        let text = help(command);
        let line = help_line(&text, "--plugin-dir");
        assert!(
            line.starts_with("--plugin-dir <DIR> "),
            "{command:?}: {line}"
        );
        assert!(
            line.contains("[env: SWITCHYARD_PLUGIN_DIR="),
            "{command:?}: {line}"
        );
    }

    let out = run(&["simulate", "--workload", "chat"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("possible values: rl-rollout, shared-prefix, multi-turn, kv-pressure"),
        "{err}"
    );
    let out = run(&["serve", "--log-format", "xml"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("possible values: text, json"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn version_names_the_plugin_api_versions_the_host_loads() {
    let out = run(&["--version"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}\n{}", text, stderr(&out));
    let api = switchyard_plugin_api::ApiVersion::CURRENT;
    let mut lines = text.lines();
    assert!(
        lines.next().is_some_and(|l| l.starts_with("switchyard ")),
        "{text}"
    );
    assert_eq!(
        lines.next(),
        Some(
            format!(
                "plugin API {}.{}.{}: loads plugin libraries built against 1.0 to 1.{}",
                api.major, api.minor, api.patch, api.minor
            )
            .as_str()
        )
    );
}

#[test]
fn simulate_refuses_a_run_too_large_for_its_memory_limit_up_front() {
    let out = run(&[
        "simulate",
        "--plugin-dir",
        &plugin_dir_arg(),
        "--set",
        "steps=19000",
        "--max-memory",
        "1G",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("workload rl-rollout: this run needs an estimated")
            && err.contains("over the limit of 1.0 GiB (--max-memory)")
            && err.contains("lower steps, prompts, samples or promptTokensMax"),
        "{err}"
    );
    // Refused before any simulation starts.
    assert!(!err.contains("simulating"), "{err}");
    assert!(stdout(&out).is_empty());

    let out = run(&["simulate", "--max-memory", "lots"]);
    assert!(
        stderr(&out).contains("--max-memory lots: expected a size"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn simulate_names_the_parameter_of_a_mistyped_set() {
    let out = run(&[
        "simulate",
        "--plugin-dir",
        &plugin_dir_arg(),
        "--set",
        "samples=4",
        "--set",
        "prompts=abc",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains(
            r#"workload rl-rollout: prompts must be an integer in 1..=100000 (got "abc")"#
        ),
        "{err}"
    );
}

#[test]
fn check_output_names_the_tokenizer_file_so_it_checks_from_anywhere() {
    let dir = temp_dir("check-tokenizer");
    let file = switchyard_tests::live::word_tokenizer(&dir);
    let template = dir.join("chat.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let config = dir.join("pipeline.toml");
    std::fs::write(
        &config,
        "[[plugins]]\ntype = \"token-producer\"\n[plugins.parameters]\n\
         tokenizer = { path = \"tokenizer.json\", chatTemplate = \"chat.jinja\" }\n\n\
         [[plugins]]\ntype = \"queue-scorer\"\n",
    )
    .unwrap();
    let first = run(&["check", "--config", config.to_str().unwrap()]);
    assert!(first.status.success(), "{}", stderr(&first));
    let text = stdout(&first);
    let table = effective_table(&text);
    let producer = table["plugins"]
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|p| p["type"].as_str() == Some("token-producer"))
        })
        .expect("the token producer");
    let parameters = producer["parameters"].as_table().expect("parameters");
    assert_eq!(
        parameters["tokenizer"]["path"].as_str(),
        Some(std::fs::canonicalize(&file).unwrap().to_str().unwrap())
    );
    assert_eq!(
        parameters["tokenizer"]["chatTemplate"].as_str(),
        Some(std::fs::canonicalize(&template).unwrap().to_str().unwrap())
    );
    assert!(!parameters.contains_key("estimate"), "{text}");
    // Saved elsewhere, the output checks the same.
    let elsewhere = temp_dir("check-tokenizer-saved");
    let saved = elsewhere.join("effective.toml");
    std::fs::write(&saved, &first.stdout).unwrap();
    let second = run(&["check", "--config", saved.to_str().unwrap()]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(effective_table(&stdout(&second)), table);
}
