//! Consequences of the prefix-hashing golden vectors (framework spec §6) observed through the
//! loaded burst producer: which requests share leading blocks decides co-location.

use switchyard::pipeline::{Prompt, Request};
use switchyard_tests::{endpoints, scheduler};

fn config(block_size: u32, min_colocate_blocks: u32) -> String {
    format!(
        "allow_experimental_plugins = true\n\
         libraries = [\"burst_prefix_cache_producer\", \"prefix_cache_scorer\"]\n{}\n\
         [[plugins]]\ntype = \"token-producer\"\n\
         [[plugins]]\ntype = \"burst-prefix-cache-producer\"\n\
         [plugins.parameters]\nwindowDurationMs = 50\nblockSizeTokens = {block_size}\n\
         minColocateBlocks = {min_colocate_blocks}\nmaxBatchSize = -1\n\
         [[plugins]]\ntype = \"prefix-cache-scorer\"\n\
         [plugins.parameters]\nprefixMatchInfoProducerName = \"burst-prefix-cache-producer\"\n\
         [[plugins]]\ntype = \"max-score-picker\"\n",
        endpoints(2)
    )
}

fn request(id: &str, model: &str, salt: &str, prompts: Vec<Vec<u32>>) -> Request {
    Request {
        id: id.into(),
        model: model.into(),
        cache_salt: salt.into(),
        prompt: Prompt::Tokens(prompts),
        max_output_tokens: None,
    }
}

/// The matched blocks each request got on its chosen endpoint, in submission order.
fn matched(
    block_size: u32,
    min_colocate_blocks: u32,
    requests: Vec<Request>,
) -> Vec<(String, u64)> {
    let mut scheduler = scheduler("hashing", &config(block_size, min_colocate_blocks), 3);
    scheduler.set_explain(true);
    for request in requests {
        assert!(
            scheduler.submit(request, 0.0).is_empty(),
            "waits in the window"
        );
    }
    let mut decisions = scheduler.advance(50.0);
    decisions.sort_by(|a, b| a.request_id.cmp(&b.request_id));
    decisions
        .into_iter()
        .map(|d| {
            let record = d.record.expect("explained").render();
            let chosen = d.endpoints[0].clone();
            let producer = &record.producers[1];
            let match_blocks = producer
                .attributes
                .iter()
                .find(|a| a.endpoint == chosen)
                .map(|a| a.value["matchBlocks"].as_u64().unwrap())
                .unwrap();
            (chosen, match_blocks)
        })
        .collect()
}

#[test]
fn model_and_salt_are_joined_without_a_separator() {
    // G2/G2b: model "msalt" without salt hashes like model "m" with salt "salt", so the two
    // requests form one identical group and share a replica.
    let got = matched(
        2,
        0,
        vec![
            request("a", "m", "salt", vec![vec![1, 2, 3, 4]]),
            request("b", "msalt", "", vec![vec![1, 2, 3, 4]]),
        ],
    );
    assert_eq!(got[0], got[1]);
    assert_eq!(got[0].1, 2);
}

#[test]
fn a_different_salt_separates_identical_tokens() {
    // G1 vs G2: the same tokens under another salt are another prompt.
    let got = matched(
        2,
        0,
        vec![
            request("a", "m", "", vec![vec![1, 2, 3, 4]]),
            request("b", "m", "salt", vec![vec![1, 2, 3, 4]]),
        ],
    );
    assert_eq!(
        got,
        vec![("/pod1".to_string(), 0), ("/pod1".to_string(), 0)]
    );
}

#[test]
fn the_partial_last_block_is_its_own_block() {
    // Tokens 1..9 and 1..10 in blocks of 4 share two blocks, not three (§5.5): with
    // minColocateBlocks 2 they are co-located, with 3 they are not. A second such pair makes
    // the fair share two requests per replica, so co-location is not capped.
    let prompts = || {
        vec![
            request("a", "m", "", vec![(1..=9).collect()]),
            request("b", "m", "", vec![(1..=10).collect()]),
            request("c", "m", "", vec![(101..=109).collect()]),
            request("d", "m", "", vec![(101..=110).collect()]),
        ]
    };
    let together = matched(4, 2, prompts());
    assert_eq!(together[0].0, together[1].0);
    assert_eq!(together[2].0, together[3].0);
    assert_ne!(together[0].0, together[2].0);
    assert_eq!(together[0].1, 3);
    let apart = matched(4, 3, prompts());
    assert!(apart.iter().all(|(_, m)| *m == 0), "{apart:?}");
}

#[test]
fn each_prompt_restarts_the_chain() {
    // G5/G6: [[1,2],[3,4]] and [[1,2,3,4]] share their first block only (a second pair
    // keeps the fair share at two per replica).
    let requests = || {
        vec![
            request("a", "model", "", vec![vec![1, 2], vec![3, 4]]),
            request("b", "model", "", vec![vec![1, 2, 3, 4]]),
            request("c", "model", "", vec![vec![11, 12], vec![13, 14]]),
            request("d", "model", "", vec![vec![11, 12, 13, 14]]),
        ]
    };
    let one_block = matched(2, 1, requests());
    assert_eq!(
        one_block[0].0, one_block[1].0,
        "co-located on the shared first block"
    );
    assert_eq!(one_block[2].0, one_block[3].0);
    assert_ne!(one_block[0].0, one_block[2].0);
    let two_blocks = matched(2, 2, requests());
    assert!(two_blocks.iter().all(|(_, m)| *m == 0), "{two_blocks:?}");
}
