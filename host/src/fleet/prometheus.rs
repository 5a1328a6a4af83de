//! Reading load facts out of a model server's Prometheus text page.
//!
//! The scanner looks at each line's start only: a line that does not begin with one of the
//! few family names in use is skipped without looking further, so a page full of histograms
//! costs little more than finding its line ends. Nothing is allocated.
//!
//! How series of one family combine: counts (waiting, running) are summed over every series
//! (several `model_name` labels, for instance); the cache usage, a ratio, takes the largest
//! series, since adding ratios of different pools means nothing. `NaN` series are ignored and
//! `+Inf` saturates. A page carrying none of the engine's load families is refused, which
//! catches an endpoint labelled with the wrong engine.

use switchyard_plugin_api::EndpointMetrics;

use super::Engine;

/// The metric names one engine uses.
#[derive(Debug)]
pub(crate) struct Families {
    /// Shared by every name below; lines not starting with it are skipped at once.
    prefix: &'static str,
    waiting: &'static str,
    running: &'static str,
    usage: &'static str,
    /// Read only when `usage` is absent from the page.
    usage_fallback: Option<&'static str>,
    /// An info family whose `block_size` and `num_gpu_blocks` labels give the cache layout.
    cache_config: Option<&'static str>,
}

const VLLM: Families = Families {
    prefix: "vllm:",
    waiting: "vllm:num_requests_waiting",
    running: "vllm:num_requests_running",
    usage: "vllm:kv_cache_usage_perc",
    usage_fallback: Some("vllm:gpu_cache_usage_perc"),
    cache_config: Some("vllm:cache_config_info"),
};

const SGLANG: Families = Families {
    prefix: "sglang:",
    waiting: "sglang:num_queue_reqs",
    running: "sglang:num_running_reqs",
    usage: "sglang:token_usage",
    usage_fallback: None,
    cache_config: None,
};

impl Engine {
    pub(crate) fn families(self) -> &'static Families {
        match self {
            Engine::Vllm => &VLLM,
            Engine::Sglang => &SGLANG,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Waiting,
    Running,
    Usage,
    UsageFallback,
    CacheConfig,
}

/// Running totals while scanning one page.
#[derive(Debug, Default)]
struct Totals {
    waiting: f64,
    running: f64,
    usage: Option<f64>,
    usage_fallback: Option<f64>,
    block_size: u32,
    num_blocks: u64,
    /// A line of a load family was seen (even one whose value is `NaN`).
    found: bool,
}

/// Reads an engine's load facts from a metrics page.
pub(crate) fn scan(page: &[u8], families: &Families) -> Result<EndpointMetrics, String> {
    let mut totals = Totals::default();
    for line in page.split(|&b| b == b'\n') {
        let line = trim_start(line);
        if !line.starts_with(families.prefix.as_bytes()) {
            continue;
        }
        let Some((family, rest)) = match_family(line, families) else {
            continue;
        };
        if family == Family::CacheConfig {
            if totals.block_size == 0 && totals.num_blocks == 0 {
                read_cache_config(rest, &mut totals);
            }
            continue;
        }
        let Some(value) = sample_value(rest) else {
            continue;
        };
        totals.found = true;
        if value.is_nan() {
            continue;
        }
        match family {
            Family::Waiting => totals.waiting += value,
            Family::Running => totals.running += value,
            Family::Usage => totals.usage = Some(totals.usage.map_or(value, |u| u.max(value))),
            Family::UsageFallback => {
                totals.usage_fallback = Some(totals.usage_fallback.map_or(value, |u| u.max(value)))
            }
            Family::CacheConfig => {}
        }
    }
    if !totals.found {
        return Err(format!(
            "the page has none of {}, {}, {}",
            families.waiting, families.running, families.usage
        ));
    }
    let usage = totals.usage.or(totals.usage_fallback).unwrap_or(0.0);
    Ok(EndpointMetrics {
        running_requests: to_count(totals.running),
        waiting_requests: to_count(totals.waiting),
        kv_cache_usage: usage.clamp(0.0, 1.0),
        cache_block_size: totals.block_size,
        cache_num_blocks: totals.num_blocks,
    })
}

/// A gauge total as a request count: negative reads as 0, huge saturates.
fn to_count(total: f64) -> u32 {
    // `as` saturates and maps NaN to 0.
    total.max(0.0).round() as u32
}

fn trim_start(mut line: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = line {
        line = rest;
    }
    line
}

/// Which family the line is a sample of, and the text after the name.
fn match_family<'a>(line: &'a [u8], families: &Families) -> Option<(Family, &'a [u8])> {
    let candidates = [
        (Family::Waiting, Some(families.waiting)),
        (Family::Running, Some(families.running)),
        (Family::Usage, Some(families.usage)),
        (Family::UsageFallback, families.usage_fallback),
        (Family::CacheConfig, families.cache_config),
    ];
    for (family, name) in candidates {
        let Some(name) = name else { continue };
        if let Some(rest) = line.strip_prefix(name.as_bytes()) {
            // The name must end here: `..._waiting_total` is another family.
            if matches!(rest.first(), Some(b'{' | b' ' | b'\t')) {
                return Some((family, rest));
            }
        }
    }
    None
}

