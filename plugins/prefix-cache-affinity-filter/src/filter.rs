//! The affinity decision for one request: which candidates stay, and the numbers behind it.
//!
//! Endpoints holding at least `affinityThreshold` of the prompt are *sticky*; the filter keeps
//! only those unless a load gate finds them too busy compared with the best other endpoint.

use std::fmt;

use rand::Rng;

use switchyard_plugin_api::PrefixCacheMatchInfo;

use crate::config::{AffinityConfig, PenaltyMode, TtftSource};

/// How much of the request's prompt an endpoint is believed to hold in its prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MatchInfo {
    /// Leading prompt blocks found on the endpoint.
    pub match_blocks: u64,
    /// Blocks in the request's prompt.
    pub total_blocks: u64,
    /// Tokens per block.
    pub block_size_tokens: u64,
}

impl From<PrefixCacheMatchInfo> for MatchInfo {
    fn from(info: PrefixCacheMatchInfo) -> Self {
        MatchInfo {
            match_blocks: info.match_blocks,
            total_blocks: info.total_blocks,
            block_size_tokens: info.block_size_tokens,
        }
    }
}

impl MatchInfo {
    /// Matched fraction of the prompt; 0 for an empty prompt.
    #[inline]
    pub fn fraction(&self) -> f64 {
        // No match is 0 whatever the total (0 / total is 0), without dividing.
        if self.total_blocks == 0 || self.match_blocks == 0 {
            0.0
        } else {
            self.match_blocks as f64 / self.total_blocks as f64
        }
    }

    /// Matched prompt tokens, or `None` when the block size is unknown (0).
    pub fn matched_tokens(&self) -> Option<u64> {
        (self.block_size_tokens > 0)
            .then(|| self.match_blocks.saturating_mul(self.block_size_tokens))
    }
}

/// What the filter knows about one candidate; `None` means the attribute is absent.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EndpointFacts {
    pub prefix: Option<MatchInfo>,
    /// Predicted TTFT in ms (read with `ttftSource: latencyPredictor`).
    pub ttft_ms: Option<f64>,
    /// Tokens in flight on the endpoint (read with `ttftSource: prefillThroughput`).
    pub in_flight_tokens: Option<i64>,
}

/// Why every candidate was kept without a gate decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassReason {
    /// Zero or one candidate: nothing to choose between.
    SingleEndpoint,
    /// `affinityThreshold <= 0`.
    Disabled,
    /// The exploration draw fell below `explorationProbability`.
    Explored,
    /// No candidate reaches `affinityThreshold`.
    NoSticky,
    /// Every candidate reaches `affinityThreshold`.
    AllSticky,
}

/// A TTFT comparison between the best sticky and the best non-sticky endpoint. An absent
/// prediction is `f64::INFINITY`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftGap {
    pub sticky_ms: f64,
    pub non_sticky_ms: f64,
    /// `maxTTFTPenaltyMs`.
    pub limit_ms: f64,
}

impl TtftGap {
    /// `sticky_ms - non_sticky_ms`, with two absent predictions counting as no gap.
    pub fn gap_ms(&self) -> f64 {
        if self.sticky_ms == self.non_sticky_ms {
            0.0
        } else {
            self.sticky_ms - self.non_sticky_ms
        }
    }

    pub fn exceeded(&self) -> bool {
        self.gap_ms() > self.limit_ms
    }
}

/// The test a gate ran, with its inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GateTest {
    /// `penaltyMode: static`: the TTFT gap against `maxTTFTPenaltyMs`.
    Ttft(TtftGap),
    /// `penaltyMode: matchedTokens`: the in-flight token gap against the matched tokens of the
    /// best sticky endpoint, plus the TTFT ceiling when `maxTTFTPenaltyMs > 0`.
    MatchedTokens {
        gap_tokens: i64,
        /// `None` when the best sticky endpoint has no usable match info; the token test is
        /// then skipped.
        matched_tokens: Option<u64>,
        ceiling: Option<TtftGap>,
    },
}

/// A gate evaluation: which endpoints were compared and the outcome's inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateReading {
    /// Input index of the best sticky endpoint (first in input order on ties).
    pub best_sticky: usize,
    /// Input index of the best non-sticky endpoint (first in input order on ties).
    pub best_non_sticky: usize,
    pub test: GateTest,
}

impl GateReading {
    /// Whether the token gap exceeds the matched tokens (`matchedTokens` mode only).
    pub fn break_even_exceeded(&self) -> bool {
        match self.test {
            GateTest::MatchedTokens {
                gap_tokens,
                matched_tokens: Some(matched),
                ..
            } => i128::from(gap_tokens) > i128::from(matched),
            _ => false,
        }
    }

    /// Whether the TTFT limit (static gate or ceiling) is exceeded.
    pub fn ttft_exceeded(&self) -> bool {
        match self.test {
            GateTest::Ttft(gap) => gap.exceeded(),
            GateTest::MatchedTokens { ceiling, .. } => ceiling.is_some_and(|c| c.exceeded()),
        }
    }

