//! Seeds of the fleet simulation kept as tests: determinism, and the bugs seeds found (issue
//! 24), each named after what it broke. A seed's plan and history depend on the code, so a
//! change elsewhere may move a bug away from its seed; each test therefore also says what the
//! seed did (its plan), so a seed that no longer exercises the bug shows up as a failed
//! precondition, not as a silent pass.

use timeshard_sim::check::property;
use timeshard_sim::faults::Action;
use timeshard_sim::history::Event;
use timeshard_sim::{Faults, Options};

fn opts() -> Options {
    Options::default()
}

/// The time (ns) of the detail's read or write ("… at t=123 …").
fn at(detail: &str) -> u64 {
    let rest = &detail[detail.find("at t=").expect("a detail names its time") + 5..];
    rest.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).expect("a time")
}

#[test]
fn one_seed_twice_gives_the_same_history_bit_for_bit() {
    let opts = Options { fault_secs: 12, quiet_secs: 20, ..opts() };
    let a = timeshard_sim::run(7, &opts).unwrap();
    let b = timeshard_sim::run(7, &opts).unwrap();
    assert!(a.history.events.len() > 100, "a run that did little proves little: {} events", a.history.events.len());
    assert_eq!(a.history.text(), b.history.text(), "seed 7 ran two ways");
    // And another seed does something else.
    let c = timeshard_sim::run(8, &opts).unwrap();
    assert_ne!(a.history.digest(), c.history.digest());
}

/// Bug 1: with every node's location cleared (a rollout), every CoI block was displaced with
/// no owner to go to, and dropped on every replica: all acknowledged CoI points were lost.
/// Bug 6 on the same run: right after the clearing, both in-CoI owners a coordinator still
/// placed by answered unsettled and the merge of their answers stood (see seed 4).
#[test]
fn seed_2_clearing_every_location_loses_no_acknowledged_point() {
    let out = timeshard_sim::run(2, &opts()).unwrap();
    assert!(
        out.plan.steps.iter().any(|(_, a)| *a == Action::ClearLocations),
        "seed 2 no longer clears the locations; find another seed for this bug"
    );
    let lost: Vec<_> = out
        .failures
        .iter()
        .filter(|f| [property::LAST_COPY, property::ACKED_READABLE, property::STALE_IN_COI].contains(&f.property))
        .collect();
    assert!(lost.is_empty(), "{lost:#?}");
}

/// Bug 2: through a partition that cut one in-CoI owner off, writes counted a stand-in towards
/// W, and reads that asked R = 1 in-CoI owner got the one that missed them.
#[test]
fn seed_0_in_coi_reads_through_a_partition_are_not_stale() {
    let out = timeshard_sim::run(0, &opts()).unwrap();
    let partition = out.plan.steps.iter().find(|(_, a)| matches!(a, Action::Partition { .. })).map(|(t, _)| *t);
    let moved = out
        .plan
        .steps
        .iter()
        .find(|(_, a)| matches!(a, Action::Relocate(..) | Action::ClearLocations))
        .map_or(u64::MAX, |(t, _)| *t);
    assert!(partition.is_some_and(|p| p < moved), "seed 0 no longer partitions the fleet before moving a node");
    // Reads after a location changed are another matter (see README "Simulation": open).
    let stale: Vec<_> =
        out.failures.iter().filter(|f| f.property == property::STALE_IN_COI && at(&f.detail) < moved).collect();
    assert!(stale.is_empty(), "{stale:#?}");
}

/// Bug 5: a coordinator cut off from both in-CoI owners by a one-way partition had two
/// stand-ins acknowledge an in-CoI write; a read through a node that reached the owners asked
/// them and missed it. In-CoI writes now count only in-CoI owners
/// (`placement::in_coi_write_quorum`).
#[test]
fn seed_3_in_coi_writes_count_no_stand_ins() {
    passes_and_plans(3, "cuts the fleet one way", |a| matches!(a, Action::Partition { one_way: true, .. }));
}

