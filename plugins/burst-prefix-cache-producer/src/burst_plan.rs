//! Group continuity across windows (`groupMemoryMs`, a switchyard extension): a burst whose
//! requests reach the producer in many windows is placed as one problem.
//!
//! The plan remembers every prompt group it placed until `groupMemoryMs` after the group's last
//! request: the members seen so far and, per replica, the *part* of the group meant for it and
//! the members sent there. Each window:
//!
//! 1. Every remembered group's final size is estimated. The groups of one burst start together
//!    and grow at rates proportional to their sizes, so their counts predict their final sizes
//!    up to a common factor — but early counts are noisy. The estimate shrinks each count
//!    towards the mean count by the share of the counts' spread that is noise (a Poisson
//!    count's variance is its mean, and less the nearer the burst is to the previous one's
//!    requests, unless new groups keep appearing: a count when a share `s` of the members
//!    came varies by its mean times 1 − `s`): equal groups (the samples of an RL step) are
//!    predicted equal however unevenly their first members arrived, while truly unequal groups
//!    keep their measured proportions. Estimates are relative: only their proportions are used.
//!    When the previous burst's groups were unequal, their sizes are a second prior: the
//!    group with the k-th most members so far is expected to be as large, in proportion, as
//!    the previous burst's k-th largest — or, where counts are close enough for their ranks
//!    to swap, as the sizes it could have, each weighed by how likely it makes the count
//!    (`rank_match`), so an estimate does not jump a whole size when two counts trade
//!    places. The counts take it when they spread around it less
//!    than around the mean by more than a count's own variance — the next step of a training
//!    loop repeating the last one's mix of group sizes — and shrink towards it instead. After
//!    a burst of equal groups (an evaluation batch between two training steps, say), the sizes
//!    of the latest burst of [`STEP_GROUPS`] groups or more whose sizes differed are a prior
//!    too, taken the same way. When a
//!    second wave of groups begins while the first is still arriving (the next step sent
//!    before the last one ended; see [`BurstPlan::second_wave`]), each wave's counts are
//!    estimated on their own, at their own stage, and the second wave's groups are expected to
//!    be as large on average as the first wave's.
//! 2. A group seen for the first time goes whole to the replica with the least planned load
//!    (estimated sizes times parts; among replicas planned alike, one that took no new group
//!    in the same window, then the one whose prefill the group brings nearest the burst's
//!    average prompt length times its groups; for prompts sent in turn, among those within
//!    half a group of it, one with the fewest groups, then by that prefill, then the one whose
//!    newest group came longest ago), largest first and, at equal counts in a window that
//!    brings the burst at once, longest first — or, when the cache estimate says some
//!    replicas already hold its whole prompt (its first member went there before the plan
//!    took note, or the prompt is simply cached), to the least planned of those: anywhere
//!    else would prefill it again, and step 3 still splits it if balance needs that. When the
//!    counts follow the previous burst's sizes, or the window brings the burst at once, and
//!    the groups look complete (and no new groups keep appearing), a group that takes its
//!    replica past what step 3 would allow is split there and then, its excess on the next
//!    least planned replica, before the smaller groups fill in around it.
//! 3. Once the burst's groups seem all known (`groups_look_complete`), a replica planned above
//!    the level by more than half of [`ALLOWANCE`] (or one request) sheds load to replicas
//!    below the level. It first does so along the groups that already have homes on several
//!    replicas (it hands part of a group it shares to that group's other home, which may hand
//!    part of another shared group onwards, and so on): such a move opens no new home. A group
//!    can hand on only what its part still holds beyond the members already sent there, since
//!    those stay where they went. Only when no replica below the level (or not one below the
//!    floor, as far under the level as the ceiling is over it) can be reached that way does
//!    its largest group get a new home, on the least planned replica out of reach. A replica
//!    below the floor while none is above the ceiling pulls from the most planned one along
//!    shared groups; once the burst has brought as many requests as the previous one, a
//!    replica out of reach and out of the balance bound gets a new home from it. Until the
//!    burst has brought [`LATE_IN_BURST`] of the previous one's requests (or lasted as long),
//!    a replica may run further over before it gets a new home (and the new home as far),
//!    from [`URGENT_EXCESS`] at the start down to the ceiling: a new home opened on early,
//!    noisy counts is often one the final sizes would not have needed, and each costs a
//!    prefill. Meanwhile an excess of up to one mean group, fading
//!    with the square of what is left of the wait, gets no new home either: while replicas
//!    hold one or two groups each, which replica is over says where groups landed, not how
//!    large they are. As the burst nears the previous one's requests, the
//!    excess that gets a new home grows from the ceiling's to [`SETTLED_EXCESS`], within the
//!    balance bound, unless a replica below the floor that far can be reached no other way: a
//!    replica under the level gets a new home for no smaller a shortfall than a replica over
//!    it for its excess, since each is a prefill. The groups and replicas linked by
//!    placements stay within P + R − 1 placements as long as they form a forest: a new home
//!    on a replica the group already reaches through other shared groups, none able to carry
//!    more, closes a cycle, and spends a placement a later home joining two separate trees
//!    would need. Such a home, and any home once the active groups have P + R − 1
//!    placements, waits until a replica would otherwise end outside the balance bound (over
//!    the level, or the replica meant to relieve it under, by [`PAST_BOUND_EXCESS`], and by
//!    what the counts may still be off on top of it: [`PAST_BOUND_NOISE`]).
//!    While new groups keep appearing at their usual spacing (prompts sent one after the
//!    other), a replica may run up to one group ahead of the level: the next group goes where
//!    the earlier ones left room.
//! 4. Each member goes to its group's replica furthest below its part of the members seen.
//!
//! Equal groups thus land whole, four to a replica when 32 meet 8 replicas, and a group splits
//! only when balance needs it, whichever windows its members arrive in.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use crate::assign::Replica;
use crate::fair_share::ALLOWANCE;

/// A prompt group's identity: its block count and a digest of its whole hash list (a
/// request's prompts are hashed one after the other, each chain from the seed, so no single
/// block hash stands for a request of several prompts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub blocks: usize,
    pub digest: u64,
}

impl GroupKey {
    /// The key of a non-empty hash list.
    pub fn of(hashes: &[u64]) -> Option<Self> {
        if hashes.is_empty() {
            return None;
        }
        // Every block hash is already uniform; a multiply-rotate fold keeps their order.
        let digest = hashes.iter().fold(0x243f_6a88_85a3_08d3_u64, |acc, &h| {
            (acc ^ h)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(29)
        });
        Some(GroupKey {
            blocks: hashes.len(),
            digest,
        })
    }
}

/// The members of one group in the window being placed.
#[derive(Debug, Clone, Copy)]
pub struct WindowGroup<'a> {
    pub key: GroupKey,
    /// Where the group's members are in the arrival order of the window's requests the plan
    /// places (requests it does not place take no place in it), ascending; a group without
    /// members is ignored.
    pub positions: &'a [usize],
    /// What one member weighs in the balance: 1, or its block count with `balanceBy = tokens`.
    pub weight: f64,
    /// Positions in the replica list whose cache estimate already holds the whole prompt.
    pub cached_on: &'a [usize],
}

/// Where a remembered group stands: still arriving; paused past its limit while the whole
/// stream may only have stalled; or stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Arriving,
    Stalled,
    Stopped,
}

/// What the plan remembers of one group.
#[derive(Debug)]
struct Trail {
    first_ms: u64,
    last_ms: u64,
    /// When (in the plan's `arrivals`) its first and its latest member came.
    first_arrival: u64,
    last_arrival: u64,
    seen: usize,
    weight: f64,
    /// The prompt's length in blocks: what a replica it has a share on prefills.
    blocks: usize,
    shares: Vec<Share>,
}

impl Trail {
    /// Moves `part` of the group from its share `k` to its share on replica `target` of
    /// `fleet`, opening that share when there is none; returns the share's index.
    fn hand_over(&mut self, k: usize, target: usize, part: f64, fleet: &Fleet<'_>) -> usize {
        self.shares[k].part = (self.shares[k].part - part).max(0.0);
        match self
            .shares
            .iter()
            .position(|s| fleet.position(s) == Some(target))
        {
            Some(kb) => {
                self.shares[kb].part += part;
                kb
            }
            None => {
                self.shares
                    .push(Share::new(fleet.replicas[target].id, part, 0));
                self.shares.len() - 1
            }
        }
    }
}

/// A group's part on one replica.
#[derive(Debug)]
struct Share {
    replica: Box<str>,
    /// The fraction of the group's members meant for this replica; a group's parts add up to 1.
    part: f64,
    /// Members sent to this replica so far, over the whole burst.
    sent: usize,
    /// Where `replica` was in the replica list last looked up: the lists of successive
    /// windows mostly agree, so one comparison usually finds it again.
    at: Cell<usize>,
}

impl Share {
    fn new(replica: &str, part: f64, sent: usize) -> Self {
        Share {
            replica: replica.into(),
            part,
            sent,
            at: Cell::new(0),
        }
    }
}

/// Remembered groups of recent bursts; see the module docs.
#[derive(Debug)]
pub struct BurstPlan {
    memory_ms: u64,
    /// The batch window: the least time a group may pause and still count as arriving.
    window_ms: u64,
    /// In key order, so that every sum and tie over the groups comes out the same for the
    /// same inputs.
    trails: BTreeMap<GroupKey, Trail>,
    swept_ms: u64,
    /// Members placed by the plan so far.
    arrivals: u64,
    /// When (in `arrivals`) the newest remembered group had its first member.
    newest_from: u64,
    /// When the newest group of two or more members had its first.
    newest_group_from: u64,
    /// The time of the window being placed.
    now_ms: u64,
    /// When a group last had a second member: until `memory_ms` later a burst may be going on.
    last_burst_ms: Option<u64>,
    /// Where (in `arrivals`) the current burst began, and when; the sizes of its groups of two
    /// or more already forgotten; the sizes of the previous burst's groups, largest first.
    burst_from: u64,
    burst_from_ms: u64,
    forgotten_sizes: Vec<usize>,
    previous_sizes: Vec<usize>,
    /// The group sizes of the latest burst whose sizes were a mix ([`is_size_mix`]), largest
    /// first, when bursts of equal groups (or of a few groups) came since: a prior for a burst
    /// after them as well.
    unequal_sizes: Vec<usize>,
    /// The requests the previous burst brought and how long they took to arrive, if a burst
    /// of two or more groups ended; how far the current one has come is measured against it.
    previous_burst: Option<(u64, u64)>,
    /// The rebalance's buffers, kept between windows.
    links: Links,
    /// The first arrivals [`BurstPlan::second_wave`] sorts, kept between windows.
    first_arrivals: RefCell<Vec<u64>>,
    /// Per replica, one past the arrival of the newest active group's first member among the
    /// groups with a home there (0: none), for the window being placed.
    opened_at: Vec<u64>,
    /// Per replica, the blocks it prefills for the active groups with a home there and how
    /// many groups those are, for the window being placed.
    prefill: Vec<(usize, usize)>,
    /// What the plan saw and decided in its latest window, and in the first window of the
    /// latest burst (the window that gave a group its second member while no other group of
    /// two or more was still arriving), for `state`.
    latest: WindowView,
    burst_start: WindowView,
    /// When (in `arrivals`, and on the plan's clock) the next round of new homes may open: see
    /// [`BurstPlan::open_home_round`].
    next_home_round: (u64, u64),
    /// Where (in `arrivals`) the stream last resumed anew ([`BurstPlan::resumes_anew`]): the
    /// groups of two or more whose last member came before have stopped.
    resumed_from: u64,
}

