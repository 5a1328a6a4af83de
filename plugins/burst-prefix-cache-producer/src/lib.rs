//! burst-prefix-cache-producer: co-locates requests of one short window that share a prompt
//! prefix, so the prefix is prefilled on one replica instead of on every replica the load
//! balancer would spread them over.
//!
//! The host gathers each window into a batch (declared through [`BatchPolicy`]) and calls
//! [`produce`](Producer::produce) once per sealed batch; this module hashes the batch, runs
//! [`assign::assign`] and reports the placement as a full prefix match on the chosen replica.

pub mod assign;
pub mod burst_plan;
pub mod config;
pub mod fair_share;
pub mod other_traffic;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use switchyard_plugin_api::keys::{
    BLOCK_CONTENT_HASHES, IN_FLIGHT_LOAD, PREFIX_CACHE_MATCH_INFO, TOKENIZED_PROMPT, TOKEN_PRODUCER,
};
use switchyard_plugin_api::sdk::{Declare, Instance, Param, PluginFactory, ProduceBatch, Producer};
use switchyard_plugin_api::{
    AttrValue, BatchPolicy, EndpointView, PluginError, PluginKind, PrefixCacheMatchInfo,
    ProduceItem, Stability,
};
use switchyard_prefix_hashing::published::ContentHashes;
use switchyard_prefix_hashing::{block_count, hash_prompt_into, prompt_seed};

use assign::{assign, Replica};
use burst_plan::{BurstPlan, GroupKey, WindowGroup};
use config::{Assignment, BurstConfig};
use fair_share::assign_fair_share;
use other_traffic::OtherTraffic;

/// The plan, even when a call that held it panicked: every step leaves it usable, though a
/// panic inside a rebalance can leave one group's parts adding up to less than 1 (its members
/// then follow the parts it has).
fn lock(plan: &Mutex<BurstPlan>) -> MutexGuard<'_, BurstPlan> {
    plan.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Position of `PrefixCacheMatchInfo` in the declared produced keys.
const PRODUCES_MATCH_INFO: usize = 0;

/// Position of the cache estimates (`cachedMatchProducerName`) in the declared consumed keys.
const CONSUMES_CACHED_MATCH: usize = 1;

/// Position of the in-flight counts (`inFlightProducerName`) in the declared consumed keys:
/// after the cache estimates when those are consumed too.
fn consumes_in_flight(config: &BurstConfig) -> usize {
    CONSUMES_CACHED_MATCH + usize::from(config.cached_match_producer().is_some())
}

/// Position of the cache estimator's published block content hashes in the declared consumed
/// keys: last, and only with a cache estimator.
fn consumes_content_hashes(config: &BurstConfig) -> usize {
    consumes_in_flight(config) + usize::from(config.in_flight_producer().is_some())
}

