use super::*;

fn stored(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    extra_keys: Vec<Option<Vec<String>>>,
) -> KvEvent {
    KvEvent::BlockStored(StoredBlocks {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: 2,
        medium: Medium::Gpu,
        extra_keys,
        ..StoredBlocks::default()
    })
}

fn removed(hashes: &[u64]) -> KvEvent {
    KvEvent::BlockRemoved(RemovedBlocks {
        block_hashes: hashes.to_vec(),
        medium: Medium::Gpu,
    })
}

#[test]
fn a_batch_is_delivered_once_its_delay_has_passed_and_batches_keep_their_order() {
    let mut queue = EventQueue::new(10.0);
    queue.publish(0.0, 1, vec![removed(&[1])]);
    queue.publish(5.0, 0, Vec::new());
    queue.publish(5.0, 0, vec![removed(&[2])]);
    queue.publish(5.0, 1, vec![removed(&[3])]);
    assert_eq!(queue.next_due(), Some(10.0));
    assert_eq!(queue.pop_due(9.9), None);
    assert_eq!(queue.pop_due(10.0), Some((1, vec![removed(&[1])])));
    assert_eq!(queue.next_due(), Some(15.0), "an empty batch is not sent");
    assert_eq!(queue.pop_due(14.0), None);
    assert_eq!(queue.pop_due(20.0), Some((0, vec![removed(&[2])])));
    assert_eq!(queue.pop_due(20.0), Some((1, vec![removed(&[3])])));
    assert_eq!(queue.pop_due(1e9), None);
    assert_eq!(queue.next_due(), None);

    let mut at_once = EventQueue::new(0.0);
    at_once.publish(3.0, 0, vec![removed(&[4])]);
    assert_eq!(at_once.pop_due(3.0), Some((0, vec![removed(&[4])])));
}

#[test]
fn step_changes_are_told_in_order_as_chained_runs_of_stores_and_removals() {
    // Request 0: blocks 10, 11, 12 of tokens [1 2][3 4][5 6], salted. Request 1 shares
    // block 10 and continues with 21.
    let chains: [(&[u64], &[u32], &str); 2] = [
        (&[10, 11, 12], &[1, 2, 3, 4, 5, 6], "tenant"),
        (&[10, 21], &[1, 2, 7, 8], "tenant"),
    ];
    let changes = [
        BlockChange::Stored {
            request: 0,
            block: 0,
        },
        BlockChange::Stored {
            request: 0,
            block: 1,
        },
        BlockChange::Removed(99),
        BlockChange::Removed(98),
        BlockChange::Stored {
            request: 0,
            block: 2,
        },
        // Request 1's block after 10 starts a run of its own: its parent is 10, not 12.
        BlockChange::Stored {
            request: 1,
            block: 1,
        },
        // A request the simulator no longer knows is left out.
        BlockChange::Stored {
            request: 7,
            block: 0,
        },
    ];
    let events = step_events(&changes, 2, |request| {
        chains
            .get(request)
            .map(|&(hashes, tokens, cache_salt)| ChainSource {
                hashes,
                tokens,
                cache_salt,
            })
    });
    assert_eq!(
        events,
        vec![
            stored(
                &[10, 11],
                None,
                &[1, 2, 3, 4],
                vec![Some(vec!["tenant".to_string()]), None]
            ),
            removed(&[99, 98]),
            stored(&[12], Some(11), &[5, 6], Vec::new()),
            stored(&[21], Some(10), &[7, 8], Vec::new()),
        ]
    );
}

#[test]
fn a_fixed_rate_cache_tells_its_net_change() {
    // Blocks 10 and 11 were cached; 12 and 13 are new; 99 made room for them; 13 was stored
    // and pushed out again within the insert, so it is in neither.
    let changes = [
        CacheChange::Stored(13),
        CacheChange::Evicted(99),
        CacheChange::Stored(12),
        CacheChange::Evicted(13),
    ];
    let events = cache_events(
        &changes,
        &[10, 11, 12, 13],
        &[1, 2, 3, 4, 5, 6, 7, 8],
        "",
        2,
        |h| h + 1000,
    );
    assert_eq!(
        events,
        vec![
            removed(&[1099]),
            stored(&[1012], Some(1011), &[5, 6], Vec::new()),
        ]
    );
}