/// Runs `seed` with every fault family: its plan still holds an action `reaches` picks (`what`,
/// else the seed no longer reaches its bug), and no property fails.
fn passes_and_plans(seed: u64, what: &str, reaches: impl Fn(&Action) -> bool) {
    let out = timeshard_sim::run(seed, &Options { faults: Faults::all(), ..opts() }).unwrap();
    assert!(
        out.plan.steps.iter().any(|(_, a)| reaches(a)),
        "seed {seed} no longer {what}; find another seed for this bug"
    );
    assert!(out.failures.is_empty(), "{:#?}", out.failures);
}

/// Bug 6: after a member cleared its location, the new in-CoI owners were rightly unsettled,
/// but an in-CoI read that found no settled owner let the merge of their answers stand (older
/// points). In-CoI reads are strict now (`ReadQuorum::strict`): they fail, retryably, until R
/// in-CoI owners answer settled.
#[test]
fn seed_4_in_coi_reads_do_not_stand_on_unsettled_owners() {
    passes_and_plans(4, "clears a node's location", |a| matches!(a, Action::Relocate(_, None)));
}

/// Bug 7: a node learnt that another cleared its location (so it now owned CoI series it did
/// not hold); `latest` asked which index blocks hold entries of R of the class (1) in-CoI
/// owner, itself, which lacked them and still said it was settled (its repair task had not
/// looked at the new view yet), and came back empty. `latest` now asks as every in-CoI read
/// does (every in-CoI owner, settled), and settledness follows the view inside its update
/// (`View::on_change`); either closes this seed.
#[test]
fn seed_109_a_new_owner_is_unsettled_before_any_read_places_by_the_new_view() {
    passes_and_plans(109, "clears a node's location", |a| matches!(a, Action::Relocate(_, None)));
}

/// A seed with every fault family that passes every property: crashes, partitions, lossy
/// links, disk faults, skewed clocks, a departure.
#[test]
fn seed_1_passes_every_property() {
    let out = timeshard_sim::run(1, &Options { faults: Faults::all(), ..opts() }).unwrap();
    assert!(out.failures.is_empty(), "{:#?}", out.failures);
}

/// Bug 4: a member that cleared or moved its location handed its context-of-interest series to
/// the nearest others, which kept answering reads as settled without holding them: reads after
/// the move returned nothing, or older points (seeds 101, 103, 106 and 109 of 100..110).
#[test]
fn seed_106_a_relocation_does_not_leave_new_owners_answering_as_settled() {
    let out = timeshard_sim::run(106, &Options { faults: Faults::all(), ..opts() }).unwrap();
    assert!(
        out.plan.steps.iter().any(|(_, a)| matches!(a, Action::Relocate(..) | Action::ClearLocations)),
        "seed 106 no longer moves a node; find another seed for this bug"
    );
    assert!(out.failures.is_empty(), "{:#?}", out.failures);
}

/// Bug 8: a misdirected write left one block of node 1 damaged; after node 0 departed, node 2,
/// a new third owner of 23 blocks, asked node 1 for them in bulk, and every bulk read failed
/// whole on the damaged one. The blocks that session planned stayed "taken" for the round,
/// so node 2's session with node 3, which held them intact, skipped them: 2 copies at the
/// end, RF 3. A damaged block is now left out of a bulk read, and what a peer did not send is
/// not taken (`timeshard_proto::repair::Undelivered`).
#[test]
fn seed_1042_a_damaged_block_on_one_replica_does_not_keep_a_new_owner_below_rf() {
    passes_and_plans(1042, "misdirects a write and has a node depart", |a| matches!(a, Action::Misdirect(_)));
    let plan = timeshard_sim::faults::Plan::draw(1042, &timeshard_sim::run::plan_spec(&opts()));
    assert!(plan.steps.iter().any(|(_, a)| matches!(a, Action::Depart(_))), "seed 1042 no longer has a node depart");
}