/// The value of a sample, given the text after its name: optional labels, the value, an
/// optional timestamp. `None` when the line is malformed.
fn sample_value(rest: &[u8]) -> Option<f64> {
    let rest = if rest.first() == Some(&b'{') {
        scan_labels(rest, |_, _| {})?
    } else {
        rest
    };
    let rest = trim_start(rest);
    let end = rest
        .iter()
        .position(|b| matches!(b, b' ' | b'\t' | b'\r'))
        .unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// Walks a `{name="value",...}` block, handing each label's name and raw (still escaped)
/// value to `on_label`; returns the text after the closing brace, or `None` when malformed.
fn scan_labels(text: &[u8], mut on_label: impl FnMut(&[u8], &[u8])) -> Option<&[u8]> {
    let mut rest = text.strip_prefix(b"{")?;
    loop {
        rest = trim_start(rest);
        while let [b',', tail @ ..] = rest {
            rest = trim_start(tail);
        }
        if let [b'}', tail @ ..] = rest {
            return Some(tail);
        }
        let eq = rest.iter().position(|&b| b == b'=')?;
        let name = trim_end(&rest[..eq]);
        rest = trim_start(&rest[eq + 1..]);
        rest = rest.strip_prefix(b"\"")?;
        let mut i = 0;
        loop {
            match rest.get(i)? {
                b'\\' => i += 2,
                b'"' => break,
                _ => i += 1,
            }
        }
        on_label(name, &rest[..i]);
        rest = &rest[i + 1..];
    }
}

fn trim_end(mut text: &[u8]) -> &[u8] {
    while let [rest @ .., b' ' | b'\t'] = text {
        text = rest;
    }
    text
}

fn read_cache_config(rest: &[u8], totals: &mut Totals) {
    let mut block_size = 0u32;
    let mut num_blocks = 0u64;
    let parsed = scan_labels(rest, |name, value| {
        let number = std::str::from_utf8(value).ok();
        match name {
            b"block_size" => block_size = number.and_then(|n| n.parse().ok()).unwrap_or(0),
            b"num_gpu_blocks" => num_blocks = number.and_then(|n| n.parse().ok()).unwrap_or(0),
            _ => {}
        }
    });
    if parsed.is_some() {
        totals.block_size = block_size;
        totals.num_blocks = num_blocks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(page: &str) -> EndpointMetrics {
        scan(page.as_bytes(), Engine::Vllm.families()).expect("page scans")
    }

    const VLLM_PAGE: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:num_requests_waiting_by_reason Requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{reason="capacity"} 99.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4375
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27350",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:e2e_request_latency_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
"#;

    #[test]
    fn realistic_vllm_page() {
        let m = vllm(VLLM_PAGE);
        assert_eq!(m.running_requests, 7);
        assert_eq!(m.waiting_requests, 3);
        assert_eq!(m.kv_cache_usage, 0.4375);
        assert_eq!(m.cache_block_size, 16);
        assert_eq!(m.cache_num_blocks, 27350);
    }

    #[test]
    fn unrelated_big_families_are_skipped() {
        let mut page = String::new();
        for i in 0..20_000 {
            page.push_str(&format!(
                "vllm:request_prompt_tokens_bucket{{le=\"{i}\",model_name=\"m\"}} {i}.0\n"
            ));
        }
        page.push_str(VLLM_PAGE);
        let m = vllm(&page);
        assert_eq!((m.running_requests, m.waiting_requests), (7, 3));
    }

    #[test]
    fn series_are_summed_and_usage_takes_the_largest() {
        let m = vllm(
            "vllm:num_requests_waiting{model_name=\"a\"} 2\n\
             vllm:num_requests_waiting{model_name=\"b\"} 5\n\
             vllm:num_requests_running{model_name=\"a\"} 1e1\n\
             vllm:num_requests_running{model_name=\"b\"} 2.5E+0\n\
             vllm:kv_cache_usage_perc{model_name=\"a\"} 0.25\n\
             vllm:kv_cache_usage_perc{model_name=\"b\"} 0.5\n",
        );
        assert_eq!(m.waiting_requests, 7);
        assert_eq!(m.running_requests, 13);
        assert_eq!(m.kv_cache_usage, 0.5);
    }

    #[test]
    fn label_values_with_escapes_braces_and_commas() {
        let m = vllm(concat!(
            r#"vllm:num_requests_waiting{model_name="a \"quoted\}\" name, with comma",x="}"} 4 1712345678000"#,
            "\n",
            r#"vllm:num_requests_running{path="C:\\models\\",b="{,}"} 2"#,
            "\r\n",
        ));
        assert_eq!(m.waiting_requests, 4);
        assert_eq!(m.running_requests, 2);
    }

    #[test]
    fn gpu_cache_usage_is_the_fallback_only() {
        let old = vllm("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.75\n");
        assert_eq!(old.kv_cache_usage, 0.75);
        let both = vllm(
            "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.75\n\
             vllm:kv_cache_usage_perc{model_name=\"m\"} 0.125\n",
        );
        assert_eq!(both.kv_cache_usage, 0.125);
    }

    #[test]
    fn nan_inf_and_out_of_range_values() {
        let m = vllm(
            "vllm:num_requests_waiting{model_name=\"a\"} NaN\n\
             vllm:num_requests_waiting{model_name=\"b\"} 3\n\
             vllm:num_requests_running +Inf\n\
             vllm:kv_cache_usage_perc 1.7\n",
        );
        assert_eq!(m.waiting_requests, 3);
        assert_eq!(m.running_requests, u32::MAX);
        assert_eq!(m.kv_cache_usage, 1.0);
        let nan_usage = vllm("vllm:kv_cache_usage_perc NaN\nvllm:num_requests_waiting -2\n");
        assert_eq!(nan_usage.kv_cache_usage, 0.0);
        assert_eq!(nan_usage.waiting_requests, 0);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let m = vllm(
            "vllm:num_requests_waiting{model_name=\"unterminated} 9\n\
             vllm:num_requests_waiting{model_name=\"a\"} notanumber\n\
             vllm:num_requests_waiting{=} \n\
             vllm:num_requests_waiting 1\n\
             vllm:cache_config_info{block_size=\"None\",num_gpu_blocks=\"x\"} 1\n",
        );
        assert_eq!(m.waiting_requests, 1);
        assert_eq!((m.cache_block_size, m.cache_num_blocks), (0, 0));
    }

    #[test]
    fn a_page_without_the_families_is_refused() {
        let err = scan(b"# nothing here\nprocess_cpu_seconds_total 1\n", &VLLM).unwrap_err();
        assert!(err.contains("vllm:num_requests_waiting"), "{err}");
        // An SGLang page read with vLLM names is refused too.
        assert!(scan(b"sglang:num_queue_reqs 1\n", &VLLM).is_err());
    }

    #[test]
    fn realistic_sglang_page() {
        let page = r#"# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
sglang:num_queue_reqs_total 100
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
"#;
        let m = scan(page.as_bytes(), Engine::Sglang.families()).unwrap();
        assert_eq!(m.running_requests, 12);
        assert_eq!(m.waiting_requests, 4);
        assert_eq!(m.kv_cache_usage, 0.28);
        assert_eq!((m.cache_block_size, m.cache_num_blocks), (0, 0));
    }
}
