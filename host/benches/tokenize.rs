//! What the `token-producer`'s tokenizer costs a request: encoding a text of 8192 tokens as a
//! completions prompt (special tokens added), through the host's own path
//! (`PromptTokenizer::tokenize`), beside the 4-bytes-per-token estimate of the same text.
//!
//! The tokenizer is a byte-level BPE of 16k tokens trained here on the repository's docs, so
//! no vocabulary is shipped or downloaded; the prompt is English prose from the same docs.
//! `SWITCHYARD_BENCH_TOKENIZER=/path/to/tokenizer.json` adds a run with a model's real file.
//!
//! A chat request's own cost: rendering a conversation through a ChatML-style chat template
//! (the shape of Qwen's, written here), alone and with the encoding of the result.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use switchyard::pipeline::chat_template::ChatTemplate;
use switchyard::pipeline::request::ChatMessage;
use switchyard::pipeline::tokenize::{PromptTokenizer, DEFAULT_MAX_PROMPT_BYTES};
use switchyard::pipeline::Prompt;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TokenizerBuilder};

const PROMPT_TOKENS: usize = 8192;
const VOCAB: usize = 16_384;

/// The repository's Markdown docs, concatenated.
fn corpus() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.push(root.join("README.md"));
    files.push(root.join("ARCHITECTURE.md"));
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).expect("a doc"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Trains the byte-level BPE on `text` and saves it as `tokenizer.json` in a temp dir.
fn train(text: &str) -> PathBuf {
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(VOCAB)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
        .build();
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(ByteLevel::default()))
        .with_post_processor(Some(ByteLevel::default()))
        .with_decoder(Some(ByteLevel::default()))
        .build()
        .expect("a tokenizer");
    tokenizer
        .train(&mut trainer, text.lines())
        .expect("trained");
    let dir = std::env::temp_dir().join(format!("switchyard-bench-bpe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tokenizer.json");
    tokenizer.save(&path, false).expect("saved");
    path
}

/// The shortest run of whole lines of `text` (repeated as needed) that encodes to at least
/// `PROMPT_TOKENS` tokens.
fn prompt_of(tokenizer: &PromptTokenizer, text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .cycle()
        .take(4 * text.lines().count())
        .collect();
    let joined = |n: usize| lines[..n].join("\n");
    let (mut short, mut long) = (0, lines.len());
    assert!(
        count(tokenizer, &joined(long)) >= PROMPT_TOKENS,
        "text long enough"
    );
    while long - short > 1 {
        let middle = (short + long) / 2;
        if count(tokenizer, &joined(middle)) >= PROMPT_TOKENS {
            long = middle;
        } else {
            short = middle;
        }
    }
    joined(long)
}

fn count(tokenizer: &PromptTokenizer, text: &str) -> usize {
    tokenizer.tokenize(Prompt::Text(text.to_string())).prompts[0].len()
}

fn bench(c: &mut Criterion) {
    let text = corpus();
    let mut files = vec![("bpe 16k trained on the docs".to_string(), train(&text))];
    if let Some(path) = std::env::var_os("SWITCHYARD_BENCH_TOKENIZER") {
        files.push((
            "SWITCHYARD_BENCH_TOKENIZER".to_string(),
            PathBuf::from(path),
        ));
    }
    let mut group = c.benchmark_group("tokenize");
    group.throughput(Throughput::Elements(PROMPT_TOKENS as u64));
    for (name, path) in files {
        let tokenizer =
            PromptTokenizer::load(&path, DEFAULT_MAX_PROMPT_BYTES).expect("a tokenizer.json");
        let prompt = prompt_of(&tokenizer, &text);
        let tokens = count(&tokenizer, &prompt);
        eprintln!("{name}: {} bytes of text, {tokens} tokens", prompt.len());
        let estimated = PromptTokenizer::estimate();
        group.bench_function(format!("8k-token text, estimate ({name} text)"), |b| {
            b.iter(|| estimated.tokenize(Prompt::Text(black_box(prompt.clone()))))
        });
        group.bench_function(format!("8k-token text, {name}"), |b| {
            b.iter(|| tokenizer.tokenize(Prompt::Text(black_box(prompt.clone()))))
        });
    }
    group.finish();
}

/// A ChatML-style template: a default system prompt when the chat has none, each message
/// between `<|im_start|>` and `<|im_end|>`, an unknown role refused.
const CHATML: &str = "{% if messages[0]['role'] != 'system' %}<|im_start|>system\n\
You are a helpful assistant.<|im_end|>\n{% endif %}\n\
{% for message in messages %}\n\
{% if message['role'] not in ['system', 'user', 'assistant'] %}\
{{ raise_exception('unknown role ' ~ message['role']) }}{% endif %}\n\
<|im_start|>{{ message['role'] }}\n{{ message['content'].strip() }}<|im_end|>\n\n\
{% endfor %}\n\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A system prompt and three exchanges, each message a few lines of `text`.
fn conversation(text: &str) -> Vec<ChatMessage> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty()).cycle();
    let mut message = |role: &str| ChatMessage {
        role: role.to_string(),
        content: (0..4)
            .filter_map(|_| lines.next())
            .collect::<Vec<_>>()
            .join("\n"),
        unrendered: None,
    };
    let mut messages = vec![message("system")];
    for _ in 0..3 {
        messages.push(message("user"));
        messages.push(message("assistant"));
    }
    messages.push(message("user"));
    messages
}

fn bench_chat(c: &mut Criterion) {
    let text = corpus();
    let tokenizer_file = train(&text);
    let template_file = tokenizer_file.with_file_name("chatml.jinja");
    std::fs::write(&template_file, CHATML).expect("template written");
    let template = ChatTemplate::compile(
        CHATML.to_string(),
        &template_file,
        String::new(),
        "<|endoftext|>".to_string(),
    )
    .expect("the template parses");
    let tokenizer = PromptTokenizer::load_with(
        &tokenizer_file,
        Some(template_file.as_path()),
        DEFAULT_MAX_PROMPT_BYTES,
    )
    .expect("a tokenizer.json");
    let messages = conversation(&text);
    let rendered = template.render(&messages).expect("renders");
    let tokenized = tokenizer.tokenize(Prompt::Chat(messages.clone()));
    assert_eq!(tokenized.estimated, None, "the chat is rendered");
    eprintln!(
        "chat: {} messages, {} bytes rendered, {} tokens",
        messages.len(),
        rendered.len(),
        tokenized.prompts[0].len()
    );
    let mut group = c.benchmark_group("chat");
    group.bench_function("render, ChatML template", |b| {
        b.iter(|| template.render(black_box(&messages)))
    });
    group.bench_function("render and encode, bpe 16k trained on the docs", |b| {
        b.iter(|| tokenizer.tokenize(Prompt::Chat(black_box(messages.clone()))))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    targets = bench, bench_chat
}
criterion_main!(benches);
