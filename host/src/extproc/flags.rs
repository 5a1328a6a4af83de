//! `switchyard ext-proc`'s command line: the reference endpoint picker's flag names and
//! defaults, Go-style durations and booleans, and a clear refusal of the reference flags
//! switchyard does not support.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::config::DEFAULT_CONFIG;

/// The flags of `switchyard ext-proc`.
#[derive(Args, Debug, Clone)]
pub struct ExtProcArgs {
    /// The pipeline configuration (TOML; `switchyard config import` turns the reference's
    /// YAML into it).
    #[arg(long = "config-file", visible_alias = "config", short = 'c', default_value = DEFAULT_CONFIG)]
    pub config_file: PathBuf,
    /// Port of the ext_proc gRPC service.
    #[arg(long, default_value_t = 9002)]
    pub grpc_port: u16,
    /// Port of the grpc.health.v1 service.
    #[arg(long, default_value_t = 9003)]
    pub grpc_health_port: u16,
    /// Port of /metrics, /health and /ready.
    #[arg(long, default_value_t = 9090)]
    pub metrics_port: u16,
    /// Port of the admin API on loopback (off when omitted).
    #[arg(long)]
    pub admin_port: Option<u16>,
    /// Address every listener binds (the ports come from the flags above).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: std::net::IpAddr,
    /// TLS on the ext_proc port: a self-signed certificate unless --cert-path names one.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value_t = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub secure_serving: bool,
    /// A directory holding tls.crt and tls.key (PEM) for --secure-serving.
    #[arg(long)]
    pub cert_path: Option<PathBuf>,
    /// Allow plugin types of stability alpha.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_experimental_plugins: bool,
    /// Put each candidate's weighted total in `envoy.lb` metadata.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub emit_endpoint_scores: bool,
    /// OpenTelemetry tracing: not supported; only `--tracing=false` is accepted.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub tracing: bool,
    /// How often each endpoint's /metrics is scraped (Go duration, e.g. 50ms); overrides
    /// `[fleet] scrape_interval_ms`.
    #[arg(long, value_parser = go_duration)]
    pub refresh_metrics_interval: Option<Duration>,
    /// Metrics older than this mark an endpoint stale; overrides `[fleet] stale_after_ms`.
    #[arg(long, value_parser = go_duration)]
    pub metrics_staleness_threshold: Option<Duration>,
    /// On SIGTERM/SIGINT, how long open streams may take to finish.
    #[arg(long, value_parser = go_duration, default_value = "30s")]
    pub drain_timeout: Duration,
    /// Largest gRPC message accepted, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub grpc_max_recv_msg_size: usize,
    /// Largest gRPC message sent, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub grpc_max_send_msg_size: usize,
    /// HTTP/2 ping sent on an ext_proc connection quiet for this long (Go duration; 0
    /// turns the pings off).
    #[arg(long, value_parser = go_duration, default_value = "30s")]
    pub grpc_keepalive_interval: Duration,
    /// A connection whose ping is not answered within this long is closed.
    #[arg(long, value_parser = go_duration, default_value = "20s")]
    pub grpc_keepalive_timeout: Duration,
    /// Streams one ext_proc connection may have open at once (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, default_value_t = 10_000)]
    pub grpc_max_concurrent_streams: u32,
    /// Open ext_proc connections; a further one waits, not accepted, until one closes.
    #[arg(long, default_value_t = 10_000)]
    pub grpc_max_connections: usize,
    /// A connection is asked to go away (GOAWAY) after this long, its open streams left to
    /// finish; 0 keeps connections for as long as the peer does.
    #[arg(long, value_parser = go_duration, default_value = "0")]
    pub grpc_max_connection_age: Duration,
    /// A connection with no stream open for this long is closed; 0 never closes one. The
    /// default outlasts the one-hour idle timeout Envoy gives its own upstream connections.
    #[arg(long, value_parser = go_duration, default_value = "2h")]
    pub grpc_idle_timeout: Duration,
    /// Streams the peer may reset before the picker has taken them up, at any one time on a
    /// connection; beyond it the connection is closed (GOAWAY ENHANCE_YOUR_CALM), which
    /// stops rapid-reset floods.
    #[arg(long, default_value_t = 4096)]
    pub grpc_max_pending_reset_streams: usize,
    /// Streams the picker may reset over a connection's life because the peer broke the
    /// protocol on them; beyond it the connection is closed (GOAWAY ENHANCE_YOUR_CALM).
    #[arg(long, default_value_t = 4096)]
    pub grpc_max_error_reset_streams: usize,
    /// Accepted for the reference's launch lines; the endpoints come from the config.
    #[arg(long)]
    pub pool_name: Option<String>,
    /// Accepted for the reference's launch lines; the endpoints come from the config.
    #[arg(long)]
    pub pool_namespace: Option<String>,
    /// Log verbosity: 0 warnings, 1 info, 2-3 debug, 4 and more trace (`RUST_LOG` wins).
    #[arg(short = 'v', long = "v", default_value_t = 1)]
    pub verbosity: u8,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    pub log_format: String,
    /// A directory searched first for plugin libraries named by bare name (repeatable).
    #[arg(long = "plugin-dir")]
    pub plugin_dirs: Vec<PathBuf>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Control socket for restarts without a gap: take the listening sockets over from the
    /// process offering them at this path (it then drains and exits; bind afresh when none
    /// does), and offer them there to the next one (see docs/operations.md).
    #[arg(long, value_name = "PATH")]
    pub handover: Option<PathBuf>,
}