/// One window as the plan saw it: per replica the load it carried, the part of that no
/// remembered group explains, and the load planned for it once the window was placed.
#[derive(Debug, Default, Clone)]
struct WindowView {
    at_ms: u64,
    requests: usize,
    groups: usize,
    level: f64,
    replicas: Vec<Box<str>>,
    carried: Vec<u64>,
    unexplained: Vec<f64>,
    planned: Vec<f64>,
    /// When a replica got a new home in the window; `None` when its groups did not look
    /// complete, so nothing split.
    new_homes: Option<NewHomes>,
    /// How many active groups the window took for a second wave (see
    /// [`BurstPlan::second_wave`]); `None` when it saw one wave.
    second_wave_groups: Option<usize>,
}

impl WindowView {
    /// Takes the window's figures, reusing its buffers (a replica's name is copied only when
    /// the replica list changed).
    fn record(&mut self, at_ms: u64, groups: &[WindowGroup<'_>], fleet: &Fleet<'_>, base: &[f64]) {
        self.at_ms = at_ms;
        self.requests = groups.iter().map(|g| g.positions.len()).sum();
        self.groups = groups.iter().filter(|g| !g.positions.is_empty()).count();
        self.level = fleet.level;
        let same = self.replicas.len() == fleet.replicas.len()
            && self
                .replicas
                .iter()
                .zip(fleet.replicas)
                .all(|(name, r)| **name == *r.id);
        if !same {
            self.replicas = fleet.replicas.iter().map(|r| r.id.into()).collect();
        }
        self.carried.clear();
        self.carried
            .extend(fleet.replicas.iter().map(|r| r.running_requests));
        self.unexplained.clear();
        self.unexplained.extend_from_slice(base);
        self.planned.clear();
        self.planned.extend_from_slice(&fleet.planned);
    }

    fn describe(&self) -> serde_json::Value {
        let replicas: Vec<serde_json::Value> = (0..self.replicas.len())
            .map(|r| {
                serde_json::json!({
                    "id": &*self.replicas[r],
                    "carried": self.carried[r],
                    "unexplained": rounded(self.unexplained[r]),
                    "planned": rounded(self.planned[r]),
                })
            })
            .collect();
        serde_json::json!({
            "atMs": self.at_ms,
            "requests": self.requests,
            "groups": self.groups,
            "level": rounded(self.level),
            "newHomesWaitUpTo": self.new_homes.and_then(|h| h.waiting).map(rounded),
            "newHomesFrom": self.new_homes.map(|h| rounded(h.from)),
            "pastBoundHomesFrom": self.new_homes.map(|h| rounded(h.past_bound)),
            "secondWaveGroups": self.second_wave_groups,
            "replicas": replicas,
        })
    }
}

/// How far a replica may run over the level, as a share of it, before it gets a new home for
/// part of a group.
#[derive(Debug, Clone, Copy)]
struct NewHomes {
    /// While new homes wait for the counts (see [`BurstPlan::new_homes_wait`]): how far over
    /// a replica, and its new home, may run meanwhile.
    waiting: Option<f64>,
    /// The excess that gets a new home.
    from: f64,
    /// The excess, or the shortfall of the replica meant to relieve it, that gets a new home
    /// closing a cycle or past P + R − 1 placements (see [`PAST_BOUND_EXCESS`]).
    past_bound: f64,
    /// While new homes wait: an excess (in load, not a share) that gets no new home however
    /// the shares compare, up to one mean group at the burst's start and fading with the
    /// square of what is left of the wait. While replicas hold one or two groups each, one
    /// group more or less is what sets them apart, and the first counts cannot yet tell which
    /// group to split.
    lumps: f64,
}

impl NewHomes {
    /// The allowances once the burst has brought `settled` of the previous one's requests
    /// (`measured`: there is a previous burst to go by): each grows from the ceiling's towards
    /// its settled value, as the counts near the groups' sizes, except the one past the
    /// bounds, which is the balance bound's whenever the burst is measured.
    /// `mean_group` is the estimated load of a group, on average.
    /// `noise` is how far a replica's planned load may still be off, as a share of the level
    /// ([`BurstPlan::count_noise`]); homes past the bounds wait [`PAST_BOUND_NOISE`] of it more,
    /// up to [`URGENT_EXCESS`] in all.
    fn at(waiting: Option<f64>, settled: f64, measured: bool, mean_group: f64, noise: f64) -> Self {
        let grown = |to: f64| ALLOWANCE / 2.0 + (to - ALLOWANCE / 2.0) * settled;
        // What is left of the wait, 1 at its start and 0 at its end.
        let left = waiting.map_or(0.0, |w| {
            ((w - ALLOWANCE / 2.0) / (URGENT_EXCESS - ALLOWANCE / 2.0)).clamp(0.0, 1.0)
        });
        NewHomes {
            waiting,
            from: waiting.unwrap_or(0.0).max(grown(SETTLED_EXCESS)),
            past_bound: if measured {
                PAST_BOUND_EXCESS
                    + (PAST_BOUND_NOISE * noise).min(URGENT_EXCESS - PAST_BOUND_EXCESS)
            } else {
                grown(PAST_BOUND_EXCESS)
            },
            lumps: mean_group * left * left,
        }
    }
}

/// How far a replica's load may end from a `share` and stay within the balance bound: 10% of
/// it, or two members of `per_member` each.
fn balance_bound(share: f64, per_member: f64) -> f64 {
    (ALLOWANCE * share).max(2.0 * per_member)
}

/// `x` to two decimals, for reading.
fn rounded(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// How many times the counts' spread around their ranks' sizes a count's variance is taken to
/// be, at most, when sizes are matched to counts: sorted, counts fit their ranks better than
/// their noise would let them.
const RANK_SPREAD_GAIN: f64 = 4.0;

/// The most group sizes of one burst kept as the next one's prior: a stream whose groups
/// overlap without a pause never ends a burst, and must not grow the list without bound.
const PRIOR_GROUPS: usize = 4096;

/// How far into a burst, as a share of the previous one's requests, a replica over the
/// ceiling gets a new home for part of a group as soon as it is over; before that it may run
/// further over (moves along groups already shared are not held back): a new home opened on
/// early, noisy counts is often one the final sizes would not have needed, and each costs a
/// prefill.
const LATE_IN_BURST: f64 = 0.7;

/// How far over the level, as a share of it, a replica may run at the start of a burst before
/// it gets a new home; the allowance shrinks evenly to the ceiling's at [`LATE_IN_BURST`].
const URGENT_EXCESS: f64 = 0.3;

/// The share of the previous burst's requests a burst's first window must bring for its
/// corrections not to wait. A client that pauses once while sending a step has the router cut
/// it in two: live first windows brought 40% to 55% of a step so sent, and 80% or more of a step
/// sent at once. Balanced at once on the counts of half a step, the groups spend the
/// placements the second half needs.
const AT_ONCE: f64 = 0.6;

/// How far over the level, as a share of it, a replica may end before it gets a new home,
/// once the burst has brought as many requests as the previous one: its counts are then
/// about its groups' final sizes, and an excess within the balance bound's 10% is not worth a
/// prefill. Before that point the allowance grows from the ceiling's with the share of the
/// previous burst's requests.
const SETTLED_EXCESS: f64 = 0.08;

/// How far over the level a replica must run, or under it the replica meant to relieve it,
/// as a share of the level, before a new home closes a cycle of groups and replicas (its group
/// already joins the two through groups with homes on both, none able to carry more) or takes
/// the active groups past P + R − 1 placements: the balance bound's 10%. Groups and replicas
/// linked by placements keep those within P + R − 1 as long as they form a forest; a cycle
/// spends a placement that only a tree joining the rest may need, and a placement past the
/// bound is worth it only to keep a replica within the balance bound. This holds from the
/// burst's first window: a placement spent early is one a later home joining two separate
/// trees lacks. Until the burst has brought as many requests as the last, the excess must
/// clear the bound by [`PAST_BOUND_NOISE`] of its counts' noise as well. Only a burst with
/// no previous one to go by (its counts never settle) keeps the ceiling's.
const PAST_BOUND_EXCESS: f64 = 0.1;

/// How many of a replica's count-noise widths (see [`BurstPlan::count_noise`]) an excess past
/// the balance bound must also clear before it gets a new home closing a cycle or going past
/// P + R − 1: an estimate a little over the bound while counts are still coming in ends within
/// it about as often as outside, and the placement cannot be taken back.
const PAST_BOUND_NOISE: f64 = 0.75;

/// How long a round of new homes lasts by time, in shares of the previous burst's length per
/// replica (by requests, one share of its requests per replica): a client's spread varies from
/// step to step more than its size, so time counts a little slower.
const HOME_ROUND_TIME: f64 = 1.5;

/// How far into a burst, as a share of the previous one's requests or length, new homes no
/// longer wait for a round: the windows left are few, and what they cannot correct stays.
const HOME_ROUNDS_END: f64 = 0.9;

/// Requests per group the first wave of groups must have brought before a second wave can
/// begin ([`BurstPlan::second_wave`]): a burst's groups all begin within its first few
/// requests each, so the scattered first members of one step's unequal groups are no sign of
/// the next step, while a step sent before the last one ended begins once the last one has
/// brought several requests per group.
const WAVE_UNDER_WAY: u64 = 4;

/// The fewest groups taken for a step of their own: a burst whose mix of sizes is kept as a
/// prior past bursts of equal groups ([`is_size_mix`]), or the new groups a stream resumes
/// with ([`BurstPlan::resumes_anew`]). A few groups that happened to come together are no step.
const STEP_GROUPS: usize = 4;

/// Groups `BurstPlan::describe` lists, the most seen first.
const DESCRIBED_GROUPS: usize = 64;

impl BurstPlan {
    /// A plan that remembers groups for `memory_ms`, behind batch windows of `window_ms`.
    pub fn new(memory_ms: u64, window_ms: u64) -> Self {
        BurstPlan {
            memory_ms,
            window_ms,
            trails: BTreeMap::new(),
            swept_ms: 0,
            now_ms: 0,
            arrivals: 0,
            newest_from: 0,
            newest_group_from: 0,
            burst_from: 0,
            burst_from_ms: 0,
            previous_burst: None,
            forgotten_sizes: Vec::new(),
            previous_sizes: Vec::new(),
            unequal_sizes: Vec::new(),
            last_burst_ms: None,
            links: Links::default(),
            first_arrivals: RefCell::new(Vec::new()),
            opened_at: Vec::new(),
            prefill: Vec::new(),
            latest: WindowView::default(),
            burst_start: WindowView::default(),
            next_home_round: (0, 0),
            resumed_from: 0,
        }
    }

    /// The plan as `state` shows it: the groups remembered (the most seen first) with their
    /// parts per replica, and the replicas' loads as the latest window and the first window of
    /// the latest burst saw and planned them.
    pub fn describe(&self) -> serde_json::Value {
        let mut trails: Vec<&Trail> = self.trails.values().collect();
        trails.sort_by(|a, b| {
            b.seen
                .cmp(&a.seen)
                .then(a.first_arrival.cmp(&b.first_arrival))
        });
        let groups: Vec<serde_json::Value> = trails
            .iter()
            .take(DESCRIBED_GROUPS)
            .map(|t| {
                let parts: Vec<serde_json::Value> = t
                    .shares
                    .iter()
                    .map(|s| {
                        serde_json::json!({
                            "replica": &*s.replica,
                            "part": rounded(s.part),
                            "sent": s.sent,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "seen": t.seen,
                    "firstMs": t.first_ms,
                    "lastMs": t.last_ms,
                    "active": self.is_active(t),
                    "parts": parts,
                })
            })
            .collect();
        serde_json::json!({
            "groupsRemembered": self.trails.len(),
            "previousBurstSizes": &self.previous_sizes,
            "unequalBurstSizes": &self.unequal_sizes,
            "previousBurst": self.previous_burst.map(|(requests, length_ms)| {
                serde_json::json!({ "requests": requests, "lengthMs": length_ms })
            }),
            "nextHomeRound": self.home_rounds_measure().map(|_| {
                let (from, from_ms) = self.next_home_round;
                serde_json::json!({
                    "burstRequests": from.saturating_sub(self.burst_from),
                    "atMs": from_ms,
                })
            }),
            "groups": groups,
            "burst": self.describe_burst(),
            "latestWindow": self.latest.describe(),
            "burstStart": self.burst_start.describe(),
        })
    }

    /// The latest burst measured against its bounds, over the groups still remembered that had
    /// two or more members and one of them in the burst (a group's first member may have
    /// come alone, before the burst began; a request alone is no burst): its groups P,
    /// requests, (group, replica) placements against P + R − 1 (R the replicas of the latest
    /// window), and its requests per replica against the fair share's balance bound (10%, or
    /// two requests). `null` before any such group.
    fn describe_burst(&self) -> serde_json::Value {
        let replicas = &self.latest.replicas;
        let mut per_replica = vec![0usize; replicas.len()];
        let (mut groups, mut requests, mut placements, mut elsewhere) = (0, 0, 0, 0);
        for trail in self
            .trails
            .values()
            .filter(|t| t.seen > 1 && t.last_arrival >= self.burst_from)
        {
            groups += 1;
            for share in trail.shares.iter().filter(|s| s.sent > 0) {
                placements += 1;
                requests += share.sent;
                match replicas.iter().position(|r| **r == *share.replica) {
                    Some(r) => per_replica[r] += share.sent,
                    None => elsewhere += share.sent,
                }
            }
        }
        if groups == 0 || replicas.is_empty() {
            return serde_json::Value::Null;
        }
        let fair = requests as f64 / replicas.len() as f64;
        let bound = balance_bound(fair, 1.0);
        let fewest = per_replica.iter().copied().min().unwrap_or(0);
        let most = per_replica.iter().copied().max().unwrap_or(0);
        let balanced = elsewhere == 0
            && per_replica
                .iter()
                .all(|&n| (n as f64 - fair).abs() <= bound + 1e-9);
        let placement_bound = groups + replicas.len() - 1;
        serde_json::json!({
            "groups": groups,
            "requests": requests,
            "placements": placements,
            "placementBound": placement_bound,
            "fairShare": rounded(fair),
            "fewestPerReplica": fewest,
            "mostPerReplica": most,
            "sentElsewhere": elsewhere,
            "withinBounds": balanced && placements <= placement_bound,
        })
    }

    /// Whether a burst may be going on at `now_ms`: a group had a second member within the
    /// memory. Until then a lone request is not worth remembering.
    pub fn burst_may_be_on(&self, now_ms: u64) -> bool {
        self.last_burst_ms
            .is_some_and(|at| at.saturating_add(self.memory_ms) >= now_ms)
    }

    /// Whether the plan remembers the group `key`.
    pub fn knows(&self, key: GroupKey) -> bool {
        self.trails.contains_key(&key)
    }

    /// Remembers a request placed on its own on `replica`, outside any burst, as the first
    /// member of the group `key`: if more of the group follow, the plan continues from there.
    pub fn remember_alone(&mut self, now_ms: u64, key: GroupKey, weight: f64, replica: &str) {
        self.sweep(now_ms);
        let arrival = self.arrivals;
        self.trails.entry(key).or_insert_with(|| Trail {
            first_ms: now_ms,
            last_ms: now_ms,
            first_arrival: arrival,
            last_arrival: arrival,
            seen: 1,
            weight,
            blocks: key.blocks,
            shares: vec![Share::new(replica, 1.0, 1)],
        });
        self.newest_from = self.newest_from.max(arrival);
        self.arrivals += 1;
    }

    /// Places the window's groups over `replicas`; returns, per group, the replica position of
    /// each of its members.
    pub fn place(
        &mut self,
        now_ms: u64,
        groups: &[WindowGroup<'_>],
        replicas: &[Replica<'_>],
    ) -> Vec<Vec<usize>> {
        if replicas.is_empty() {
            return groups.iter().map(|_| Vec::new()).collect();
        }
        self.sweep(now_ms);
        let window_from = self.arrivals;
        self.now_ms = now_ms;
        // The previous burst's last window, should this one start the next: a window of lone
        // first members placed since belongs to the next burst.
        let last_burst_ms = self.last_burst_ms;
        if self.resumes_anew(now_ms, groups, replicas.len()) {
            self.resumed_from = window_from;
        }
        // No group of two or more still arriving: a group this window completes starts a
        // burst. Groups of two or more past their pause limit but kept for a stall of the
        // whole stream do not count when this window brings none of them: the stream resumed
        // with other groups, the next step of a training loop after the last one's slow tail.
        let stalled = |t: &Trail| t.seen > 1 && self.standing(t) == Standing::Stalled;
        let resumes = groups
            .iter()
            .any(|g| !g.positions.is_empty() && self.trails.get(&g.key).is_some_and(&stalled));
        let quiet = !self.trails.values().any(|t| {
            t.seen > 1
                && match self.standing(t) {
                    Standing::Arriving => true,
                    Standing::Stalled => resumes,
                    Standing::Stopped => false,
                }
        });
        let mut fresh = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            if group.positions.is_empty() {
                continue;
            }
            let first_arrival = self.arrivals + group.positions[0] as u64;
            let trail = self.trails.entry(group.key).or_insert_with(|| Trail {
                first_ms: now_ms,
                last_ms: now_ms,
                first_arrival,
                last_arrival: first_arrival,
                seen: 0,
                weight: group.weight,
                blocks: group.key.blocks,
                shares: Vec::new(),
            });
            if trail.shares.is_empty() {
                fresh.push(g);
                self.newest_from = self.newest_from.max(first_arrival);
            }
            let was_alone = trail.seen < 2;
            trail.seen += group.positions.len();
            trail.last_ms = now_ms;
            trail.last_arrival = self.arrivals + group.positions[group.positions.len() - 1] as u64;
            if trail.seen > 1 {
                self.last_burst_ms = Some(now_ms);
                if was_alone {
                    self.newest_group_from = self.newest_group_from.max(trail.first_arrival);
                }
            }
        }
        let window_requests = groups.iter().map(|g| g.positions.len() as u64).sum::<u64>();
        self.arrivals += window_requests;
        let burst_groups = self.active().filter(|t| t.seen > 1).count() as u64;
        let starts_burst = quiet && burst_groups > 0;
        if starts_burst {
            // Its first member may have come before this window, placed alone; a group of the
            // last burst kept for a stall of the stream is not part of it.
            let (from, from_ms) = self
                .active()
                .filter(|t| t.seen > 1 && self.standing(t) == Standing::Arriving)
                .map(|t| (t.first_arrival, t.first_ms))
                .fold((window_from, now_ms), |(a, a_ms), (b, b_ms)| {
                    (a.min(b), a_ms.min(b_ms))
                });
            self.end_burst(from, from_ms, last_burst_ms.unwrap_or(from_ms));
        }

        // While new groups keep appearing (prompts sent one after the other) a count is no
        // sample of its group's size: the newest group has only begun.
        let still_appearing = self.groups_still_appearing();
        let measured = !still_appearing && self.previous_burst.is_some();
        let settled = if measured {
            self.share_of_previous()
        } else {
            0.0
        };
        let estimate = Estimates::of(self, settled);
        let mut fleet = Fleet::new(replicas);
        let mut sent = vec![0usize; replicas.len()];
        let mut opened_at = std::mem::take(&mut self.opened_at);
        opened_at.clear();
        opened_at.resize(replicas.len(), 0);
        let mut prefill = std::mem::take(&mut self.prefill);
        prefill.clear();
        prefill.resize(replicas.len(), (0, 0));
        let (mut total, mut active, mut members_seen, mut weight_seen) = (0.0, 0u32, 0usize, 0.0);
        let (mut blocks, mut shortest, mut longest) = (0usize, usize::MAX, 0usize);
        // Groups whose prompts count in each replica's prefill: the active ones, and those of
        // the burst that have stopped arriving since (a step sent prompt by prompt outlasts a
        // batch window; a replica prefills every prompt of the burst sent to it).
        let mut tallied = 0u32;
        for trail in self.trails.values() {
            let is_active = self.is_active(trail);
            if !is_active && trail.first_arrival < self.burst_from {
                continue;
            }
            tallied += 1;
            blocks += trail.blocks;
            shortest = shortest.min(trail.blocks);
            longest = longest.max(trail.blocks);
            let load = if is_active {
                active += 1;
                members_seen += trail.seen;
                weight_seen += trail.seen as f64 * trail.weight;
                let load = estimate.size(trail) * trail.weight;
                total += load;
                Some(load)
            } else {
                None
            };
            for share in &trail.shares {
                if let Some(r) = fleet.position(share) {
                    prefill[r].0 += trail.blocks;
                    prefill[r].1 += 1;
                    if let Some(load) = load {
                        fleet.planned[r] += share.part * load;
                        sent[r] += share.sent;
                        opened_at[r] = opened_at[r].max(trail.first_arrival + 1);
                    }
                }
            }
        }
        self.opened_at = opened_at;
        // The estimated load of a group, on average, and its prompt's length.
        let mean_group = total / f64::from(active.max(1));
        let mean_blocks = blocks as f64 / f64::from(tallied.max(1));
        // Load the replicas carry that the remembered groups do not explain (other traffic,
        // groups already forgotten), in the plan's units.
        let per_member = if members_seen > 0 {
            weight_seen / members_seen as f64
        } else {
            1.0
        };
        let base: Vec<f64> = replicas
            .iter()
            .zip(&sent)
            .map(|(r, &sent)| r.running_requests.saturating_sub(sent as u64) as f64 * per_member)
            .collect();
        for (planned, base) in fleet.planned.iter_mut().zip(&base) {
            *planned += base;
        }
        fleet.set_level(&base, total, per_member);

        let complete = self.groups_look_complete(burst_groups, replicas.len() as u64);
        let at_once = self.brings_burst_at_once(window_requests);
        let waiting = complete.then(|| self.new_homes_wait(at_once)).flatten();
        let new_homes = complete.then(|| {
            let noise = if measured && !at_once {
                self.count_noise(settled, replicas.len())
            } else {
                0.0
            };
            NewHomes::at(waiting, settled, measured, mean_group, noise)
        });
        // With the previous burst's sizes to go by, or in a window that brings the burst at
        // once, a group found larger than a share is split when it is first placed, before the
        // smaller groups fill in around it: split later, the replicas it overflows would each
        // take a sliver of it. Not while new groups keep appearing: the newest have only begun,
        // and their ranks say nothing of their sizes.
        let split_fresh_from = new_homes
            .filter(|_| (estimate.first.takes_prior() || at_once) && !still_appearing)
            .map(|homes| (fleet.level * (1.0 + homes.from)).max(fleet.ceiling));

        fresh.sort_by(|&a, &b| {
            let seen = |g: usize| self.trails[&groups[g].key].seen;
            let blocks = |g: usize| groups[g].key.blocks;
            seen(b)
                .cmp(&seen(a))
                .then(if at_once {
                    blocks(b).cmp(&blocks(a))
                } else {
                    std::cmp::Ordering::Equal
                })
                .then(a.cmp(&b))
        });
        // A new group goes, among the replicas planned alike, to one that took no new group in
        // this window. Prompts sent in turn (new ones keep appearing, and at most two groups
        // besides the newest still had members after it began; shuffled prompts keep arriving
        // side by side) go, among the replicas within half a group of the least planned (the
        // plan lets one run a group ahead meanwhile), to one with the fewest groups, then by
        // prefill (below), then to the one whose newest group came longest ago: the estimates
        // of the prompts still arriving would otherwise send consecutive prompts to one
        // replica, where they queue for prefill.
        let in_turn = still_appearing
            && self
                .active()
                .filter(|t| t.seen > 1 && t.first_arrival < self.newest_group_from)
                .filter(|t| t.last_arrival > self.newest_group_from)
                .take(3)
                .count()
                <= 2;
        let alike = if in_turn { mean_group / 2.0 } else { 0.0 };
        for g in fresh {
            let Some(trail) = self.trails.get_mut(&groups[g].key) else {
                continue;
            };
            let size = estimate.size(trail) * trail.weight;
            let cached = groups[g]
                .cached_on
                .iter()
                .copied()
                .filter(|&r| r < replicas.len())
                .min_by(|&a, &b| fleet.order(a, b));
            // Among replicas planned alike, the one whose prefill, with this prompt, comes
            // nearest an average prompt's length times its prompts: a long prompt goes where
            // short ones went, so replicas with as many groups also prefill about as much. A
            // step's slowest requests wait on the busiest prefill queue.
            let prefill_off = |r: usize| {
                if shortest == longest {
                    return 0.0;
                }
                let (blocks, prompts) = prefill[r];
                ((blocks + trail.blocks) as f64 - (prompts + 1) as f64 * mean_blocks).abs()
            };
            let opened_at = &self.opened_at;
            let target = cached.unwrap_or_else(|| {
                let least = fleet.planned[fleet.least_planned()];
                (0..replicas.len())
                    .filter(|&r| fleet.planned[r] <= least + alike)
                    .min_by(|&a, &b| {
                        let recency = |r: usize| {
                            if in_turn {
                                opened_at[r]
                            } else {
                                u64::from(opened_at[r] > window_from)
                            }
                        };
                        if in_turn {
                            prefill[a]
                                .1
                                .cmp(&prefill[b].1)
                                .then(prefill_off(a).total_cmp(&prefill_off(b)))
                                .then(recency(a).cmp(&recency(b)))
                                .then_with(|| fleet.order(a, b))
                        } else {
                            recency(a)
                                .cmp(&recency(b))
                                .then_with(|| fleet.order_by_load(a, b))
                                .then(prefill_off(a).total_cmp(&prefill_off(b)))
                                .then_with(|| fleet.order(a, b))
                        }
                    })
                    .unwrap_or(0)
            });
            self.opened_at[target] = trail.first_arrival + 1;
            fleet.planned[target] += size;
            prefill[target].0 += trail.blocks;
            prefill[target].1 += 1;
            trail.shares.push(Share::new(replicas[target].id, 1.0, 0));
            if let Some(most) = split_fresh_from {
                split_fresh(trail, size, target, most, &mut fleet);
            }
        }

        if let Some(new_homes) = new_homes {
            if still_appearing {
                // One group, when groups are no larger than a quarter of the level or, in a
                // lightly loaded fleet, than what a prompt alone may hold before it spreads;
                // larger groups split as soon as balance needs it. Until the burst has four
                // requests per replica, what a prompt alone may hold: a client that lagged at
                // the start delivers its first prompts in one window, which looks like a whole
                // burst of a few groups.
                let alone = (4 * replicas.len()) as f64 * per_member;
                if weight_seen < alone {
                    fleet.tolerate(alone);
                } else if mean_group <= (fleet.level / 4.0).max(alone) {
                    fleet.tolerate(mean_group);
                }
            }
            self.rebalance(&mut fleet, &estimate, new_homes);
        }
        self.prefill = prefill;
        self.latest.record(now_ms, groups, &fleet, &base);
        self.latest.new_homes = new_homes;
        self.latest.second_wave_groups = estimate.second_from.map(|_| estimate.second.groups);
        if starts_burst {
            self.burst_start.clone_from(&self.latest);
        }

        groups
            .iter()
            .map(|group| match self.trails.get_mut(&group.key) {
                Some(trail) if !group.positions.is_empty() => {
                    route(trail, group.positions.len(), &fleet)
                }
                _ => Vec::new(),
            })
            .collect()
    }

    /// How far over the level (a share of it) a replica may run before it gets a new home, and
    /// a new home may run, while the burst has brought less than [`LATE_IN_BURST`] of the
    /// previous one's requests and lasted less than it (a step of a training loop is much like
    /// the last): from [`URGENT_EXCESS`] at its start down to the ceiling's allowance at that
    /// point, so a burst that ends sooner than the last leaves a replica at most that far
    /// over. `None` (the ceiling alone) before a burst of two or more groups has ended, from
    /// that point on, and when the window is `at_once` (it brings nearly all of the burst so
    /// far and at least [`AT_ONCE`] of the previous one's requests: a burst sent at once,
    /// whose counts are as good as they get).
    fn new_homes_wait(&self, at_once: bool) -> Option<f64> {
        let (_, length_ms) = self.previous_burst?;
        if at_once {
            return None;
        }
        let by_requests = self.share_of_previous();
        let elapsed_ms = self.now_ms.saturating_sub(self.burst_from_ms);
        // By time, a burst is only as far as the late point once it has lasted as long as the
        // last one: a client's spread and the windows' cuts vary from step to step. Time also
        // ends the wait for a step smaller than the last that takes as long. A last burst that
        // reached the router in one window has no length to go by.
        let by_time = if length_ms == 0 {
            0.0
        } else {
            elapsed_ms as f64 / length_ms as f64
        };
        let progress = by_requests.max(LATE_IN_BURST * by_time);
        (progress < LATE_IN_BURST)
            .then(|| URGENT_EXCESS - (URGENT_EXCESS - ALLOWANCE / 2.0) * progress / LATE_IN_BURST)
    }

    /// How far, as a share of its level, a replica's planned load may still be off when the
    /// burst has brought `settled` of the previous one's requests, spread over `replicas`: the
    /// relative spread of a count of a replica's share of members, a share `settled` of them
    /// seen, taken for the whole (`√((1 − s) / (s · m))`, `m` the previous burst's requests
    /// per replica). It is 0 once the burst has brought as many requests as the last.
    fn count_noise(&self, settled: f64, replicas: usize) -> f64 {
        let Some((requests, _)) = self.previous_burst else {
            return 0.0;
        };
        let members = requests as f64 / replicas.max(1) as f64;
        let seen = settled.max(f64::EPSILON);
        ((1.0 - seen) / (seen * members)).sqrt()
    }

    /// Whether the window being placed, of `window_requests`, brings nearly all of the burst so
    /// far and, after a previous burst, at least [`AT_ONCE`] of its requests: a burst sent at
    /// once, whose counts are as good as they get.
    fn brings_burst_at_once(&self, window_requests: u64) -> bool {
        let before_window = self.burst_requests().saturating_sub(window_requests);
        before_window * 10 < window_requests
            && self
                .previous_burst
                .is_none_or(|(requests, _)| window_requests as f64 >= AT_ONCE * requests as f64)
    }

    /// How much of the previous burst's requests this one has brought, at most all (none
    /// without a previous burst): how close its counts are to its groups' final sizes, when
    /// bursts are alike.
    fn share_of_previous(&self) -> f64 {
        let Some((requests, _)) = self.previous_burst else {
            return 0.0;
        };
        (self.burst_requests() as f64 / requests.max(1) as f64).min(1.0)
    }

    /// The requests of the current burst so far.
    fn burst_requests(&self) -> u64 {
        self.arrivals.saturating_sub(self.burst_from)
    }

    /// The groups still arriving: their last member came within eight of their mean gaps
    /// between members, or within a batch window (at most half the memory; a group seen once,
    /// within a quarter of it). The plan balances their whole estimated sizes; a group that
    /// stopped arriving weighs only through its requests still in flight, which the replicas'
    /// carried load holds (and is followed again if another of its requests comes).
    ///
    /// A pause of the whole stream — the client or the router stalled, and what was sent
    /// meanwhile comes in one window — is not a group stopping: past its pause, a group also
    /// needs eight of its mean gaps counted in requests that arrived without it, unless the
    /// pause lasted four times its limit (the next step of a training loop, say). When the
    /// stream resumes with none of the paused groups, only others, the next burst has begun
    /// (the next step after the slow tail of the last), and the paused groups have stopped.
    /// So have the groups of two or more the stream left when it resumes anew
    /// ([`BurstPlan::resumes_anew`]), within their pause or not.
    fn active(&self) -> impl Iterator<Item = &Trail> + Clone {
        self.trails.values().filter(|t| self.is_active(t))
    }

    fn is_active(&self, trail: &Trail) -> bool {
        self.standing(trail) != Standing::Stopped
    }

    /// Where `trail`'s group stands in the window being placed (see [`BurstPlan::active`]). Only
    /// a group with members in the current burst can be stalled: once the next burst has
    /// begun, a group of the last one that paused past its limit has stopped.
    fn standing(&self, trail: &Trail) -> Standing {
        let paused_ms = self.now_ms.saturating_sub(trail.last_ms);
        if trail.seen < 2 {
            // No pace yet: a group's second member may be far behind its first.
            return if paused_ms <= self.memory_ms / 4 {
                Standing::Arriving
            } else {
                Standing::Stopped
            };
        }
        if trail.last_arrival < self.resumed_from {
            return Standing::Stopped;
        }
        let members_between = trail.seen as u64 - 1;
        let pace = (trail.last_ms - trail.first_ms) / members_between;
        let limit = (8 * pace).max(self.window_ms).min(self.memory_ms / 2);
        if paused_ms <= limit {
            return Standing::Arriving;
        }
        let arrivals_gap = (trail.last_arrival - trail.first_arrival).div_ceil(members_between);
        let arrived_without = self.arrivals.saturating_sub(trail.last_arrival + 1);
        if trail.last_arrival >= self.burst_from
            && paused_ms <= 4 * limit
            && arrived_without < 8 * arrivals_gap.max(1)
        {
            Standing::Stalled
        } else {
            Standing::Stopped
        }
    }

    /// Whether the window being placed at `now_ms` resumes the stream anew: it comes after a
    /// pause of at least a quarter of a batch window (and, once the burst has [`STEP_GROUPS`]
    /// groups of two or more, longer than it had lasted), brings no member of a group of two
    /// or more still active, and brings [`STEP_GROUPS`] new groups of two or more — or one,
    /// when the groups left are fewer than a step's and each has brought four requests per
    /// replica (a large prompt alone, sent many times: the next step may come prompt by
    /// prompt, one new group at a time). The stream paused and came back with the next burst:
    /// the groups it left have stopped, though a batch window has not yet passed since their
    /// last member, and are no part of the new burst. In a burst of a step's groups, a pause
    /// shorter than the burst so far is a client's stall within it (prompts sent one after
    /// the other, whose earlier groups are complete, resume with new ones too), and so is any
    /// pause once the burst has brought less than half of the previous one's requests in less
    /// than half its length: a client whose first prompts left in a clump.
    fn resumes_anew(&self, now_ms: u64, groups: &[WindowGroup<'_>], replicas: usize) -> bool {
        let (mut burst_groups, mut least_seen, mut last_grown_ms) = (0, usize::MAX, None);
        for trail in self.active().filter(|t| t.seen > 1) {
            burst_groups += 1;
            least_seen = least_seen.min(trail.seen);
            last_grown_ms = last_grown_ms.max(Some(trail.last_ms));
        }
        // From the last member of a group of two or more: the new burst's first request may
        // have come alone, in a window of its own.
        let paused_ms = now_ms.saturating_sub(last_grown_ms.unwrap_or(self.latest.at_ms));
        if paused_ms < self.window_ms / 4 {
            return false;
        }
        let lasted_ms = self.latest.at_ms.saturating_sub(self.burst_from_ms);
        if paused_ms < lasted_ms && burst_groups >= STEP_GROUPS {
            return false;
        }
        // A burst that has brought less than half of the last one's requests, in less than half
        // its time, is a step whose client paused early (its first prompts came in a clump),
        // not a step's slow tail.
        if self.previous_burst.is_some_and(|(requests, length_ms)| {
            self.burst_requests() * 2 < requests && lasted_ms * 2 < length_ms
        }) {
            return false;
        }
        let mut new_groups = 0;
        for group in groups.iter().filter(|g| !g.positions.is_empty()) {
            match self.trails.get(&group.key) {
                Some(trail) if trail.seen > 1 && self.is_active(trail) => return false,
                Some(_) => {}
                None => new_groups += usize::from(group.positions.len() > 1),
            }
        }
        let few_large = (1..STEP_GROUPS).contains(&burst_groups) && least_seen >= 4 * replicas;
        new_groups >= if few_large { 1 } else { STEP_GROUPS }
    }

    /// Whether the burst's groups look all known: twice as many members as there are
    /// remembered groups have arrived since the newest one's first member — or, so that lone
    /// requests beside a burst (each a group of one) cannot hold its splits back forever, twice
    /// as many as there are groups of two or more, and four per replica, since the newest of
    /// those.
    fn groups_look_complete(&self, burst_groups: u64, replicas: u64) -> bool {
        let since = |from: u64| self.arrivals.saturating_sub(from);
        // A prompt alone may be the first of a burst arriving prompt by prompt: it spreads
        // only once four requests per replica came without a second prompt showing up.
        let alone = if burst_groups <= 1 { 4 * replicas } else { 0 };
        since(self.newest_from) >= (2 * self.active().count() as u64).max(alone)
            || since(self.newest_group_from) >= (4 * burst_groups).max(8 * replicas).max(alone)
    }

    /// Whether new groups are still showing up at the pace they have so far: fewer arrivals
    /// than four of the usual spacings between groups' first members have come since the
    /// newest one (four, because a client's jitter blurs the spacing of prompts sent one
    /// after the other by about half a group). Such prompts keep the burst in this state
    /// until its end, and the next group will go to the replicas the earlier ones left
    /// lighter.
    fn groups_still_appearing(&self) -> bool {
        self.arrivals.saturating_sub(self.newest_group_from) < 4 * self.new_group_spacing()
    }

    /// Where (in `arrivals`) a second wave of groups began while the first was still arriving
    /// (the next step of a training loop sent before the last one ended), if one did: at least
    /// four groups (and an eighth as many as the first wave has) whose first members came after
    /// a pause in new groups at least twice as long as the first wave has groups and eight of
    /// its spacings between them, once a first wave of at least four groups had brought
    /// [`WAVE_UNDER_WAY`] requests per group, and whose counts grow, since their first
    /// members, at least 70% as fast per millisecond as the first wave's, on average over the
    /// groups and over their requests pooled. The groups of one burst all begin within its
    /// first few requests each, and those that begin late are its smallest, and grow more
    /// slowly; a few of them still young can look fast by one of the two measures, seldom by
    /// both.
    fn second_wave(&self) -> Option<u64> {
        let mut firsts = self.first_arrivals.borrow_mut();
        firsts.clear();
        firsts.extend(
            self.active()
                .filter(|t| t.seen > 1)
                .map(|t| t.first_arrival),
        );
        if firsts.len() < 4 {
            return None;
        }
        firsts.sort_unstable();
        let (k, pause) = firsts
            .windows(2)
            .enumerate()
            .map(|(i, w)| (i + 1, w[1] - w[0]))
            .max_by_key(|&(i, pause)| (pause, std::cmp::Reverse(i)))?;
        let (first_wave, second_wave) = (k, firsts.len() - k);
        let spacing = (firsts[k - 1] - firsts[0]) / (first_wave as u64 - 1).max(1);
        let from = firsts[k];
        let growth = |second: bool| {
            let (mut per_group, mut grown, mut ages_ms, mut groups) = (0.0, 0.0, 0.0, 0.0);
            for trail in self
                .active()
                .filter(|t| t.seen > 1 && (t.first_arrival >= from) == second)
            {
                let age_ms = self.now_ms.saturating_sub(trail.first_ms).max(1) as f64;
                per_group += (trail.seen - 1) as f64 / age_ms;
                grown += (trail.seen - 1) as f64;
                ages_ms += age_ms;
                groups += 1.0;
            }
            (
                per_group / f64::max(groups, 1.0),
                grown / f64::max(ages_ms, 1.0),
            )
        };
        let ((second_per_group, second_pooled), (first_per_group, first_pooled)) =
            (growth(true), growth(false));
        (first_wave >= 4
            && second_wave >= 4.max(first_wave / 8)
            && pause >= 2 * first_wave as u64
            && pause > 8 * spacing
            && from - firsts[0] >= WAVE_UNDER_WAY * first_wave as u64
            && second_per_group >= 0.7 * first_per_group
            && second_pooled >= 0.7 * first_pooled)
            .then_some(from)
    }

    /// Arrivals between the first members of successive groups of two or more, over the
    /// active ones: about one group's size when groups arrive one after the other, a few
    /// requests when a burst's groups are shuffled together.
    fn new_group_spacing(&self) -> u64 {
        let (mut first, mut last, mut groups) = (u64::MAX, 0, 0u64);
        for trail in self.active().filter(|t| t.seen > 1) {
            first = first.min(trail.first_arrival);
            last = last.max(trail.first_arrival);
            groups += 1;
        }
        if groups < 2 {
            return 0;
        }
        (last - first) / (groups - 1)
    }

    /// Moves parts of groups from replicas planned above the ceiling to replicas planned below
    /// the level, and to replicas below the floor from the most planned one.
    ///
    /// A move first follows the groups that already have homes on several replicas: `over`
    /// hands part of a group it shares with another replica to that one, which may hand part of
    /// another group it shares onwards, and so on to a replica below the level (the path that
    /// can carry the most, found like a widest path). Such a move costs no new placement. What
    /// a shared group can carry there is what its part on the handing replica still holds
    /// beyond the members already sent there: those stay where they are. Only when no replica
    /// below the level can be reached that way (or one below the floor cannot), the largest
    /// group on `over` gets a new home on the least planned replica out of reach. A replica
    /// below the floor while none is above the ceiling pulls from the most planned one, along
    /// shared groups only — unless the burst has brought as many requests as the previous one
    /// and a replica out of reach is out of the balance bound: then the most planned one
    /// gives it a new home. A replica over the ceiling with nothing to move (loaded by other
    /// traffic) is passed over.
    fn rebalance(&mut self, fleet: &mut Fleet<'_>, estimate: &Estimates, new_homes: NewHomes) {
        let floor = fleet.floor();
        if fleet
            .planned
            .iter()
            .all(|&planned| planned <= fleet.ceiling && planned >= floor)
        {
            return;
        }
        let mut links = std::mem::take(&mut self.links);
        links.fill(self, fleet, estimate);
        self.rebalance_along(&mut links, fleet, new_homes);
        self.links = links;
    }

    /// The moves of [`BurstPlan::rebalance`], over `links` filled for this window. A replica
    /// over the level by `new_homes.from` of it or less gets no new home, unless one that far
    /// below the level and below the floor can be reached no other way (then only
    /// `new_homes.waiting` holds it back); a new home that closes a cycle, or goes past
    /// P + R − 1 placements, needs `new_homes.past_bound` of excess or shortfall.
    fn rebalance_along(&mut self, links: &mut Links, fleet: &mut Fleet<'_>, new_homes: NewHomes) {
        let waiting = new_homes.waiting;
        let n = fleet.replicas.len();
        let floor = fleet.floor();
        let mut passed = vec![false; n];
        // Whether this window opened a round of new homes (see [`BurstPlan::open_home_round`]).
        let mut round_open = false;
        // Whether the burst has brought as many requests as the previous one, and the load
        // below which a replica ends out of the balance bound.
        let brought_all = self.share_of_previous() >= 1.0;
        let out_of_bound = fleet.level - balance_bound(fleet.level, fleet.per_member);
        // Each move brings a replica down to the level, another up to it, or a group's part
        // (or what it can carry) on a replica to zero, so the moves are bounded by replicas
        // plus groups; the cap guards.
        for _ in 0..(n + links.keys.len()) * 2 {
            let above = (0..n)
                .filter(|&r| !passed[r] && fleet.planned[r] > fleet.ceiling)
                .max_by(|&a, &b| fleet.order(a, b));
            let (over, pulled) = match above {
                Some(over) => (over, false),
                None if (0..n).any(|r| fleet.planned[r] < floor) => {
                    let Some(over) = (0..n)
                        .filter(|&r| {
                            !passed[r] && fleet.planned[r] > fleet.level + fleet.per_member / 2.0
                        })
                        .max_by(|&a, &b| fleet.order(a, b))
                    else {
                        return;
                    };
                    (over, true)
                }
                None => return,
            };
            let excess = fleet.planned[over] - fleet.level;
            links.widest_from(over, &self.trails, fleet.per_member);
            let reached = |r: usize| links.reached(r, fleet.per_member);
            let below = (0..n)
                .filter(|&r| r != over && reached(r))
                .filter(|&r| fleet.planned[r] + fleet.per_member / 2.0 < fleet.level)
                .min_by(|&a, &b| fleet.order(a, b));
            // A replica out of reach gets a new home only for a shortfall as large as the excess
            // that gets an over replica one: each is a prefill.
            let rescued_below = floor.min(fleet.level * (1.0 - new_homes.from));
            let stranded = (0..n).any(|r| !reached(r) && fleet.planned[r] < rescued_below);
            // Once the burst has brought as many requests as the last one, a replica out of
            // reach and out of the balance bound (further below the level than its allowance,
            // or two members) will end there: with no replica over the ceiling to give it a
            // new home, the most planned one does, and the replicas it then leaves short pull
            // along the groups they share with it.
            let rescue = pulled
                && brought_all
                && (0..n).any(|r| !reached(r) && fleet.planned[r] < out_of_bound);
            match below {
                Some(target) if !stranded || fleet.planned[target] < floor => {
                    let amount = excess
                        .min(fleet.level - fleet.planned[target])
                        .min(links.width[target]);
                    links.shift_along(target, amount, &mut self.trails);
                    fleet.planned[over] -= amount;
                    fleet.planned[target] += amount;
                    continue;
                }
                _ if pulled && !rescue => {
                    passed[over] = true;
                    continue;
                }
                _ => {}
            }
            // A new home: the largest group on `over`, to the least planned replica out of
            // reach.
            let largest = links.on[over]
                .iter()
                .filter_map(|&g| {
                    let k = links.share_on(g, over)?;
                    Some((
                        g,
                        k,
                        self.trails[&links.keys[g]].shares[k].part * links.sizes[g],
                    ))
                })
                .filter(|&(_, _, load)| load > 0.0)
                .max_by(|a, b| {
                    a.2.total_cmp(&b.2)
                        .then_with(|| links.keys[b.0].cmp(&links.keys[a.0]))
                });
            let outside = (0..n)
                .filter(|&r| !links.reached(r, fleet.per_member))
                .min_by(|&a, &b| fleet.order(a, b));
            let held = if stranded {
                waiting.unwrap_or(0.0)
            } else {
                new_homes.from
            };
            // A new home past P + R − 1 placements, or one that closes a cycle of groups and
            // replicas (and so spends what a later home joining two separate trees would need),
            // is worth it only to keep a replica within the balance bound.
            let held = match outside {
                Some(target)
                    if links.placements(&self.trails) + 1 > links.keys.len() + n - 1
                        || links.joined_from(over, target) =>
                {
                    let deficit = fleet.level - fleet.planned[target];
                    if stranded && deficit > new_homes.past_bound * fleet.level {
                        held
                    } else {
                        held.max(new_homes.past_bound)
                    }
                }
                _ => held,
            };
            let needed = if rescue {
                outside.map_or(0.0, |target| fleet.level - fleet.planned[target])
            } else {
                excess
            };
            if needed <= (held * fleet.level).max(new_homes.lumps) {
                passed[over] = true;
                continue;
            }
            let (Some((g, k, load)), Some(target)) = (largest, outside) else {
                passed[over] = true;
                continue;
            };
            // While new homes wait, the new one may run as far over the level as `over` may.
            let room = fleet.level + waiting.unwrap_or(0.0) * fleet.level - fleet.planned[target];
            let amount = load.min(needed).min(room);
            // A new home gets only members still to come. Half a member or less would only
            // scatter single requests (and a group of two stays whole where it would even out
            // one request).
            let received = amount.min(links.movable(&self.trails, g, k));
            if received <= fleet.per_member / 2.0 || links.sizes[g] <= 0.0 {
                passed[over] = true;
                continue;
            }
            round_open = round_open || self.open_home_round(n);
            if !round_open {
                passed[over] = true;
                continue;
            }
            links.add_home(g, k, target, amount, &mut self.trails, fleet);
            fleet.planned[over] -= amount;
            fleet.planned[target] += amount;
        }
    }

    /// Whether the window being placed may open a round of new homes, over `replicas`; when it
    /// may, the next round is set from it. New homes come in rounds: once a window opened one,
    /// the next window to open one must come after the burst has brought another replica's
    /// share of the previous burst's requests, or lasted another [`HOME_ROUND_TIME`] shares of
    /// its length. A window decides on the counts so far, and a client whose burst reaches the
    /// router in many small windows would otherwise have each of them correct the last one's
    /// guess with a prefill of its own; a round is about what one window of a replica's share
    /// would decide. No rounds without a previous burst to measure them by
    /// ([`BurstPlan::home_rounds_measure`]), nor once the burst has brought [`HOME_ROUNDS_END`]
    /// of its requests or lasted that share of its length.
    fn open_home_round(&mut self, replicas: usize) -> bool {
        let Some((requests, length_ms)) = self.home_rounds_measure() else {
            return true;
        };
        let elapsed_ms = self.now_ms.saturating_sub(self.burst_from_ms);
        let near_end = self.share_of_previous() >= HOME_ROUNDS_END
            || elapsed_ms as f64 >= HOME_ROUNDS_END * length_ms as f64;
        let (from, from_ms) = self.next_home_round;
        let due = self.arrivals >= from || self.now_ms >= from_ms;
        if !(near_end || due) {
            return false;
        }
        let replicas = replicas.max(1) as u64;
        let round_ms = HOME_ROUND_TIME * length_ms as f64 / replicas as f64;
        self.next_home_round = (
            self.arrivals + requests / replicas,
            self.now_ms + round_ms as u64,
        );
        true
    }

    /// The previous burst's requests and length, when rounds of new homes are measured by it: it
    /// must have a length (one that came in one window says nothing of how a client spreads
    /// the next).
    fn home_rounds_measure(&self) -> Option<(u64, u64)> {
        self.previous_burst.filter(|&(_, length_ms)| length_ms > 0)
    }

    /// A burst starts with its first member, `window_from` (at `from_ms`): the group sizes of
    /// the one before it become the prior of the size estimate, and its requests and length
    /// (to `last_ms`, its last window that brought a group a second or later member) the
    /// measure of how far the new one has come.
    fn end_burst(&mut self, window_from: u64, from_ms: u64, last_ms: u64) {
        let from = self.burst_from;
        let length = (
            window_from.saturating_sub(from),
            last_ms.saturating_sub(self.burst_from_ms),
        );
        let mut sizes = std::mem::take(&mut self.forgotten_sizes);
        let room = PRIOR_GROUPS.saturating_sub(sizes.len());
        sizes.extend(
            self.trails
                .values()
                .filter(|t| t.seen > 1 && (from..window_from).contains(&t.first_arrival))
                .map(|t| t.seen)
                .take(room),
        );
        if sizes.len() >= 2 {
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            let replaced = std::mem::replace(&mut self.previous_sizes, sizes);
            if is_size_mix(&self.previous_sizes) {
                self.unequal_sizes.clear();
            } else if is_size_mix(&replaced) {
                self.unequal_sizes = replaced;
            }
            self.previous_burst = Some(length);
        }
        self.burst_from = window_from;
        self.burst_from_ms = from_ms;
    }

    /// Drops the groups not seen for `memory_ms`, at most once per quarter of it (and whenever
    /// the clock went back, so a stray future time cannot stop the sweeps).
    fn sweep(&mut self, now_ms: u64) {
        if now_ms >= self.swept_ms && now_ms - self.swept_ms < self.memory_ms / 4 {
            return;
        }
        self.swept_ms = now_ms;
        let memory_ms = self.memory_ms;
        let from = self.burst_from;
        let forgotten = &mut self.forgotten_sizes;
        self.trails.retain(|_, t| {
            let kept = t.last_ms.saturating_add(memory_ms) >= now_ms;
            if !kept && t.seen > 1 && t.first_arrival >= from && forgotten.len() < PRIOR_GROUPS {
                forgotten.push(t.seen);
            }
            kept
        });
    }
}

/// Splits a group just placed whole on `target` (its only share, `size` its estimated load) while
/// the replica it is on is planned above `most`: the part that brings that replica down to the
/// level goes on to the least planned replica the group is not on yet.
fn split_fresh(trail: &mut Trail, size: f64, mut target: usize, most: f64, fleet: &mut Fleet<'_>) {
    if size <= 0.0 {
        return;
    }
    let mut k = trail.shares.len() - 1;
    for _ in 1..fleet.replicas.len() {
        if fleet.planned[target] <= most {
            return;
        }
        let on_group = |r: usize| trail.shares.iter().any(|s| fleet.position(s) == Some(r));
        let Some(next) = (0..fleet.replicas.len())
            .filter(|&r| !on_group(r))
            .min_by(|&a, &b| fleet.order(a, b))
        else {
            return;
        };
        let overflow = (fleet.planned[target] - fleet.level).min(trail.shares[k].part * size);
        k = trail.hand_over(k, next, overflow / size, fleet);
        fleet.planned[target] -= overflow;
        fleet.planned[next] += overflow;
        target = next;
    }
}

/// Sends `members` of a group, each to the replica furthest below its part of the members seen.
fn route(trail: &mut Trail, members: usize, fleet: &Fleet<'_>) -> Vec<usize> {
    let seen = trail.seen as f64;
    (0..members)
        .map(|_| {
            let best = trail
                .shares
                .iter()
                .enumerate()
                .filter_map(|(k, s)| fleet.position(s).map(|r| (k, r, s)))
                .max_by(|(_, a, x), (_, b, y)| {
                    (x.part * seen - x.sent as f64)
                        .total_cmp(&(y.part * seen - y.sent as f64))
                        .then_with(|| fleet.order(*b, *a))
                })
                .map(|(k, r, _)| (k, r));
            match best {
                Some((k, r)) => {
                    trail.shares[k].sent += 1;
                    r
                }
                None => {
                    // No part is on a candidate of this window: the least planned one takes
                    // the member, the group's other parts stay for when their replicas return.
                    let r = fleet.least_planned();
                    trail.shares.push(Share::new(fleet.replicas[r].id, 0.0, 1));
                    r
                }
            }
        })
        .collect()
}

/// The active groups of one rebalance, and the replicas each has a home on: the links along
/// which load moves from replica to replica without a new placement.
#[derive(Debug, Default)]
struct Links {
    keys: Vec<GroupKey>,
    /// Each group's estimated load (its estimated size times a member's weight).
    sizes: Vec<f64>,
    /// Per group, its homes among the replicas: (replica position, share index). Entries past
    /// the groups' count are spare buffers of earlier windows.
    homes: Vec<Vec<(usize, usize)>>,
    /// Per replica, the groups with a home there.
    on: Vec<Vec<usize>>,
    /// The last widest-path search: the most a path from its source can carry to each
    /// replica, and the hop each is reached by (from, group, share there, share here).
    width: Vec<f64>,
    hop: Vec<Option<(usize, usize, usize, usize)>>,
    done: Vec<bool>,
    /// The search's replicas reached and not done yet.
    frontier: Vec<usize>,
    /// The replicas the last [`Links::joined_from`] found connected to its source.
    joined: Vec<bool>,
}

impl Links {
    /// Becomes the links of `plan`'s active groups over `fleet`, reusing its buffers: the
    /// plan keeps one `Links` between windows, so a warm window allocates nothing for it.
    fn fill(&mut self, plan: &BurstPlan, fleet: &Fleet<'_>, estimate: &Estimates) {
        let n = fleet.replicas.len();
        self.keys.clear();
        self.sizes.clear();
        self.homes.iter_mut().for_each(Vec::clear);
        self.on.iter_mut().for_each(Vec::clear);
        self.on.resize_with(n, Vec::new);
        self.width.resize(n, 0.0);
        self.hop.resize(n, None);
        self.done.resize(n, false);
        let active = plan.trails.iter().filter(|(_, t)| plan.is_active(t));
        for (g, (key, trail)) in active.enumerate() {
            if self.homes.len() == g {
                self.homes.push(Vec::new());
            }
            for (k, share) in trail.shares.iter().enumerate() {
                if let Some(r) = fleet.position(share) {
                    self.homes[g].push((r, k));
                    self.on[r].push(g);
                }
            }
            self.keys.push(*key);
            self.sizes.push(estimate.size(trail) * trail.weight);
        }
    }

    /// The index of group `g`'s share on replica `r`, if it has a home there.
    fn share_on(&self, g: usize, r: usize) -> Option<usize> {
        self.homes[g]
            .iter()
            .find(|&&(home, _)| home == r)
            .map(|&(_, k)| k)
    }

    /// What group `g`'s share `k` can hand on: its part's load beyond the members already sent
    /// there, which stay where they are.
    fn movable(&self, trails: &BTreeMap<GroupKey, Trail>, g: usize, k: usize) -> f64 {
        let trail = &trails[&self.keys[g]];
        let share = &trail.shares[k];
        let sent = share.sent as f64 * self.sizes[g] / trail.seen.max(1) as f64;
        (share.part * self.sizes[g] - sent).max(0.0)
    }

    /// Finds, for every replica, the path from `source` along shared groups that can carry
    /// the most to it; hops that carry half a member or less are not taken.
    fn widest_from(&mut self, source: usize, trails: &BTreeMap<GroupKey, Trail>, per_member: f64) {
        let least = per_member / 2.0;
        self.width.fill(0.0);
        self.hop.fill(None);
        self.done.fill(false);
        self.width[source] = f64::INFINITY;
        // The replicas reached by more than `least` and not done yet.
        self.frontier.clear();
        self.frontier.push(source);
        loop {
            let width = &self.width;
            let next = (0..self.frontier.len()).max_by(|&i, &j| {
                let (a, b) = (self.frontier[i], self.frontier[j]);
                width[a].total_cmp(&width[b]).then(b.cmp(&a))
            });
            let Some(i) = next else {
                return;
            };
            let a = self.frontier.swap_remove(i);
            self.done[a] = true;
            for &g in &self.on[a] {
                let Some(ka) = self.share_on(g, a) else {
                    continue;
                };
                let carried = self.width[a].min(self.movable(trails, g, ka));
                if carried <= least {
                    continue;
                }
                for &(b, kb) in &self.homes[g] {
                    if !self.done[b] && carried > self.width[b] {
                        if self.width[b] <= least {
                            self.frontier.push(b);
                        }
                        self.width[b] = carried;
                        self.hop[b] = Some((a, g, ka, kb));
                    }
                }
            }
        }
    }

    /// The (group, replica) placements: homes with a part planned or members sent.
    fn placements(&self, trails: &BTreeMap<GroupKey, Trail>) -> usize {
        self.keys
            .iter()
            .zip(&self.homes)
            .map(|(key, homes)| {
                let shares = &trails[key].shares;
                homes
                    .iter()
                    .filter(|&&(_, k)| shares[k].part > 0.0 || shares[k].sent > 0)
                    .count()
            })
            .sum()
    }

    /// Whether the last widest-path search reached replica `r` with more than half a member.
    fn reached(&self, r: usize, per_member: f64) -> bool {
        self.width[r] > per_member / 2.0
    }

    /// Whether `target` is connected to `source` through groups with homes on both, however
    /// little those can carry.
    fn joined_from(&mut self, source: usize, target: usize) -> bool {
        self.joined.clear();
        self.joined.resize(self.on.len(), false);
        self.joined[source] = true;
        self.frontier.clear();
        self.frontier.push(source);
        while let Some(a) = self.frontier.pop() {
            for &g in &self.on[a] {
                for &(b, _) in &self.homes[g] {
                    if !self.joined[b] {
                        self.joined[b] = true;
                        self.frontier.push(b);
                    }
                }
            }
        }
        self.joined[target]
    }

    /// Moves `amount` of load along the last search's path to `target`: every group on the
    /// way hands that much of its part to its next home.
    fn shift_along(&self, target: usize, amount: f64, trails: &mut BTreeMap<GroupKey, Trail>) {
        let mut at = target;
        while let Some((from, g, ka, kb)) = self.hop[at] {
            if let Some(trail) = trails.get_mut(&self.keys[g]) {
                let part = amount / self.sizes[g];
                trail.shares[ka].part = (trail.shares[ka].part - part).max(0.0);
                trail.shares[kb].part += part;
            }
            at = from;
        }
    }

    /// Moves `amount` of group `g`'s load from its share `k` to a new home on `target`.
    fn add_home(
        &mut self,
        g: usize,
        k: usize,
        target: usize,
        amount: f64,
        trails: &mut BTreeMap<GroupKey, Trail>,
        fleet: &Fleet<'_>,
    ) {
        let Some(trail) = trails.get_mut(&self.keys[g]) else {
            return;
        };
        let kb = trail.hand_over(k, target, amount / self.sizes[g], fleet);
        if self.share_on(g, target).is_none() {
            self.homes[g].push((target, kb));
            self.on[target].push(g);
        }
    }
}

/// The replicas with the load the plan means each to get.
struct Fleet<'a> {
    replicas: &'a [Replica<'a>],
    /// Planned load per replica: what it carries besides the remembered groups, plus each
    /// group's estimated size (times a member's weight) times its part there.
    planned: Vec<f64>,
    /// The level a balanced plan brings the replicas to (those already above it excepted).
    level: f64,
    ceiling: f64,
    /// One member's weight, in the units of `planned`.
    per_member: f64,
}

impl<'a> Fleet<'a> {
    fn new(replicas: &'a [Replica<'a>]) -> Self {
        Fleet {
            replicas,
            planned: vec![0.0; replicas.len()],
            level: 0.0,
            ceiling: 0.0,
            per_member: 1.0,
        }
    }

    /// Sets the level `total` more load brings the least loaded replicas up to, over `base`,
    /// and the ceiling above it; `per_member` is one member's weight.
    fn set_level(&mut self, base: &[f64], total: f64, per_member: f64) {
        let mut sorted = base.to_vec();
        sorted.sort_by(f64::total_cmp);
        let mut below = 0.0;
        self.level = sorted.first().copied().unwrap_or(0.0) + total;
        for (k, &load) in sorted.iter().enumerate() {
            below += load;
            // The level if the k + 1 least loaded replicas share the load.
            self.level = (total + below) / (k + 1) as f64;
            if sorted.get(k + 1).is_none_or(|&next| self.level <= next) {
                break;
            }
        }
        self.ceiling = self.level + (ALLOWANCE / 2.0 * self.level).max(per_member);
        self.per_member = per_member;
    }

    /// As far below the level as the ceiling is above it: a replica planned under it pulls
    /// load to itself.
    fn floor(&self) -> f64 {
        2.0 * self.level - self.ceiling
    }

    /// Lets a replica stay up to `load` above the level before the rebalance takes from it.
    fn tolerate(&mut self, load: f64) {
        self.ceiling = self.ceiling.max(self.level + load);
    }

    /// The position of `share`'s replica in the list, if there.
    fn position(&self, share: &Share) -> Option<usize> {
        let hint = share.at.get();
        if self
            .replicas
            .get(hint)
            .is_some_and(|r| r.id == &*share.replica)
        {
            return Some(hint);
        }
        let found = self.replicas.iter().position(|r| r.id == &*share.replica)?;
        share.at.set(found);
        Some(found)
    }

    /// Orders replicas by planned load, then by carried load and id.
    fn order(&self, a: usize, b: usize) -> std::cmp::Ordering {
        self.order_by_load(a, b)
            .then_with(|| self.replicas[a].id.cmp(self.replicas[b].id))
    }

    /// Orders replicas by planned load, then by carried load.
    fn order_by_load(&self, a: usize, b: usize) -> std::cmp::Ordering {
        self.planned[a].total_cmp(&self.planned[b]).then_with(|| {
            self.replicas[a]
                .running_requests
                .cmp(&self.replicas[b].running_requests)
        })
    }

    fn least_planned(&self) -> usize {
        (0..self.replicas.len())
            .min_by(|&a, &b| self.order(a, b))
            .unwrap_or(0)
    }
}

/// Whether the group sizes of a burst (largest first) are a mix worth keeping as a prior past
/// bursts of equal groups: at least [`STEP_GROUPS`] groups, whose sizes spread around their mean
/// beyond what counts of equal groups would (a count's variance is its mean).
fn is_size_mix(sizes: &[usize]) -> bool {
    if sizes.len() < STEP_GROUPS {
        return false;
    }
    let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
    let variance = sizes
        .iter()
        .map(|&s| (s as f64 - mean).powi(2))
        .sum::<f64>()
        / sizes.len() as f64;
    variance > mean
}

/// Final group sizes predicted from the members seen so far (see the module docs).
struct SizeEstimate {
    /// Per distinct count seen, most first: what a group with that count is expected to be
    /// before its count is looked at, from the size of the group of the same rank in the
    /// previous burst, scaled; empty when that prior is not taken.
    prior: Vec<(usize, f64)>,
    /// The mean count: the prior of a count `prior` does not list.
    mean: f64,
    /// How much of a count's distance from its prior is kept (0: the prior alone).
    kept: f64,
    /// The groups estimated.
    groups: usize,
}

impl SizeEstimate {
    /// The estimate for groups with `counts` members so far; `previous` holds the group sizes
    /// of the previous burst and of the latest one whose groups differed, each largest first
    /// (empty: none known), and `settled` how much of the previous burst's requests this one
    /// has brought (0 to 1).
    fn of(
        counts: impl Iterator<Item = usize> + Clone,
        previous: [&[usize]; 2],
        settled: f64,
    ) -> Self {
        let mut sorted: Vec<usize> = counts.collect();
        let n = sorted.len();
        if n == 0 {
            // No group yet: every count is taken as it is.
            return SizeEstimate {
                prior: Vec::new(),
                mean: 0.0,
                kept: 1.0,
                groups: 0,
            };
        }
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let seen = sorted.iter().sum::<usize>() as f64;
        let mean = seen / n as f64;
        // A count's variance: its mean (Poisson) at the start of a burst, and less the closer
        // the burst is to all its members (a count when a share `settled` of them came varies
        // by its mean times 1 − `settled`). The spread of `n` counts measures that variance
        // only to about √(2 / (n − 1)) of it, so it is taken two of those larger: equal groups
        // whose counts spread a little more than expected still count as equal.
        let margin = 1.0 + 2.0 * (2.0 / n.saturating_sub(1).max(1) as f64).sqrt();
        let noise = (mean * (1.0 - settled) * margin).min(mean);
        // How far the counts spread around a prior.
        let spread = |prior: &[(usize, f64)]| {
            sorted
                .iter()
                .map(|&c| (c as f64 - Self::lookup(prior, c, mean)).powi(2))
                .sum::<f64>()
                / n as f64
        };
        // The priors: every group alike (the samples of an RL step), or each group as large as
        // the group of the same rank in the previous burst (or in the latest unequal one),
        // scaled. A ranked prior is taken when the counts spread around it less than around the
        // one taken so far by more than a count's own variance: sorted, pure noise always fits
        // some ranked prior a little, so a small gain is no evidence that the groups differ.
        let mut prior = Vec::new();
        let mut around = spread(&prior);
        for previous in previous.into_iter().filter(|p| p.len() >= 2) {
            let at = |i: usize| previous[i.min(previous.len() - 1)] as f64;
            let scale = seen / (0..n).map(at).sum::<f64>();
            // Groups with equal counts cannot be told apart: they share their ranks' mean.
            let mut by_rank: Vec<(usize, f64)> = Vec::new();
            // Each distinct count with its number of groups.
            let mut counts: Vec<(usize, usize)> = Vec::new();
            let mut i = 0;
            while i < n {
                let j = i + sorted[i..].iter().take_while(|&&c| c == sorted[i]).count();
                let shared = (i..j).map(at).sum::<f64>() * scale / (j - i) as f64;
                by_rank.push((sorted[i], shared));
                counts.push((sorted[i], j - i));
                i = j;
            }
            let by_rank_around = spread(&by_rank);
            if by_rank_around + noise < around {
                around = by_rank_around;
                // Which size each count has, weighed over every size it could have (see
                // `rank_match`). A count varies by its expected value times what is left of
                // the burst, or by what the counts' spread around their ranks shows, if less:
                // a step smaller than the last is further on than its share of the last one's
                // requests says.
                let count_noise = (1.0 - settled).min(RANK_SPREAD_GAIN * by_rank_around / mean);
                // Each distinct size, as the count it is expected to have by now, with its
                // number of ranks.
                let mut sizes: Vec<(f64, usize)> = Vec::new();
                for expected in (0..n).map(|i| at(i) * scale) {
                    match sizes.last_mut() {
                        Some((last, ranks)) if *last == expected => *ranks += 1,
                        _ => sizes.push((expected, 1)),
                    }
                }
                prior = rank_match::expected_sizes(&counts, &sizes, count_noise).unwrap_or(by_rank);
            }
        }
        // The spread around the prior beyond a count's variance is what the counts tell that
        // the prior does not.
        let kept = if around > noise {
            (around - noise) / around
        } else {
            0.0
        };
        SizeEstimate {
            prior,
            mean,
            kept,
            groups: n,
        }
    }

    /// Whether the counts were found to follow the previous burst's sizes.
    fn takes_prior(&self) -> bool {
        !self.prior.is_empty()
    }

    fn lookup(prior: &[(usize, f64)], count: usize, otherwise: f64) -> f64 {
        prior
            .binary_search_by(|(c, _)| count.cmp(c))
            .map_or(otherwise, |k| prior[k].1)
    }

    fn size(&self, seen: usize) -> f64 {
        let prior = Self::lookup(&self.prior, seen, self.mean);
        prior + self.kept * (seen as f64 - prior)
    }
}

/// The size estimates of the groups of one wave, or of two when a second began while the first
/// was still arriving ([`BurstPlan::second_wave`]): each wave's counts are at their own stage,
/// and only the first wave's follow the previous burst's sizes.
struct Estimates {
    /// Groups whose first member came at or after this arrival are of the second wave.
    second_from: Option<u64>,
    first: SizeEstimate,
    second: SizeEstimate,
    /// What turns the second wave's estimates into the first's units: its groups are expected
    /// to be as large on average as the first wave's (a step of a training loop is much like
    /// the last). Without it, a second wave's groups, only begun, would weigh next to nothing
    /// beside the first's, and would crowd onto whichever replicas the first wave's counts
    /// left behind for the moment.
    second_scale: f64,
}

impl Estimates {
    /// The estimates of `plan`'s active groups, `settled` the share of the previous burst's
    /// requests the first wave has brought.
    fn of(plan: &BurstPlan, settled: f64) -> Self {
        let second_from = plan.second_wave();
        let in_second = |t: &Trail| second_from.is_some_and(|from| t.first_arrival >= from);
        let first = SizeEstimate::of(
            plan.active().filter(|t| !in_second(t)).map(|t| t.seen),
            [&plan.previous_sizes[..], &plan.unequal_sizes],
            settled,
        );
        let second = SizeEstimate::of(
            plan.active().filter(|t| in_second(t)).map(|t| t.seen),
            [&[], &[]],
            0.0,
        );
        let second_scale = if second.mean > 0.0 {
            first.mean / second.mean
        } else {
            1.0
        };
        Estimates {
            second_from,
            first,
            second,
            second_scale,
        }
    }

    /// The estimated size of `trail`'s group.
    fn size(&self, trail: &Trail) -> f64 {
        match self.second_from {
            Some(from) if trail.first_arrival >= from => {
                self.second.size(trail.seen) * self.second_scale
            }
            _ => self.first.size(trail.seen),
        }
    }
}

mod rank_match;

#[cfg(test)]
mod tests;