    /// Whether the gate releases stickiness.
    pub fn releases(&self) -> bool {
        self.break_even_exceeded() || self.ttft_exceeded()
    }
}

/// The filter's decision for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FilterOutcome {
    /// Every candidate kept; no gate ran.
    PassAll(PassReason),
    /// Only the sticky candidates kept; `gate` is the held gate's reading, if one ran.
    Narrowed {
        sticky: usize,
        gate: Option<GateReading>,
    },
    /// Every candidate kept because the gate found the sticky ones too loaded.
    Released(GateReading),
}

/// A uniform draw in `[0, 1)` for the `exploration_draw` argument of [`filter`].
pub fn exploration_draw<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    rng.random::<f64>()
}

/// Decides which candidates to keep, writing `keep[i]` for `endpoints[i]`.
///
/// `keep` should have one entry per endpoint; only the common prefix of the two slices is
/// considered. `exploration_draw` is a uniform draw in `[0, 1)`; with
/// `explorationProbability` 0 any value >= 0 (e.g. 1.0) avoids drawing. Expects a validated
/// config.
/// Never keeps zero endpoints.
pub fn filter(
    cfg: &AffinityConfig,
    endpoints: &[EndpointFacts],
    exploration_draw: f64,
    keep: &mut [bool],
) -> FilterOutcome {
    filter_with(
        cfg,
        endpoints.len(),
        |i| endpoints[i],
        exploration_draw,
        keep,
    )
}

/// [`filter`] over `count` endpoints whose facts `facts(i)` reads on demand, so that a caller
/// holding them elsewhere needs no intermediate list. `facts` is called only with
/// `i < count.min(keep.len())`, possibly more than once per endpoint.
pub fn filter_with<F>(
    cfg: &AffinityConfig,
    count: usize,
    facts: F,
    exploration_draw: f64,
    keep: &mut [bool],
) -> FilterOutcome
where
    F: Fn(usize) -> EndpointFacts,
{
    filter_with_prefix(
        cfg,
        count,
        |i| facts(i).prefix,
        &facts,
        exploration_draw,
        keep,
    )
}

/// [`filter_with`] with a second reader, `prefix(i)`, that must return `facts(i).prefix`: the
/// pass that finds the sticky endpoints reads only that, so a caller can spare reading the rest
/// of every endpoint's facts.
pub fn filter_with_prefix<P, F>(
    cfg: &AffinityConfig,
    count: usize,
    prefix: P,
    facts: F,
    exploration_draw: f64,
    keep: &mut [bool],
) -> FilterOutcome
where
    P: Fn(usize) -> Option<MatchInfo>,
    F: Fn(usize) -> EndpointFacts,
{
    let n = count.min(keep.len());
    let keep = &mut keep[..n];
    keep.fill(true);

    if n <= 1 {
        return FilterOutcome::PassAll(PassReason::SingleEndpoint);
    }
    if !cfg.enabled() {
        return FilterOutcome::PassAll(PassReason::Disabled);
    }
    if exploration_draw < cfg.exploration_probability {
        return FilterOutcome::PassAll(PassReason::Explored);
    }

    let mut sticky = 0;
    for (i, k) in keep.iter_mut().enumerate() {
        *k = prefix(i).map_or(0.0, |p| p.fraction()) >= cfg.affinity_threshold;
        sticky += usize::from(*k);
    }
    if sticky == 0 {
        keep.fill(true);
        return FilterOutcome::PassAll(PassReason::NoSticky);
    }
    if sticky == n {
        return FilterOutcome::PassAll(PassReason::AllSticky);
    }

    let gate = match cfg.penalty_mode {
        PenaltyMode::MatchedTokens => matched_tokens_gate(cfg, &facts, keep),
        _ if cfg.max_ttft_penalty_ms > 0.0 => ttft_gate(cfg, &facts, keep),
        _ => None,
    };
    match gate {
        Some(reading) if reading.releases() => {
            keep.fill(true);
            FilterOutcome::Released(reading)
        }
        gate => FilterOutcome::Narrowed { sticky, gate },
    }
}

fn in_flight(e: &EndpointFacts) -> i64 {
    e.in_flight_tokens.unwrap_or(0).max(0)
}

fn throughput_ttft_ms(cfg: &AffinityConfig, tokens: i64) -> f64 {
    if cfg.peak_prefill_throughput > 0.0 {
        tokens as f64 / cfg.peak_prefill_throughput * 1000.0
    } else {
        0.0
    }
}

fn ttft_ms(cfg: &AffinityConfig, e: &EndpointFacts) -> f64 {
    match cfg.ttft_source {
        TtftSource::LatencyPredictor => e.ttft_ms.filter(|v| !v.is_nan()).unwrap_or(f64::INFINITY),
        _ => throughput_ttft_ms(cfg, in_flight(e)),
    }
}

/// The first endpoint of one side (`keep[i] == sticky`) with the smallest key.
fn best_by<K: PartialOrd + Copy>(
    facts: &impl Fn(usize) -> EndpointFacts,
    keep: &[bool],
    sticky: bool,
    key: impl Fn(&EndpointFacts) -> K,
) -> Option<(usize, K)> {
    let mut best: Option<(usize, K)> = None;
    for (i, &k) in keep.iter().enumerate() {
        if k == sticky {
            let v = key(&facts(i));
            if best.is_none_or(|(_, b)| v < b) {
                best = Some((i, v));
            }
        }
    }
    best
}