impl ExtProcArgs {
    /// The log level `-v` asks for.
    pub fn log_level(&self) -> &'static str {
        match self.verbosity {
            0 => "warn",
            1 => "info",
            2 | 3 => "debug",
            _ => "trace",
        }
    }

    /// Checks what clap cannot: values switchyard refuses.
    pub fn check(&self) -> Result<(), String> {
        if self.tracing {
            return Err(
                "--tracing: OpenTelemetry tracing is not supported by switchyard; \
                        pass --tracing=false or leave the flag out (decisions are explained \
                        by the admin API's /decisions instead)"
                    .into(),
            );
        }
        if self.log_format != "text" && self.log_format != "json" {
            return Err(format!(
                "--log-format must be text or json (got '{}')",
                self.log_format
            ));
        }
        if self.cert_path.is_some() && !self.secure_serving {
            return Err("--cert-path is given but --secure-serving=false: drop one".into());
        }
        if self.refresh_metrics_interval == Some(Duration::ZERO) {
            return Err(
                "--refresh-metrics-interval must be above 0 (scraping is turned off with \
                 [fleet] scrape_interval_ms = 0)"
                    .into(),
            );
        }
        for (flag, value) in [
            (
                "--grpc-max-concurrent-streams",
                self.grpc_max_concurrent_streams as usize,
            ),
            ("--grpc-max-connections", self.grpc_max_connections),
            (
                "--grpc-max-pending-reset-streams",
                self.grpc_max_pending_reset_streams,
            ),
            (
                "--grpc-max-error-reset-streams",
                self.grpc_max_error_reset_streams,
            ),
        ] {
            if value == 0 {
                return Err(format!("{flag} must be above 0"));
            }
        }
        if self.grpc_keepalive_interval > Duration::ZERO
            && self.grpc_keepalive_timeout == Duration::ZERO
        {
            return Err("--grpc-keepalive-timeout must be above 0 while pings are on".into());
        }
        Ok(())
    }
}

/// Reference flags switchyard does not support, with what to do instead.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("config-text", "write the configuration to a file and pass --config-file (TOML; `switchyard config import` converts the reference's YAML)"),
    ("ha-enable-leader-election", "run one picker per pool; leader election needs the Kubernetes API, which switchyard does not watch"),
    ("endpoint-selector", "list the endpoints in a discovery file ([fleet] discovery_file) or [[endpoints]]"),
    ("endpoint-target-ports", "list the endpoints with their ports in a discovery file ([fleet] discovery_file) or [[endpoints]]"),
    ("kubeconfig", "switchyard does not talk to the Kubernetes API; use a discovery file ([fleet] discovery_file)"),
    ("enable-pprof", "profile with perf or valgrind; there is no pprof endpoint"),
    ("metrics-endpoint-auth", "keep the metrics port on a trusted network (--bind-address)"),
    ("tls-min-version", "switchyard's TLS (rustls) speaks TLS 1.2 and 1.3 only"),
    ("grpc-enable-compression", "gRPC compression is not offered"),
    ("model-server-metrics-port", "give each endpoint's address the port that serves /metrics"),
    ("model-server-metrics-path", "switchyard scrapes /metrics"),
    ("model-server-metrics-scheme", "switchyard scrapes over plain HTTP"),
    ("model-server-metrics-https-insecure-skip-verify", "switchyard scrapes over plain HTTP"),
    ("total-queued-requests-metric", "the metric names follow each endpoint's engine label (docs/config.md)"),
    ("total-running-requests-metric", "the metric names follow each endpoint's engine label (docs/config.md)"),
    ("kv-cache-usage-percentage-metric", "the metric names follow each endpoint's engine label (docs/config.md)"),
    ("lora-info-metric", "LoRA adapters are not tracked"),
    ("cache-info-metric", "the metric names follow each endpoint's engine label (docs/config.md)"),
    ("zap-log-level", "use -v and RUST_LOG"),
    ("zap-encoder", "use --log-format text|json"),
    ("zap-devel", "use -v and --log-format"),
    ("zap-stacktrace-level", "use RUST_LOG"),
    ("zap-time-encoding", "use --log-format json for machine-readable times"),
];

