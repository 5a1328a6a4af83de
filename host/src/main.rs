//! The `switchyard` command line.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use switchyard::config::{LoadedConfig, DEFAULT_CONFIG};
use switchyard::pipeline::{build, load_registry, Options, Scheduler};
use switchyard::plugins::inspect;
use switchyard::plugins::supply::sha256_hex;
use switchyard::sim::{self, FleetConfig, SimFleet, SimRouter, Workload};
use switchyard::{effective, jsonl, replay, simulate};

/// The router allocates and frees request-sized buffers at a high rate; mimalloc keeps that
/// off glibc's consolidation path.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Endpoint picker for LLM inference fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Common {
    /// The pipeline configuration.
    #[arg(long, short, default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Allow plugin types of stability alpha (same as `allow_experimental_plugins = true`).
    #[arg(long)]
    allow_experimental_plugins: bool,
    /// A directory searched first for plugin libraries named by bare name (repeatable); the
    /// environment variable's directory is searched after the ones given here.
    #[arg(
        long = "plugin-dir",
        value_name = "DIR",
        env = PLUGIN_DIR_ENV
    )]
    plugin_dirs: Vec<PathBuf>,
}

const PLUGIN_DIR_ENV: &str = "SWITCHYARD_PLUGIN_DIR";

/// `dirs` and then the directory of `SWITCHYARD_PLUGIN_DIR`, unless it is among them already
/// (clap puts it there when no `--plugin-dir` is given).
fn with_env_plugin_dir(mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os(PLUGIN_DIR_ENV).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

impl Common {
    fn options(&self) -> Options {
        Options {
            allow_experimental_plugins: self.allow_experimental_plugins,
            plugin_dirs: with_env_plugin_dir(self.plugin_dirs.clone()),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct PluginsArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    action: Option<PluginsCommand>,
}

#[derive(Subcommand)]
enum PluginsCommand {
    /// Load one plugin library without a config and print what it exports: each type's kind,
    /// stability and description, the plugin API version it was built against, and every
    /// parameter with its type, default, valid range and meaning.
    Inspect {
        /// The library: a file (e.g. target/release/libmy_plugin.so, relative to the current
        /// directory) or a bare name as a config's `libraries` take it (e.g.
        /// prefix_cache_scorer), looked up in the same directories.
        library: PathBuf,
        /// A directory searched first for a library named by bare name (repeatable); the
        /// environment variable's directory is searched after the ones given here.
        #[arg(
            long = "plugin-dir",
            value_name = "DIR",
            env = PLUGIN_DIR_ENV
        )]
        plugin_dirs: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config and print it with defaults filled in, created producers and order.
    Check(Common),
    /// List the plugin types available to a config: kind, stability, API version, source,
    /// description and parameters; `plugins inspect LIBRARY` describes one library.
    Plugins(PluginsArgs),
    /// Schedule a JSONL file of timestamped requests on virtual time (see docs/replay.md).
    Replay {
        #[command(flatten)]
        common: Common,
        /// Requests, one JSON object per line.
        #[arg(long)]
        input: PathBuf,
        /// Where to write the decisions (standard output when omitted).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Seed of every random choice.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Leave the decision records out of the output.
        #[arg(long)]
        brief: bool,
    },
    /// Route real traffic: an OpenAI-compatible HTTP router in front of model servers (see
    /// docs/serve.md).
    Serve {
        #[command(flatten)]
        common: Common,
        /// Port of the API (overrides the port of `serve.listen`).
        #[arg(long)]
        port: Option<u16>,
        /// Port of /metrics, /health and /ready (overrides the port of `serve.metrics_listen`).
        #[arg(long)]
        metrics_port: Option<u16>,
        /// Port of the admin API on loopback (overrides the port of `serve.admin_listen`).
        #[arg(long)]
        admin_port: Option<u16>,
        /// Seed of every random choice.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Log format.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Write every request as a `replay` input line to this file.
        #[arg(long)]
        journal: Option<PathBuf>,
        /// Control socket for restarts without a gap: take the listening sockets over from
        /// the process offering them at this path (it then drains and exits; bind afresh
        /// when none does), and offer them there to the next one (see docs/operations.md).
        #[arg(long, value_name = "PATH")]
        handover: Option<PathBuf>,
    },
    /// The endpoint picker behind Envoy: serves Envoy's ext_proc gRPC protocol with the
    /// reference picker's flags and ports (see docs/ext-proc.md).
    ExtProc(switchyard::extproc::ExtProcArgs),
    /// Work with configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// An OpenAI-compatible stand-in model server for tests and demos, built on the
    /// simulator's replica model run on the real clock.
    MockReplica(switchyard::mock_replica::MockOptions),
    /// Simulate the pipeline against baselines on a modelled fleet (see docs/simulate.md).
    Simulate {
        #[command(flatten)]
        common: Common,
        /// Built-in workload.
        #[arg(
            long,
            default_value = Workload::NAMES[0],
            value_parser = clap::builder::PossibleValuesParser::new(Workload::NAMES)
        )]
        workload: String,
        /// Workload parameter override, `name=value` with the camelCase name (repeatable); with
        /// --trace, only seed, arrivalSpreadMs and arrivalJitterMs.
        #[arg(long = "set", value_name = "NAME=VALUE")]
        overrides: Vec<String>,
        /// Replay a JSONL trace instead of a built-in workload.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Number of replicas.
        #[arg(long, default_value_t = FleetConfig::default().replicas)]
        replicas: usize,
        /// The replica model of every replica: a step-engine preset or `fixed-rate` (see
        /// docs/simulate.md).
        #[arg(long, default_value = sim::profile::DEFAULT_PROFILE)]
        profile: String,
        /// A fleet file (TOML): groups of replicas with their profiles, block size, scrape
        /// interval, latency objectives.
        #[arg(long, conflicts_with_all = ["replicas", "profile"])]
        fleet: Option<PathBuf>,
        /// How long after a replica's cache changed a pipeline reading KV-cache events hears
        /// of it, in ms, 0..=1000000 (default: the fleet file's kvEventDelayMs, else 10).
        #[arg(long, value_name = "MS")]
        kv_event_delay_ms: Option<f64>,
        /// More pipelines to compare (repeatable).
        #[arg(long = "compare")]
        compare: Vec<PathBuf>,
        /// Skip the baselines.
        #[arg(long)]
        no_baselines: bool,
        /// Routers of each policy side by side in front of the fleet, as behind a load
        /// balancer: requests are dealt to them in turn, each sees the replicas' load and
        /// events but only its own requests, 1..=16.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
        routers: u16,
        /// Write report.json and report.html into this directory (created if needed).
        #[arg(long, value_name = "DIR")]
        output: Option<PathBuf>,
        /// Seed of each pipeline's scheduler; the workload has its own (--set seed=N).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Refuse a built-in workload whose estimated memory exceeds this (e.g. 4G, 512M);
        /// default half of physical memory.
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<String>,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Turn the reference endpoint picker's EndpointPickerConfig YAML into a switchyard TOML
    /// pipeline (see docs/import.md).
    Import {
        /// The EndpointPickerConfig YAML file.
        file: PathBuf,
        /// Where to write the TOML (standard output when omitted).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Overwrite the output file if it exists.
        #[arg(long)]
        force: bool,
        /// The scheduling profile to import when the file has several.
        #[arg(long)]
        profile: Option<String>,
        /// A directory searched first for switchyard's plugin libraries (repeatable); the
        /// environment variable's directory is searched after the ones given here.
        #[arg(
            long = "plugin-dir",
            value_name = "DIR",
            env = PLUGIN_DIR_ENV
        )]
        plugin_dirs: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "ext-proc") {
        if let Err(message) = switchyard::extproc::flags::refuse_unsupported(&args[2..]) {
            eprintln!("error: {message}");
            return ExitCode::FAILURE;
        }
    }
    // `--version` also names the plugin API versions this build loads.
    let version: &'static str = Box::leak(inspect::version_text().into_boxed_str());
    let matches = Cli::command().version(version).get_matches_from(args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let (json_logs, default_level) = match &cli.command {
        Command::Serve { log_format, .. } => (*log_format == LogFormat::Json, "info"),
        Command::ExtProc(args) => (args.log_format == "json", args.log_level()),
        Command::MockReplica(_) => (false, "info"),
        _ => (false, "warn"),
    };
    init_logging(json_logs, default_level);
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to standard error, as text (colour only on a terminal) or as JSON lines.
fn init_logging(json: bool, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Serve {
            common,
            port,
            metrics_port,
            admin_port,
            seed,
            log_format: _,
            journal,
            handover,
        } => {
            let config = read_config(&common.config)?;
            let options = common.options();
            let serve_options = switchyard::serve::ServeOptions {
                port,
                metrics_port,
                admin_port,
                seed,
                journal,
                handover,
            };
            runtime()?.block_on(switchyard::serve::run(config, options, serve_options))
        }
        Command::Config(ConfigCommand::Import {
            file,
            output,
            force,
            profile,
            plugin_dirs,
        }) => {
            let options = switchyard::config::import::ImportOptions {
                profile,
                plugin_dirs: with_env_plugin_dir(plugin_dirs),
                output: output.clone(),
            };
            config_import(&file, output.as_deref(), force, &options)
        }
        Command::ExtProc(args) => {
            args.check()?;
            let config = read_config(&args.config_file)?;
            runtime()?.block_on(switchyard::extproc::run(config, args))
        }
        Command::MockReplica(options) => {
            runtime()?.block_on(switchyard::mock_replica::run(options))
        }
        Command::Check(common) => {
            let config = read_config(&common.config)?;
            config.check_serve().map_err(|e| e.to_string())?;
            let options = common.options();
            let registry = load_registry(&config, &options).map_err(|e| e.to_string())?;
            let pipeline = build(&config, &registry, &options).map_err(|e| e.to_string())?;
            print!("{}", effective::render(&config, &registry, &pipeline));
            Ok(())
        }
        Command::Plugins(PluginsArgs {
            action:
                Some(PluginsCommand::Inspect {
                    library,
                    plugin_dirs,
                }),
            ..
        }) => {
            let path = inspect::resolve_library(&library, &with_env_plugin_dir(plugin_dirs))?;
            print!("{}", inspect::inspect_library(&path)?);
            Ok(())
        }
        Command::Plugins(PluginsArgs {
            common,
            action: None,
        }) => {
            let config = read_config(&common.config)?;
            let registry = load_registry(&config, &common.options()).map_err(|e| e.to_string())?;
            print!("{}", inspect::render_list(&registry));
            Ok(())
        }
        Command::Replay {
            common,
            input,
            output,
            seed,
            brief,
        } => {
            let config = read_config(&common.config)?;
            let options = common.options();
            let registry = load_registry(&config, &options).map_err(|e| e.to_string())?;
            let pipeline = build(&config, &registry, &options).map_err(|e| e.to_string())?;
            if let Some(path) = output.as_ref().filter(|o| jsonl::same_file(&input, o)) {
                return Err(format!(
                    "--output {} is the input file; write the decisions somewhere else",
                    path.display()
                ));
            }
            let file = std::fs::File::open(&input)
                .map_err(|e| format!("cannot read {}: {e}", input.display()))?;
            let located =
                |e: replay::InputError| format!("{}:{}: {}", input.display(), e.line, e.message);
            let lines = replay::read_input(std::io::BufReader::new(file)).map_err(located)?;
            let fleet = replay::fleet_from_config(&config.config.endpoints);
            replay::check_input(&lines, &fleet).map_err(located)?;
            let mut scheduler = Scheduler::new(Arc::new(pipeline), fleet, seed);
            let mut sink: Box<dyn Write> = match &output {
                Some(path) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(path)
                        .map_err(|e| format!("cannot write {}: {e}", path.display()))?,
                )),
                None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
            };
            let (placed, rejected) = replay::run(&mut scheduler, &lines, !brief, &mut *sink)
                .map_err(|e| format!("writing decisions: {e}"))?;
            sink.flush()
                .map_err(|e| format!("writing decisions: {e}"))?;
            eprintln!("{placed} requests placed, {rejected} rejected");
            Ok(())
        }
        Command::Simulate {
            common,
            workload,
            overrides,
            trace,
            replicas,
            profile,
            fleet,
            kv_event_delay_ms,
            compare,
            no_baselines,
            routers,
            output,
            seed,
            max_memory,
        } => simulate_command(SimulateArgs {
            common,
            workload,
            overrides,
            trace,
            replicas,
            profile,
            fleet,
            kv_event_delay_ms,
            compare,
            no_baselines,
            routers: usize::from(routers),
            output,
            seed,
            max_memory,
        }),
    }
}