fn ttft_gate(
    cfg: &AffinityConfig,
    facts: &impl Fn(usize) -> EndpointFacts,
    keep: &[bool],
) -> Option<GateReading> {
    let (best_sticky, sticky_ms) = best_by(facts, keep, true, |e| ttft_ms(cfg, e))?;
    let (best_non_sticky, non_sticky_ms) = best_by(facts, keep, false, |e| ttft_ms(cfg, e))?;
    Some(GateReading {
        best_sticky,
        best_non_sticky,
        test: GateTest::Ttft(TtftGap {
            sticky_ms,
            non_sticky_ms,
            limit_ms: cfg.max_ttft_penalty_ms,
        }),
    })
}

fn matched_tokens_gate(
    cfg: &AffinityConfig,
    facts: &impl Fn(usize) -> EndpointFacts,
    keep: &[bool],
) -> Option<GateReading> {
    let (best_sticky, sticky_tokens) = best_by(facts, keep, true, in_flight)?;
    let (best_non_sticky, non_sticky_tokens) = best_by(facts, keep, false, in_flight)?;
    let ceiling = (cfg.max_ttft_penalty_ms > 0.0).then(|| TtftGap {
        sticky_ms: throughput_ttft_ms(cfg, sticky_tokens),
        non_sticky_ms: throughput_ttft_ms(cfg, non_sticky_tokens),
        limit_ms: cfg.max_ttft_penalty_ms,
    });
    Some(GateReading {
        best_sticky,
        best_non_sticky,
        test: GateTest::MatchedTokens {
            gap_tokens: sticky_tokens.saturating_sub(non_sticky_tokens),
            matched_tokens: facts(best_sticky).prefix.and_then(|p| p.matched_tokens()),
            ceiling,
        },
    })
}

/// Milliseconds for humans: at most one decimal, no trailing `.0`.
struct Ms(f64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Adding 0.0 turns -0.0 into 0.0.
        let rounded = (self.0 * 10.0).round() / 10.0 + 0.0;
        if rounded.fract() == 0.0 {
            write!(f, "{rounded:.0} ms")
        } else {
            write!(f, "{rounded:.1} ms")
        }
    }
}

impl fmt::Display for TtftGap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.exceeded() { ">" } else { "<=" };
        match (self.sticky_ms.is_finite(), self.non_sticky_ms.is_finite()) {
            (true, true) => write!(
                f,
                "TTFT gap {} {op} limit {} (sticky {}, non-sticky {})",
                Ms(self.gap_ms()),
                Ms(self.limit_ms),
                Ms(self.sticky_ms),
                Ms(self.non_sticky_ms)
            ),
            (false, true) => write!(
                f,
                "no TTFT prediction for the best sticky endpoint (non-sticky {})",
                Ms(self.non_sticky_ms)
            ),
            (true, false) => write!(
                f,
                "no TTFT prediction for any non-sticky endpoint (sticky {})",
                Ms(self.sticky_ms)
            ),
            (false, false) => f.write_str("no TTFT prediction on either side"),
        }
    }
}

impl fmt::Display for GateReading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.releases() { "released" } else { "held" };
        write!(f, "TTFT gate {verdict}: ")?;
        match self.test {
            GateTest::Ttft(gap) => write!(f, "{gap}"),
            GateTest::MatchedTokens {
                gap_tokens,
                matched_tokens,
                ceiling,
            } => {
                match matched_tokens {
                    Some(m) => {
                        let op = if self.break_even_exceeded() {
                            ">"
                        } else {
                            "<="
                        };
                        write!(f, "gap {gap_tokens} tokens {op} matched {m}")?;
                    }
                    None => write!(f, "gap {gap_tokens} tokens, matched tokens unknown")?,
                }
                match ceiling {
                    Some(c) if c.exceeded() => write!(f, "; ceiling: {c}"),
                    _ => Ok(()),
                }
            }
        }
    }
}

impl fmt::Display for PassReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::SingleEndpoint => "kept all: at most one candidate",
            Self::Disabled => "kept all: filter disabled (affinityThreshold <= 0)",
            Self::Explored => "kept all: exploration",
            Self::NoSticky => "kept all: no endpoint reaches affinityThreshold",
            Self::AllSticky => "kept all: every endpoint reaches affinityThreshold",
        })
    }
}

impl fmt::Display for FilterOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PassAll(reason) => write!(f, "{reason}"),
            Self::Narrowed { sticky, gate } => {
                let plural = if *sticky == 1 { "" } else { "s" };
                write!(f, "narrowed to {sticky} sticky endpoint{plural}")?;
                match gate {
                    Some(g) => write!(f, "; {g}"),
                    None => Ok(()),
                }
            }
            Self::Released(reading) => write!(f, "{reading}"),
        }
    }
}

#[cfg(test)]
mod tests;