/// Margin on top of the window for one produce call, as in the reference.
const TIMEOUT_MARGIN_MS: u64 = 300;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "burst-prefix-cache-producer",
    kind: PluginKind::Producer,
    stability: Stability::Alpha,
    description: "Steers requests of one batch window that share a prompt prefix onto the same \
                  replica, reported as a full prefix-cache match there.",
    parameters: &[
        Param {
            name: "windowDurationMs",
            value_type: "integer",
            default: "100",
            range: "1..=10000",
            description: "Length of a batch window in milliseconds, from its first request.",
        },
        Param {
            name: "maxPerReplica",
            value_type: "integer",
            default: "-1",
            range: "-1 | >= 1",
            description: "Most members of one group placed on one replica; -1 puts a whole \
                          group on one replica.",
        },
        Param {
            name: "blockSizeTokens",
            value_type: "integer",
            default: "64",
            range: ">= 1",
            description: "Tokens per hashed prefix block.",
        },
        Param {
            name: "maxPrefixTokensToMatch",
            value_type: "integer",
            default: "0",
            range: "0 | >= blockSizeTokens",
            description: "Prefix tokens hashed per prompt, in whole blocks; 0 hashes up to \
                          2048 blocks.",
        },
        Param {
            name: "minColocateBlocks",
            value_type: "integer",
            default: "0",
            range: ">= 0",
            description: "Leading blocks distinct prompts must share to be co-located; 0 \
                          co-locates identical prompts only.",
        },
        Param {
            name: "maxBatchSize",
            value_type: "integer",
            default: "1000",
            range: "-1 | >= 1",
            description: "Most requests one window may hold; -1 means no limit.",
        },
        Param {
            name: "balanceBy",
            value_type: "string",
            default: "\"requests\"",
            range: "\"requests\" | \"tokens\"",
            description: "What the fair share of a batch counts: requests, or prefix blocks \
                          still to prefill.",
        },
        Param {
            name: "assignment",
            value_type: "string",
            default: "\"reference\"",
            range: "\"reference\" | \"fairShare\"",
            description: "How a batch is placed: the reference's greedy placement, or \
                          fairShare (switchyard's): every request placed, groups laid end to \
                          end and cut into equal shares over the replicas' carried load.",
        },
        Param {
            name: "windowQuietMs",
            value_type: "integer",
            default: "0",
            range: "0..=windowDurationMs",
            description: "Switchyard's: seal the window once no request has joined it for \
                          this long, still within windowDurationMs; 0 keeps the fixed window.",
        },
        Param {
            name: "cachedMatchProducerName",
            value_type: "string",
            default: "\"\"",
            range: "empty | a producer of PrefixCacheMatchInfo",
            description: "Switchyard's: a producer of cache estimates (such as \
                          approx-prefix-cache-producer); a request no other request of the \
                          window shares, already cached in part on a candidate, gets no \
                          affinity here and is left to the scorers. Empty: none.",
        },
        Param {
            name: "inFlightProducerName",
            value_type: "string",
            default: "\"\"",
            range: "empty | a producer of InFlightLoad",
            description: "Switchyard's: a producer of in-flight counts (such as \
                          inflight-load-producer); a replica's carried load is then the requests \
                          in flight to it plus the least excess of its reported running requests \
                          over them seen in the last 2 to 4 s. Empty: the reported running \
                          requests only.",
        },
        Param {
            name: "groupMemoryMs",
            value_type: "integer",
            default: "2000",
            range: "0..=600000",
            description: "Switchyard's, with fairShare: how long a placed prompt group is \
                          remembered after its last request, so later windows continue one \
                          plan for the whole burst; 0 places every window on its own.",
        },
    ],
    create,
};

fn create(instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config = BurstConfig::parse(parameters)?;
    let plan = config
        .group_memory()
        .map(|ms| Mutex::new(BurstPlan::new(ms, config.window_ms())));
    Ok(Instance::producer(BurstProducer {
        name: instance_name.to_owned(),
        config,
        plan,
        other_traffic: Mutex::new(OtherTraffic::default()),
    }))
}

/// One configured instance. Its only state between batches is the plan of recent bursts
/// (`fairShare` with `groupMemoryMs`).
struct BurstProducer {
    name: String,
    config: BurstConfig,
    plan: Option<Mutex<BurstPlan>>,
    other_traffic: Mutex<OtherTraffic>,
}

impl Producer for BurstProducer {
    fn declare(&self) -> Declare {
        let window_ms = self.config.window_ms();
        let mut declared = Declare::default()
            .produces(PREFIX_CACHE_MATCH_INFO, &self.name)
            .requires(TOKENIZED_PROMPT, TOKEN_PRODUCER);
        if let Some(producer) = self.config.cached_match_producer() {
            declared = declared.requires(PREFIX_CACHE_MATCH_INFO, producer);
        }
        if let Some(producer) = self.config.in_flight_producer() {
            declared = declared.requires(IN_FLIGHT_LOAD, producer);
        }
        if let Some(producer) = self.config.cached_match_producer() {
            declared = declared.optionally(BLOCK_CONTENT_HASHES, producer);
        }
        declared.batch = Some(BatchPolicy {
            window_ms,
            max_batch: self.config.max_batch_size,
        });
        declared.batch_quiet_ms = self.config.quiet_ms();
        declared.timeout_ms = Some(window_ms + TIMEOUT_MARGIN_MS);
        declared
    }