/// Bug 9: a misdirected write left node 6's copy of a block it no longer owned unreadable
/// (3 points, against the owners' 11); every handoff pass failed on it (which held back the
/// other blocks for the same owners too) and it never went: the copies did not converge. A
/// damaged displaced block now counts as handed off to an owner that holds a copy.
#[test]
fn seed_1005_a_damaged_displaced_copy_does_not_stay_forever() {
    passes_and_plans(1005, "misdirects a write", |a| matches!(a, Action::Misdirect(_)));
}

/// Bug 10: node 5 moved next to the CoI series (every other location had been cleared, so it
/// was their only in-CoI owner) while a partition cut it, with nodes 2 and 7, off from the
/// nodes holding them. Its catch-up round pulled from 2 and 7 only, counted as complete, and
/// `latest` through that side returned a point 1.2 s older than an acknowledged write. A
/// round that left out a neighbour down to the node no longer settles it
/// (`Settle::round_complete`), so no in-CoI read through that side can succeed until the
/// partition heals: that is checked too, as other fixes moved the run so that the stale
/// answers themselves no longer show (the reads that still succeeded did).
#[test]
fn seed_1046_an_owner_cut_off_by_a_partition_does_not_settle() {
    let out = timeshard_sim::run(1046, &opts()).unwrap();
    let moved = out.plan.steps.iter().find(|(_, a)| matches!(a, Action::Relocate(5, Some(_)))).map(|(t, _)| *t);
    let cut = out.plan.steps.iter().any(
        |(t, a)| matches!(a, Action::Partition { a, one_way: false, .. } if *a == [2, 5, 7] && moved.is_some_and(|m| *t < m)),
    );
    let healed = out.plan.steps.iter().find(|(_, a)| *a == Action::HealAll).map(|(t, _)| *t).expect("a plan heals");
    let moved = moved.filter(|_| cut).expect("seed 1046 no longer moves node 5 while nodes 2, 5 and 7 are cut off");
    assert!(out.failures.is_empty(), "{:#?}", out.failures);
    let answered: Vec<&Event> = out
        .history
        .events
        .iter()
        .filter(|e| {
            matches!(e, Event::Latest { invoked, via, error: None, .. } if (moved..healed).contains(invoked) && [2, 5, 7].contains(via))
        })
        .collect();
    assert!(answered.is_empty(), "in-CoI reads answered by an owner that could not have caught up: {answered:#?}");
}

/// Bug 11: a flipped bit in node's store `FORMAT` file ("FORMAT does not name a format
/// version") kept that node from ever starting again, with all its data intact beside it. The
/// file carries a checksum now; a damaged one beside a log and an index is reported and
/// rewritten (the index and log headers still carry and check the version).
#[test]
fn seed_3021_a_flipped_bit_in_format_does_not_keep_a_node_down() {
    passes_and_plans(3021, "flips a bit on a disk", |a| matches!(a, Action::BitFlip(_)));
}

/// A flipped bit damaged a block on node 1, and late points that could not merge into it stayed
/// in memory: its digest in memory matched no replica's, and the copy was never fetched again
/// (reads left it out). A block a read found damaged is now dropped, its unsealed points kept,
/// and fetched again from a replica (`repair::damaged`, `Store::drop_damaged`).
#[test]
fn seed_10059_a_damaged_block_is_fetched_again_from_a_replica() {
    passes_and_plans(10059, "flips a bit on a disk", |a| matches!(a, Action::BitFlip(_)));
}

/// Locations cleared one by one: a coordinator that had seen two clearings placed a CoI series
/// on two members that had not seen them yet. Neither knew it was an in-CoI owner, so neither
/// was catching up, and both answered settled without the last 15 s of acknowledged writes:
/// `latest` returned an older point. A read that counts a member as an in-CoI owner now says
/// so (`in_coi`), and the member answers settled only if its own view agrees
/// (`peer_scope::vouches_in_coi`). Seed 10948 broke the same way.
#[test]
fn seed_10201_an_owner_that_has_not_seen_a_location_change_does_not_vouch_for_it() {
    passes_and_plans(10201, "clears the locations", |a| *a == Action::ClearLocations);
    passes_and_plans(10948, "clears the locations", |a| *a == Action::ClearLocations);
}