struct SimulateArgs {
    common: Common,
    workload: String,
    overrides: Vec<String>,
    trace: Option<PathBuf>,
    replicas: usize,
    profile: String,
    fleet: Option<PathBuf>,
    kv_event_delay_ms: Option<f64>,
    compare: Vec<PathBuf>,
    no_baselines: bool,
    routers: usize,
    output: Option<PathBuf>,
    seed: u64,
    max_memory: Option<String>,
}

/// Where `simulate` takes its requests from.
enum Requests {
    Trace(Vec<sim::SimRequest>),
    Workload(Workload),
}

fn simulate_command(args: SimulateArgs) -> Result<(), String> {
    let options = args.common.options();
    let config = read_config(&args.common.config)?;
    let mut fleet = match &args.fleet {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            SimFleet::parse(path, &text).map_err(|e| e.to_string())?
        }
        None => {
            let fleet = SimFleet::uniform(&args.profile, args.replicas)
                .map_err(|e| format!("--profile: {e}"))?;
            fleet.validate().map_err(|e| format!("--replicas: {e}"))?;
            fleet
        }
    };
    if let Some(delay) = args.kv_event_delay_ms {
        fleet.kv_event_delay_ms = delay;
        fleet
            .validate()
            .map_err(|e| format!("--kv-event-delay-ms: {e}"))?;
    }
    let (memory_limit, limit_source) = match &args.max_memory {
        Some(text) => (
            sim::parse_bytes(text).ok_or_else(|| {
                format!("--max-memory {text}: expected a size such as 4G, 512M or 1073741824")
            })?,
            "--max-memory",
        ),
        None => sim::default_memory_limit(),
    };
    let mut overrides = serde_json::Map::new();
    for entry in &args.overrides {
        let (name, value) = entry
            .split_once('=')
            .ok_or_else(|| format!("--set {entry}: expected NAME=VALUE"))?;
        let value = serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
        if overrides.insert(name.to_string(), value).is_some() {
            return Err(format!(
                "--set {name} is given twice; keep the one you mean"
            ));
        }
    }
    let overrides = serde_json::Value::Object(overrides);
    // A trace is read line by line and its requests kept for every router; a built-in
    // workload is generated afresh for each router.
    let (label, source, parameters) = match &args.trace {
        Some(path) => {
            let params = sim::TraceParams::from_overrides(overrides).map_err(|e| e.to_string())?;
            let parameters = serde_json::to_value(&params).unwrap_or_default();
            // Text prompts become the token ids the main config's router would make of them.
            let tokenizer = switchyard::pipeline::tokenize::PromptTokenizer::for_config(&config)
                .map_err(|e| e.to_string())?;
            let requests = sim::read_trace(path, &tokenizer).map_err(|e| match e {
                sim::TraceError::Line { line, message } => {
                    format!("{}:{line}: {message}", path.display())
                }
                other => other.to_string(),
            })?;
            (
                format!("trace {}", path.display()),
                Requests::Trace(params.deliver(requests)),
                parameters,
            )
        }
        None => {
            let workload =
                Workload::from_name(&args.workload, overrides).map_err(|e| e.to_string())?;
            workload
                .check_memory(memory_limit, limit_source)
                .map_err(|e| e.to_string())?;
            let parameters = workload.parameters();
            (
                workload.name().to_string(),
                Requests::Workload(workload),
                parameters,
            )
        }
    };
    let total = match &source {
        Requests::Trace(requests) => requests.len(),
        Requests::Workload(workload) => workload.len(),
    };
    eprintln!(
        "simulating {total} requests ({label}) on {} replicas ({}){}",
        fleet.replicas(),
        fleet.describe(),
        if args.routers > 1 {
            format!(", {} routers of each policy side by side", args.routers)
        } else {
            String::new()
        }
    );

    // Each policy as `args.routers` routers side by side, scheduler seeds one apart.
    let instances = args.routers;
    let side_by_side = |mut routers: Vec<Box<dyn SimRouter + Send>>| -> Box<dyn SimRouter + Send> {
        match routers.len() {
            1 => routers.remove(0),
            _ => Box::new(sim::SideBySide::new(routers)),
        }
    };
    let pipeline = |name: &str, config: &LoadedConfig| {
        simulate::pipeline_routers(name, config, &options, &fleet, args.seed, instances)
            .map(|routers| {
                side_by_side(
                    routers
                        .into_iter()
                        .map(|router| Box::new(router) as Box<dyn SimRouter + Send>)
                        .collect(),
                )
            })
            .map_err(|e| e.to_string())
    };
    let mut routers: Vec<Box<dyn SimRouter + Send>> = Vec::new();
    let main_name = simulate::pipeline_name(&config.path);
    routers.push(pipeline(&main_name, &config)?);
    let mut configs = vec![config_file(&main_name, &args.common.config)?];
    let mut names = vec![(main_name.clone(), args.common.config.clone())];
    for path in &args.compare {
        let name = simulate::pipeline_name(path);
        if let Some((_, first)) = names.iter().find(|(n, _)| *n == name) {
            return Err(format!(
                "--compare {}: its pipeline would be reported as {name:?}, like {}; pipelines \
                 are named after their file, so copy one under another name",
                path.display(),
                first.display()
            ));
        }
        names.push((name, path.clone()));
    }
    for path in &args.compare {
        configs.push(config_file(&simulate::pipeline_name(path), path)?);
        let extra = read_config(path)?;
        routers.push(pipeline(&simulate::pipeline_name(path), &extra)?);
    }
    if !args.no_baselines {
        routers.push(side_by_side(
            (0..instances)
                .map(|_| Box::new(sim::RoundRobin::new()) as Box<dyn SimRouter + Send>)
                .collect(),
        ));
        routers.push(side_by_side(
            (0..instances)
                .map(|_| Box::new(sim::LeastInFlight::new()) as Box<dyn SimRouter + Send>)
                .collect(),
        ));
        let approx = simulate::approx_baseline(&config).map_err(|e| e.to_string())?;
        configs.push(sim::ConfigFile {
            pipeline: "approx-prefix-load".into(),
            path: None,
            sha256: sha256_hex(simulate::APPROX_BASELINE.as_bytes()),
        });
        routers.push(pipeline("approx-prefix-load", &approx)?);
    }

    let show_progress = std::io::stderr().is_terminal();
    let run_one =
        |router: &mut (dyn SimRouter + Send), progress: &mut dyn FnMut(usize, usize)| match &source
        {
            Requests::Trace(requests) => sim::run(requests, &fleet, router, progress),
            Requests::Workload(workload) => {
                sim::run_stream(total, workload.requests(), &fleet, router, progress)
            }
        };
    // The routers run side by side, one per core at most, and no more at once than the
    // memory limit allows for as many runs; reports keep the routers' order, and every run
    // is deterministic on its own, so the output does not depend on how many ran at once.
    let per_run = match &source {
        Requests::Workload(workload) => workload.memory_estimate().max(1),
        Requests::Trace(_) => 1,
    };
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(routers.len())
        .min(usize::try_from(memory_limit / per_run).unwrap_or(usize::MAX))
        .max(1);
    // One run at a time draws a progress bar; runs side by side each say when they are done.
    let queue: Vec<std::sync::Mutex<&mut Box<dyn SimRouter + Send>>> =
        routers.iter_mut().map(std::sync::Mutex::new).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(vec![None; queue.len()]);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(cell) = queue.get(i) else {
                    break;
                };
                let mut router = cell.lock().unwrap_or_else(|e| e.into_inner());
                let name = router.name().to_string();
                let mut progress = |finished: usize, total: usize| {
                    if !show_progress || total == 0 {
                        return;
                    }
                    if workers == 1 {
                        let filled = finished * 30 / total;
                        eprint!(
                            "\r{name:<22} [{}{}] {finished}/{total}",
                            "#".repeat(filled),
                            ".".repeat(30 - filled)
                        );
                        if finished == total {
                            eprintln!();
                        }
                    } else if finished == total {
                        eprintln!("{name:<22} {finished}/{total} done");
                    }
                };
                let report = run_one(router.as_mut(), &mut progress);
                done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(report);
            });
        }
    });
    let reports: Vec<_> = done
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect();
    println!("{}", sim::render_table(&reports));
    println!("{}", sim::render_serving_table(&reports));
    let predictions = sim::render_predictions_table(&reports);
    if !predictions.is_empty() {
        println!("{predictions}");
    }
    if let Some(dir) = &args.output {
        let run = sim::RunContext {
            command_line: std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            switchyard_version: env!("CARGO_PKG_VERSION").to_string(),
            workload: if args.trace.is_some() {
                "trace".into()
            } else {
                args.workload.clone()
            },
            trace: args.trace.as_ref().map(|p| p.display().to_string()),
            workload_parameters: parameters,
            requests: total as u64,
            fleet_file: args.fleet.as_ref().map(|p| p.display().to_string()),
            replicas: fleet.replicas(),
            profiles: fleet
                .groups
                .iter()
                .map(|g| sim::ProfileGroup {
                    replicas: g.replicas,
                    profile: g.profile_name.clone(),
                })
                .collect(),
            block_size_tokens: fleet.block_size_tokens,
            scrape_interval_ms: fleet.scrape_interval_ms,
            kv_event_delay_ms: fleet.kv_event_delay_ms,
            seed: args.seed,
            routers: args.routers,
            configs,
        };
        sim::write_reports(dir, &run, &reports)
            .map_err(|e| format!("writing reports to {}: {e}", dir.display()))?;
        eprintln!(
            "wrote {} and {}",
            dir.join("report.json").display(),
            dir.join("report.html").display()
        );
    }
    Ok(())
}