    /// The burst plan (`groupMemoryMs`): the groups it remembers and where their parts go,
    /// and the replicas' loads as its latest window and the first window of the latest burst
    /// saw them. Nothing without a plan.
    fn state(&self) -> Option<serde_json::Value> {
        let plan = self.plan.as_ref()?;
        Some(serde_json::json!({ "plan": lock(plan).describe() }))
    }

    fn produce(
        &self,
        items: &[ProduceItem<'_>],
        out: &mut ProduceBatch<'_>,
    ) -> Result<(), PluginError> {
        let fair_share = self.config.assignment() == Assignment::FairShare;
        // A request alone in its window continues a burst the plan remembers, or the group of
        // a request the plan saw alone; otherwise it has no one to be placed with and is placed
        // on its own — and, with the plan, remembered: it may be the first sample of a burst
        // whose client lagged, and the next window then knows where its prompt went.
        // The hashes of a lone request hashed to be looked up in the plan, for the batch path
        // to reuse when the plan places it.
        let mut lone_hashes: Option<Vec<u64>> = None;
        if let [item] = items {
            if fair_share {
                let now_ms = item.request.now_ms;
                let count = self.block_count_of(item);
                let key = if self.plan.is_some() && count > 0 {
                    let hashes = lone_hashes.insert(Vec::with_capacity(count));
                    self.hash_item_into(item, hashes);
                    self.group_key(hashes, count)
                } else {
                    None
                };
                let planning = self.plan.as_ref().is_some_and(|plan| {
                    let plan = lock(plan);
                    plan.burst_may_be_on(now_ms) || key.is_some_and(|key| plan.knows(key))
                });
                if !planning {
                    let target = self.place_alone(item, count);
                    let endpoint = target
                        .and_then(|host| item.endpoints.iter().find(|e| e.host_index == host));
                    if let (Some(plan), Some(key), Some(endpoint)) =
                        (self.plan.as_ref(), key, endpoint)
                    {
                        let weight = self.weight_of(count);
                        lock(plan).remember_alone(now_ms, key, weight, &endpoint.id);
                    }
                    put_matches(item, count, target, self.config.block_size(), out);
                    return Ok(());
                }
            }
        }
        let block_size = self.config.block_size();
        let max_blocks = self.config.max_blocks();

        // Every item's block count, known without hashing.
        let counts: Vec<usize> = items.iter().map(|item| self.block_count_of(item)).collect();
        // A request alone in its batch has no one to be placed with, whatever its hashes. With
        // `minColocateBlocks = 0` only identical hash lists are placed together, and lists of
        // different lengths never are: a request whose block count no other request of the
        // batch shares gets no affinity either, and takes no part in placing the others
        // (`assign` leaves lone requests out). Such requests are not hashed; their entry stays
        // empty, which `assign` also answers with no affinity.
        let needs_hashing: Vec<bool> = if self.plan.is_some() {
            // Every group counts in the plan, lone requests included.
            counts.iter().map(|&count| count > 0).collect()
        } else if items.len() == 1 {
            vec![false]
        } else if self.config.colocate_blocks() > 0 {
            counts.iter().map(|&count| count > 0).collect()
        } else {
            let mut sorted = counts.clone();
            sorted.sort_unstable();
            counts
                .iter()
                .map(|&count| {
                    let first = sorted.partition_point(|&c| c < count);
                    count > 0 && sorted.get(first + 1) == Some(&count)
                })
                .collect()
        };

        // The hashed items' prompts, flattened, one after the other in one buffer. A request
        // whose hashed input equals that of a recent request already hashed (the samples of
        // one prompt in a burst) copies its hashes instead: they are a function of that input.
        let mut hashes = Vec::new();
        let mut ends = Vec::with_capacity(items.len());
        // Items hashed so far, with the range of their hashes, most recent last.
        let mut hashed: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (i, (item, &hash)) in items.iter().zip(&needs_hashing).enumerate() {
            if hash {
                let same = hashed
                    .iter()
                    .rev()
                    .take(RECENT_HASHED)
                    .filter(|(j, _)| counts[*j] == counts[i])
                    .find(|(j, _)| same_hashed_input(&items[*j], item, block_size, max_blocks));
                if let Some((_, range)) = same {
                    hashes.extend_from_within(range.clone());
                } else {
                    let start = hashes.len();
                    match lone_hashes.take() {
                        Some(already) => hashes.extend_from_slice(&already),
                        None => self.hash_item_into(item, &mut hashes),
                    }
                    hashed.push((i, start..hashes.len()));
                }
            }
            ends.push(hashes.len());
        }
        let entries: Vec<&[u64]> = ends
            .iter()
            .scan(0, |start, &end| {
                let entry = &hashes[*start..end];
                *start = end;
                Some(entry)
            })
            .collect();
        // The batch is spread over the candidates of its first request that has blocks.
        let first_with_blocks = items
            .iter()
            .zip(&counts)
            .find(|(_, &count)| count > 0)
            .map(|(item, _)| item);
        let spread_over = first_with_blocks.map_or(&[][..], |item| item.endpoints.as_slice());

        // With cache estimates, a prompt some candidates already hold whole has a home there
        // (the earlier requests of its burst, sent by earlier windows); a lone request cached
        // only in part is the cache-aware scorers' business: co-locating it here would gain
        // nothing and would pull it away. (The reference placement gives lone requests no
        // affinity anyway.)
        let mut placed_counts = std::borrow::Cow::Borrowed(&counts);
        if fair_share && self.config.cached_match_producer().is_some() {
            let cached: Vec<bool> = items.iter().map(cached_somewhere).collect();
            // A burst of fresh prompts, cached nowhere, skips the search for lone requests.
            if cached.contains(&true) {
                let lone = lone_requests(&entries, &counts, self.config.colocate_blocks());
                for (i, (&lone, &cached)) in lone.iter().zip(&cached).enumerate() {
                    // With the plan, a prompt some candidate holds whole continues there.
                    if lone
                        && cached
                        && (self.plan.is_none()
                            || whole_prompt_homes(&items[i], spread_over).is_empty())
                    {
                        // Without blocks to place, the fair share leaves it out.
                        placed_counts.to_mut()[i] = 0;
                    }
                }
            }
        }
        let assigned = if let Some(plan) = self.plan.as_ref() {
            let replicas = self.replicas(spread_over, first_with_blocks);
            self.place_by_plan(
                &mut lock(plan),
                items,
                &entries,
                &placed_counts,
                spread_over,
                &replicas,
            )
        } else if fair_share && placed_counts.iter().any(|&count| count > 0) {
            assign_fair_share(
                &entries,
                &placed_counts,
                &self.replicas(spread_over, first_with_blocks),
                self.config.colocate_blocks(),
                self.config.balance(),
            )
        } else if !fair_share && needs_hashing.contains(&true) {
            let replicas = self.replicas(spread_over, first_with_blocks);
            assign(
                &entries,
                &replicas,
                self.config.per_replica_cap(),
                self.config.colocate_blocks(),
                self.config.balance(),
            )
        } else {
            // Nothing to place: under fair share no request with blocks is left in the
            // batch; otherwise nothing was hashed, and `assign` places no empty entry.
            vec![None; items.len()]
        };

        for ((item, &count), target) in items.iter().zip(&counts).zip(&assigned) {
            let target = target.map(|replica| spread_over[replica].host_index);
            put_matches(item, count, target, block_size, out);
        }
        Ok(())
    }
}

impl BurstProducer {
    /// The item's block count over all its prompts, known without hashing.
    fn block_count_of(&self, item: &ProduceItem<'_>) -> usize {
        let (block_size, max_blocks) = (self.config.block_size(), self.config.max_blocks());
        item.request
            .prompts
            .iter()
            .map(|p| block_count(p.tokens.len(), block_size, max_blocks))
            .sum()
    }