/// A misdirected write damaged a block of `m.load` that no read asked for again: reads alone
/// find damage, so the copy was never dropped and fetched again, and the block ended at two
/// good copies of three. The repair driver now scrubs a step of the store after each round
/// (`Store::scrub`). Seeds 10430, 10767, 10824, 10847, 10852 and 10870 broke the same way.
#[test]
fn seed_10037_a_scrub_finds_damage_no_read_came_across() {
    passes_and_plans(10037, "misdirects a write", |a| matches!(a, Action::Misdirect(_)));
    passes_and_plans(10870, "misdirects a write", |a| matches!(a, Action::Misdirect(_)));
}

/// A node's clock jumped back a minute: its displaced copies, last written "in the future" by
/// its clock, waited for the clock to pass that time again before handoff, and the stale copy
/// was still there at the end (seeds 10125, 10322, 10359, 10368, 10433, 10510, 10542 and 10957
/// too). A write time ahead of the clock now counts as settled for handoff.
#[test]
fn seed_10220_a_clock_that_jumped_back_does_not_hold_a_displaced_copy() {
    passes_and_plans(
        10220,
        "jumps a clock back a minute",
        |a| matches!(a, Action::Skew(_, s) if *s <= -60_000_000_000),
    );
}

/// An owner whose clock lagged a minute compared blocks with its replicas using its own cutoff:
/// the replicas left out everything they wrote within the lag, and the owner kept 25 of 31
/// points to the end. A replica answers with its own cutoff when that is later.
#[test]
fn seed_10743_an_owner_whose_clock_lags_still_fetches_what_it_lacks() {
    passes_and_plans(
        10743,
        "jumps a clock back a minute",
        |a| matches!(a, Action::Skew(_, s) if *s <= -60_000_000_000),
    );
}

/// The simulator healed only the disks of nodes up: a node that filled its disk and then left
/// never got it back, could not record its drops, and kept stale displaced copies to the end.
/// A leaving node still running is healed like any other.
#[test]
fn seed_12001_a_node_leaving_with_a_full_disk_gets_it_back() {
    passes_and_plans(12001, "fills a disk and then makes that node leave", |a| matches!(a, Action::Leave(3)));
}

/// The control plane under simulation: seed 24 clears every device's location while the
/// control plane is out of reach of the whole fleet. The nodes keep running the generation
/// they applied, get the new one when the control plane is back (and its restore of the
/// locations after the faults), lose nothing, and all end on its last generation.
#[test]
fn seed_24_locations_cleared_while_the_control_plane_is_away_arrive_late_and_lose_nothing() {
    let out = timeshard_sim::run(24, &opts()).unwrap();
    let mut away = false;
    let cleared_while_away = out.plan.steps.iter().any(|(_, a)| {
        match a {
            Action::ControlDown => away = true,
            Action::ControlUp => away = false,
            _ => {}
        }
        away && *a == Action::ClearLocations
    });
    assert!(cleared_while_away, "seed 24 no longer clears the locations during an outage; find another seed");
    assert!(out.failures.is_empty(), "{:#?}", out.failures);
    let generations: Vec<(u64, u64)> = out
        .history
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Config { running, latest, .. } => Some((*running, *latest)),
            _ => None,
        })
        .collect();
    assert!(generations.len() >= 6, "most of the fleet runs at the end: {generations:?}");
    // Generation 1, the clearing, and the locations given back after the faults.
    assert!(generations.iter().all(|&(running, latest)| running == latest && latest >= 3), "{generations:?}");
}