/// Refuses a reference flag switchyard does not support, naming it and the alternative.
pub fn refuse_unsupported(args: &[OsString]) -> Result<(), String> {
    for arg in args {
        let Some(text) = arg.to_str() else { continue };
        let name = text
            .strip_prefix("--")
            .or_else(|| text.strip_prefix('-').filter(|rest| rest.len() > 1))
            .map(|rest| rest.split('=').next().unwrap_or(rest));
        let Some(name) = name else { continue };
        if let Some((_, instead)) = UNSUPPORTED.iter().find(|(flag, _)| *flag == name) {
            return Err(format!(
                "--{name} is a flag of the reference endpoint picker that switchyard does not \
                 support: {instead}"
            ));
        }
    }
    Ok(())
}

/// A Go duration: a sequence of numbers with units (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`),
/// such as `50ms`, `1.5s` or `1m30s`; `0` alone is zero.
pub fn go_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("'{text}' is not a duration like 50ms, 2s or 1m30s");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0.0f64;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(go_duration("0"), Ok(Duration::ZERO));
        assert_eq!(go_duration("250us"), Ok(Duration::from_micros(250)));
        for bad in ["", "5", "ms", "5 s", "5d", "-1s", "1..2s"] {
            assert!(go_duration(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn connection_limits_must_be_above_zero() {
        use clap::Parser;
        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            args: ExtProcArgs,
        }
        let parse = |extra: &[&str]| {
            let mut line = vec!["ext-proc"];
            line.extend_from_slice(extra);
            Command::try_parse_from(line).expect("parses").args
        };
        let defaults = parse(&[]);
        assert_eq!(defaults.check(), Ok(()));
        assert_eq!(defaults.grpc_keepalive_interval, Duration::from_secs(30));
        assert_eq!(defaults.grpc_max_connection_age, Duration::ZERO);
        assert_eq!(defaults.grpc_idle_timeout, Duration::from_secs(7200));
        for flag in [
            "--grpc-max-connections=0",
            "--grpc-max-concurrent-streams=0",
            "--grpc-max-pending-reset-streams=0",
            "--grpc-max-error-reset-streams=0",
            "--grpc-keepalive-timeout=0",
        ] {
            let name = flag.split('=').next().unwrap_or(flag);
            let error = parse(&[flag]).check().expect_err(flag);
            assert!(error.contains(name), "{flag}: {error}");
        }
        assert_eq!(
            parse(&["--grpc-keepalive-interval=0", "--grpc-keepalive-timeout=0"]).check(),
            Ok(())
        );
    }

    #[test]
    fn unsupported_flags_are_named_with_what_to_do() {
        let args: Vec<OsString> = ["--grpc-port", "9002", "--ha-enable-leader-election"]
            .iter()
            .map(OsString::from)
            .collect();
        let message = refuse_unsupported(&args).unwrap_err();
        assert!(message.contains("--ha-enable-leader-election"), "{message}");
        assert!(message.contains("does not support"), "{message}");
        let fine: Vec<OsString> = ["--secure-serving=false", "-v=1", "--pool-name", "x"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(refuse_unsupported(&fine), Ok(()));
        let with_value = [OsString::from("--config-text=plugins: []")];
        assert!(refuse_unsupported(&with_value).is_err());
    }
}