    /// Appends the block hashes of every prompt of `item`, one prompt after the other: chained
    /// from the content hashes the cache estimator published for it when they are of this
    /// producer's blocks, else from the tokens.
    fn hash_item_into(&self, item: &ProduceItem<'_>, out: &mut Vec<u64>) {
        let (block_size, max_blocks) = (self.config.block_size(), self.config.max_blocks());
        let seed = prompt_seed(&item.request.model, &item.request.cache_salt);
        let prompts = item.request.prompts.as_slice();
        let published = self
            .config
            .cached_match_producer()
            .and_then(|_| {
                let consumed = consumes_content_hashes(&self.config);
                item.attrs.of_request(consumed, &item.endpoints)
            })
            .and_then(AttrValue::custom)
            .and_then(ContentHashes::parse);
        let needed = |p: usize| block_count(prompts[p].tokens.len(), block_size, max_blocks);
        let shape = (block_size as u32, prompts.len());
        if published.is_some_and(|hashes| hashes.chain_into(seed, shape, needed, out, |_| {})) {
            return;
        }
        for prompt in prompts {
            hash_prompt_into(seed, &prompt.tokens, block_size, max_blocks, out);
        }
    }

    /// The group of a request with `hashes` (`count` blocks): its whole hash list, or with
    /// `minColocateBlocks` its leading blocks; `None` without blocks.
    fn group_key(&self, hashes: &[u64], count: usize) -> Option<GroupKey> {
        let colocate = self.config.colocate_blocks();
        let prefix = if colocate > 0 {
            &hashes[..hashes.len().min(colocate)]
        } else {
            hashes
        };
        GroupKey::of(prefix).filter(|_| count > 0)
    }

