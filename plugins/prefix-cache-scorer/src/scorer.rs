//! The prefix-cache score of one endpoint, and of a whole candidate list at once.

use switchyard_plugin_api::PrefixCacheMatchInfo;

use crate::config::ScorerConfig;

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

/// Score of one endpoint in `[0, 1]`.
///
/// `(1 - w) * matched fraction + w * min(1, matched tokens / scale)^2`, where `w` is
/// `matchLengthWeight`. An absent attribute or an empty prompt (`total_blocks == 0`) scores 0.
/// A match larger than the prompt counts as the whole prompt, so the result never exceeds 1;
/// for a validated config it is never NaN.
#[inline]
pub fn score(cfg: &ScorerConfig, info: Option<MatchInfo>) -> f64 {
    let Some(info) = info else { return 0.0 };
    if info.total_blocks == 0 {
        return 0.0;
    }
    // No match is 0 (0 / total is 0), without dividing.
    let ratio = if info.match_blocks == 0 {
        0.0
    } else {
        (info.match_blocks as f64 / info.total_blocks as f64).min(1.0)
    };
    let w = cfg.match_length_weight;
    if w <= 0.0 {
        return ratio;
    }
    let length = if info.block_size_tokens > 0 && cfg.match_length_scale_tokens > 0 {
        let matched_tokens = info.match_blocks as f64 * info.block_size_tokens as f64;
        let saturation = (matched_tokens / cfg.match_length_scale_tokens as f64).min(1.0);
        saturation * saturation
    } else {
        0.0
    };
    w * length + (1.0 - w) * ratio
}

/// What [`score_into`] saw, for one aggregated log line per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScoreSummary {
    /// Endpoints without a match attribute (scored 0).
    pub missing: usize,
    /// Endpoints whose attribute describes an empty prompt (scored 0).
    pub empty_prompt: usize,
}

/// Scores every endpoint into `out`, in input order. Entries of `out` beyond the inputs are
/// left untouched; inputs beyond `out` are ignored.
pub fn score_into<I>(cfg: &ScorerConfig, infos: I, out: &mut [f64]) -> ScoreSummary
where
    I: IntoIterator<Item = Option<MatchInfo>>,
{
    let mut summary = ScoreSummary::default();
    for (slot, info) in out.iter_mut().zip(infos) {
        match info {
            None => summary.missing += 1,
            Some(i) if i.total_blocks == 0 => summary.empty_prompt += 1,
            Some(_) => {}
        }
        *slot = score(cfg, info);
    }
    summary
}

#[cfg(test)]
mod tests;