/// The archive under simulation: seed 10000 fails one node's uploads part-way, answers
/// another's requests with errors, and loses answers of two more, while the archived class
/// `cold` passes its 20 s hot window. Most blocks end in the archive, some with their hot
/// copies dropped; every acknowledged point is read back and nothing is lost.
#[test]
fn seed_10000_exports_through_object_store_faults_lose_nothing() {
    use timeshard_sim::archive::ArchiveFault;
    let out = timeshard_sim::run(10000, &opts()).unwrap();
    let faults: Vec<ArchiveFault> = out
        .plan
        .steps
        .iter()
        .filter_map(|(_, a)| match a {
            Action::ArchiveFails(_, f) => Some(*f),
            _ => None,
        })
        .collect();
    for kind in ["CutAfter", "Errors", "LostAnswer"] {
        assert!(
            faults.iter().any(|f| format!("{f:?}").starts_with(kind)),
            "seed 10000 no longer plans {kind}: {faults:?}; find another seed"
        );
    }
    assert!(out.failures.is_empty(), "{:#?}", out.failures);
    let cold: Vec<(u64, usize)> = out
        .history
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Copies { series, archived, copies, .. } if series.starts_with("m.cold") => {
                Some((*archived, copies.len()))
            }
            _ => None,
        })
        .collect();
    // Most blocks are in the archive by the end (the newest may not be due yet), some alone.
    let archived = cold.iter().filter(|(archived, _)| *archived > 0).count();
    assert!(cold.len() >= 10 && archived * 2 >= cold.len(), "{cold:?}");
    assert!(cold.iter().any(|(_, hot)| *hot == 0), "no hot copy was dropped: {cold:?}");
}

/// Bug 3: a round of anti-entropy that asked no neighbour counted as complete (`0 == 0`), so a
/// node that restarted knowing no member yet called itself settled. Seed 59 restarts node 0
/// (the bootstrap node, which has no seeds of its own) and then reads `latest` of a CoI series
/// through it: with `Settle::round_complete` back at `0 == 0`, node 0 answers settled without
/// the last 4.4 s of acknowledged writes (`stale_in_coi`).
#[test]
fn seed_59_a_restarted_node_that_asked_no_neighbour_is_not_settled() {
    passes_and_plans(59, "restarts node 0", |a| *a == Action::Restart(0));
}

/// Bug 12: after every location was cleared, one node got a location back and CoI placement
/// named it the only owner of every CoI block (one located member, n_in + n_out = 3). Handoff
/// moved every displaced copy onto it, and its departure lost them. Placement now tops the
/// owners up from the DHT while too few members are located.
#[test]
fn seed_17181_one_located_node_is_not_the_only_copy_of_coi_blocks() {
    let out = timeshard_sim::run(17181, &Options { faults: Faults::all(), ..opts() }).unwrap();
    let steps = &out.plan.steps;
    let cleared = steps.iter().position(|(_, a)| *a == Action::ClearLocations);
    let relocated = steps.iter().position(|(_, a)| matches!(a, Action::Relocate(_, Some(_))));
    let departed = steps.iter().position(|(_, a)| matches!(a, Action::Depart(_)));
    assert!(
        matches!((cleared, relocated, departed), (Some(c), Some(r), Some(d)) if c < r && r < d),
        "seed 17181 no longer clears the locations, locates one node and has a node depart; find another seed"
    );
    assert!(out.failures.is_empty(), "{:#?}", out.failures);
}

/// Bug 13: node 0, restarted and cut off, found by its scrub a block with a flipped bit that no
/// other member owned in its view; the block is kept then, but each scrub that found damage
/// asked for a round at once, the round reached nobody and took no simulated time, and the
/// scrub found the block again: simulated time stood still and the run hung (the watchdog now
/// ends such a run, `watchdog::STALL_LIMIT`). Damage now hurries one round, never two in a row.
#[test]
fn seed_20075_a_damaged_block_no_other_member_owns_does_not_spin_the_repair_driver() {
    passes_and_plans(20075, "flips a bit on node 0", |a| *a == Action::BitFlip(0));
}