    /// What one member of `count` blocks weighs in the plan's balance.
    fn weight_of(&self, count: usize) -> f64 {
        if self.config.balance() == config::BalanceBy::Tokens {
            count as f64
        } else {
            1.0
        }
    }

    /// Fair share of a batch of one request (`count` blocks), as the batch path places it:
    /// with no other request to group with, its hashes cannot change the placement, so they
    /// are not computed. Returns the chosen endpoint's host index.
    fn place_alone(&self, item: &ProduceItem<'_>, count: usize) -> Option<u32> {
        if count == 0 || (self.config.cached_match_producer().is_some() && cached_somewhere(item)) {
            return None;
        }
        let replicas = self.replicas(&item.endpoints, Some(item));
        let placed = assign_fair_share(
            &[&[]],
            &[count],
            &replicas,
            self.config.colocate_blocks(),
            self.config.balance(),
        );
        placed[0].map(|replica| item.endpoints[replica].host_index)
    }

    /// Places a window through the plan of recent bursts: requests with the same hash list
    /// (with `minColocateBlocks`, the same leading blocks) are one group, hinted to the
    /// candidates in `spread_over` whose cache estimate holds its first request's whole
    /// prompt. Requests whose `counts` entry is 0 get no affinity.
    fn place_by_plan(
        &self,
        plan: &mut BurstPlan,
        items: &[ProduceItem<'_>],
        entries: &[&[u64]],
        counts: &[usize],
        spread_over: &[EndpointView<'_>],
        replicas: &[Replica<'_>],
    ) -> Vec<Option<usize>> {
        let mut index: HashMap<GroupKey, usize> = HashMap::new();
        let mut keys: Vec<GroupKey> = Vec::new();
        // The requests the plan places, in arrival order, by their place in the batch; each
        // group's members by their place among those: the requests left out (no blocks, or
        // cached elsewhere alone) take no place in the plan's count of arrivals.
        let mut placed: Vec<usize> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        for (i, (entry, &count)) in entries.iter().zip(counts).enumerate() {
            let Some(key) = self.group_key(entry, count) else {
                continue;
            };
            let g = match index.get(&key) {
                Some(&g) => g,
                None => {
                    // A prompt the plan has not met that shares most of its blocks with one
                    // met earlier in this window (one system prompt, different questions)
                    // goes with it: both are still uncached, and apart they would be
                    // prefilled twice.
                    let relative = if plan.knows(key) {
                        None
                    } else {
                        members
                            .iter()
                            .take(MAX_RELATIVE_CHECKS)
                            .position(|earlier| mostly_shared(entries[placed[earlier[0]]], entry))
                    };
                    let g = relative.unwrap_or_else(|| {
                        keys.push(key);
                        members.push(Vec::new());
                        keys.len() - 1
                    });
                    index.insert(key, g);
                    g
                }
            };
            members[g].push(placed.len());
            placed.push(i);
        }
        let cached_on: Vec<Vec<usize>> = members
            .iter()
            .map(|positions| match self.config.cached_match_producer() {
                Some(_) => whole_prompt_homes(&items[placed[positions[0]]], spread_over),
                None => Vec::new(),
            })
            .collect();
        let groups: Vec<WindowGroup<'_>> = keys
            .iter()
            .zip(&members)
            .zip(&cached_on)
            .map(|((&key, positions), cached_on)| WindowGroup {
                key,
                positions,
                weight: self.weight_of(counts[placed[positions[0]]]),
                cached_on,
            })
            .collect();
        let now_ms = items.first().map_or(0, |item| item.request.now_ms);
        let mut assigned = vec![None; entries.len()];
        for (replicas_of, positions) in plan.place(now_ms, &groups, replicas).iter().zip(&members) {
            for (&replica, &position) in replicas_of.iter().zip(positions) {
                assigned[placed[position]] = Some(replica);
            }
        }
        assigned
    }

    /// The replicas a batch is spread over, with the load each carries: its reported running
    /// requests or, when `inFlightProducerName` is set, the requests in flight to it (read from
    /// `sent_from`'s row, the request whose candidates these are) plus the other traffic its
    /// reports show ([`OtherTraffic`]).
    fn replicas<'a>(
        &self,
        spread_over: &'a [EndpointView],
        sent_from: Option<&ProduceItem<'_>>,
    ) -> Vec<Replica<'a>> {
        let in_flight = self
            .config
            .in_flight_producer()
            .map(|_| consumes_in_flight(&self.config))
            .zip(sent_from);
        let mut counted = in_flight.map(|(key, item)| {
            let other = self
                .other_traffic
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            (key, item, other)
        });
        spread_over
            .iter()
            .map(|endpoint| {
                let reported = u64::from(endpoint.metrics.running_requests);
                let running = match counted.as_mut() {
                    Some((key, item, other)) => {
                        let sent = item
                            .attrs
                            .get(*key, endpoint)
                            .and_then(AttrValue::in_flight_load)
                            .map_or(0, |load| u64::try_from(load.requests).unwrap_or(0));
                        let excess = other.observe(
                            endpoint.host_index as usize,
                            item.request.now_ms,
                            reported.saturating_sub(sent),
                        );
                        sent + excess
                    }
                    None => reported,
                };
                Replica {
                    id: endpoint.id.as_str(),
                    running_requests: running,
                }
            })
            .collect()
    }
}

/// How many of a window's groups a new prompt is compared with when looking for one it shares
/// most of its blocks with; a window of more distinct prompts places the rest on their own.
const MAX_RELATIVE_CHECKS: usize = 64;

/// The share of the shorter hash list two prompts must have in common, from their first block,
/// to be placed together in a window.
const RELATIVE_SHARE: f64 = 0.8;

/// Whether two hash lists agree on at least [`RELATIVE_SHARE`] of the shorter one's blocks,
/// counted from the first. Block hashes are chained, so the last of those blocks agreeing
/// means all before it do.
fn mostly_shared(a: &[u64], b: &[u64]) -> bool {
    let shorter = a.len().min(b.len());
    let needed = (shorter as f64 * RELATIVE_SHARE).ceil() as usize;
    needed > 0 && a[0] == b[0] && a[needed - 1] == b[needed - 1]
}

/// Writes `item`'s match info for every candidate: a full match of its `count` blocks on the
/// endpoint with host index `target`, none elsewhere.
fn put_matches(
    item: &ProduceItem<'_>,
    count: usize,
    target: Option<u32>,
    block_size: usize,
    out: &mut ProduceBatch<'_>,
) {
    let total_blocks = count as u64;
    for (position, endpoint) in item.endpoints.iter().enumerate() {
        let match_blocks = if target == Some(endpoint.host_index) {
            total_blocks
        } else {
            0
        };
        out.put(
            item,
            PRODUCES_MATCH_INFO,
            position,
            AttrValue::PrefixCacheMatch(PrefixCacheMatchInfo {
                match_blocks,
                total_blocks,
                block_size_tokens: block_size as u64,
            }),
        );
    }
}

/// Whether the cache estimates give any candidate of `item` at least one block of its prompt.
fn cached_somewhere(item: &ProduceItem<'_>) -> bool {
    item.endpoints.iter().any(|endpoint| {
        matches!(
            item.attrs.get(CONSUMES_CACHED_MATCH, endpoint),
            Some(AttrValue::PrefixCacheMatch(info)) if info.match_blocks > 0
        )
    })
}

/// The positions in `spread_over` of the candidates whose cache estimate holds `item`'s whole
/// prompt.
fn whole_prompt_homes(item: &ProduceItem<'_>, spread_over: &[EndpointView<'_>]) -> Vec<usize> {
    let same_candidates = std::ptr::eq(item.endpoints.as_slice(), spread_over);
    item.endpoints
        .iter()
        .enumerate()
        .filter(|(_, endpoint)| {
            matches!(
                item.attrs.get(CONSUMES_CACHED_MATCH, endpoint),
                Some(AttrValue::PrefixCacheMatch(info))
                    if info.match_blocks > 0 && info.match_blocks >= info.total_blocks
            )
        })
        .filter_map(|(position, endpoint)| {
            if same_candidates {
                Some(position)
            } else {
                spread_over
                    .iter()
                    .position(|e| e.host_index == endpoint.host_index)
            }
        })
        .collect()
}

/// Which requests with blocks no other request of the batch would be co-located with: none
/// shares their hash list (with `min_colocate_blocks > 0`, its first `min_colocate_blocks`
/// hashes). An entry left empty (not hashed: its block count is unique) is lone.
fn lone_requests(entries: &[&[u64]], counts: &[usize], min_colocate_blocks: usize) -> Vec<bool> {
    let key = |i: usize| {
        let entry = entries[i];
        if min_colocate_blocks > 0 {
            &entry[..entry.len().min(min_colocate_blocks)]
        } else {
            entry
        }
    };
    let mut order: Vec<usize> = (0..entries.len())
        .filter(|&i| counts[i] > 0 && !entries[i].is_empty())
        .collect();
    order.sort_unstable_by(|&a, &b| key(a).cmp(key(b)));
    let mut lone: Vec<bool> = counts.iter().map(|&count| count > 0).collect();
    for run in order.chunk_by(|&a, &b| key(a) == key(b)) {
        if run.len() > 1 {
            for &i in run {
                lone[i] = false;
            }
        }
    }
    lone
}

/// Requests already hashed that a request's input is compared with before it is hashed.
const RECENT_HASHED: usize = 16;

/// The tokens [`hash_prompt_into`] reads from a prompt: its first `block_count` blocks.
fn hashed_tokens(tokens: &[u32], block_size: usize, max_blocks: usize) -> &[u32] {
    let count = block_count(tokens.len(), block_size, max_blocks);
    &tokens[..tokens.len().min(count.saturating_mul(block_size))]
}

/// Whether two requests' block hashes are bound to be equal: same model and cache salt (the
/// chain's seed), and prompt by prompt the same hashed tokens. The ends of the prompts are
/// compared first, as prompts sharing a long prefix differ there.
fn same_hashed_input(
    a: &ProduceItem<'_>,
    b: &ProduceItem<'_>,
    block_size: usize,
    max_blocks: usize,
) -> bool {
    const TAIL: usize = 64;
    let (a, b) = (&a.request, &b.request);
    a.model == b.model
        && a.cache_salt == b.cache_salt
        && a.prompts.len() == b.prompts.len()
        && a.prompts.iter().zip(b.prompts.iter()).all(|(pa, pb)| {
            let ta = hashed_tokens(&pa.tokens, block_size, max_blocks);
            let tb = hashed_tokens(&pb.tokens, block_size, max_blocks);
            let split = ta.len().saturating_sub(TAIL);
            ta.len() == tb.len() && ta[split..] == tb[split..] && ta[..split] == tb[..split]
        })
}

switchyard_plugin_api::export_plugins!(FACTORY);

#[cfg(test)]
mod tests;