/// `switchyard config import`: writes the TOML (even a best-effort one) and fails when it is
/// not a valid pipeline.
fn config_import(
    file: &Path,
    output: Option<&Path>,
    force: bool,
    options: &switchyard::config::import::ImportOptions,
) -> Result<(), String> {
    if let Some(output) = output {
        let same = match (file.canonicalize(), output.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => file == output,
        };
        if same {
            return Err(format!(
                "--output {} is the input file; write the TOML somewhere else",
                output.display()
            ));
        }
        if output.exists() && !force {
            return Err(format!(
                "{} exists; pass --force to overwrite it",
                output.display()
            ));
        }
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let imported =
        switchyard::config::import::import(file, &text, options).map_err(|e| e.to_string())?;
    let mut toml = imported.toml;
    if !toml.ends_with('\n') {
        toml.push('\n');
    }
    match output {
        Some(path) => std::fs::write(path, &toml)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?,
        None => print!("{toml}"),
    }
    if imported.not_mapped > 0 {
        eprintln!(
            "{} item(s) not mapped; each is a \"# not mapped:\" comment in the output saying why",
            imported.not_mapped
        );
    }
    match imported.problem {
        Some(problem) => Err(format!(
            "{}: no valid switchyard pipeline could be formed: {problem}",
            file.display()
        )),
        None => Ok(()),
    }
}

/// A pipeline's config file for the report, with the digest of its bytes.
fn config_file(pipeline: &str, path: &Path) -> Result<sim::ConfigFile, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(sim::ConfigFile {
        pipeline: pipeline.to_string(),
        path: Some(path.display().to_string()),
        sha256: sha256_hex(&bytes),
    })
}

fn read_config(path: &Path) -> Result<LoadedConfig, String> {
    LoadedConfig::read(path).map_err(|e| e.to_string())
}
