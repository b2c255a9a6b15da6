//! Recall outside the LoCoMo shape, with the real model: a unique code in a long thread,
//! speakers kept as a field of their turns rather than a `Name:` prefix of the text.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cairn_core::{Embedder, InputError, MemoryId, NewMemory, Role, ThreadId};
use cairn_embed::FastEmbedder;
use cairn_harness::{AssembledContext, HarnessError, MemoryHarness, Section};

fn minilm() -> Arc<dyn Embedder> {
    static M: OnceLock<Arc<FastEmbedder>> = OnceLock::new();
    M.get_or_init(|| Arc::new(FastEmbedder::new().unwrap()))
        .clone()
}

async fn open(dir: &tempfile::TempDir) -> MemoryHarness {
    MemoryHarness::builder(dir.path().join("h.db"))
        .embedder(minilm())
        .build()
        .await
        .unwrap()
}

fn recalled(ctx: &AssembledContext) -> Vec<&str> {
    ctx.items
        .iter()
        .filter(|i| i.section == Section::Recalled)
        .map(|i| i.content.as_str())
        .collect()
}

fn recalled_ids(ctx: &AssembledContext) -> Vec<MemoryId> {
    ctx.items
        .iter()
        .filter(|i| i.section == Section::Recalled)
        .map(|i| i.id)
        .collect()
}

/// A code mentioned once in a 5,000-turn thread is recalled when the query names it. The
/// turn that holds it is the only one that matches a word of the query, and every other
/// turn says the same with another code (`QZ7RX10`, `QZ7RX11`, ...): only the keyword score
/// can bring it in. Before, keyword scores were standardised
/// among the matching turns, so a single match got no keyword credit at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_code_is_recalled_from_a_five_thousand_turn_thread() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let thread = ThreadId::new("inbox").unwrap();
    let cities = [
        "Porto", "Lisbon", "Madrid", "Paris", "Rome", "Vienna", "Prague", "Oslo", "Dublin",
        "Athens",
    ];
    let code_at = 2_345;
    let code = "Booked the hotel in Porto, the confirmation code is QZ7RX4.";
    let t0 = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let turns: Vec<NewMemory> = (0..5_000usize)
        .map(|i| {
            let text = if i == code_at {
                code.to_owned()
            } else {
                format!(
                    "Booked the hotel in {}, the confirmation code is QZ7RX{}.",
                    cities[i % cities.len()],
                    i + 10
                )
            };
            // Sessions of 50 turns a day, 30 seconds apart.
            let day = i64::try_from(i / 50).unwrap();
            let step = i64::try_from(i % 50).unwrap();
            let at = t0 + chrono::Duration::days(day) + chrono::Duration::seconds(30 * step);
            NewMemory::conversational(thread.clone(), Role::User, text).at(at)
        })
        .collect();
    for batch in turns.chunks(1_000) {
        mem.add_many(batch.to_vec()).await.unwrap();
    }
    let ctx = mem
        .assemble_context("inbox", "What did the message about QZ7RX4 say?", 300)
        .await
        .unwrap();
    assert!(ctx.tokens <= 300);
    assert!(recalled(&ctx).contains(&code), "{}", ctx.render());
}

/// Speakers as a field of their turns: `add_conversational_by` keeps who said a turn
/// without the text naming them, and a query that names a speaker recalls what they said.
/// Gina and Jon say the same words about their dinner, in the same surroundings; Jon
/// greets Gina by name over and over. Only the speaker field tells the two answers apart:
/// the same turns added without it (plain `add_conversational`) give the same answer to
/// both questions. Before, there was no way
/// to give a turn its speaker but metadata, and the speaker's name stayed in the keyword
/// query, where it matches the turns that mention Gina (Jon's greetings), not hers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_speaker_is_recalled_without_a_name_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let chat = [
        ("Jon", "Hey Gina! Long time no see, Gina!"),
        ("Gina", "So good to hear from you, it has been ages."),
        ("Jon", "Gina, you always make me laugh, Gina."),
        (
            "Gina",
            "The weather has been grey all week, lots of drizzle.",
        ),
        ("Jon", "Thanks Gina, talk soon Gina!"),
        (
            "Gina",
            "I watched a documentary about deep sea fish last night.",
        ),
        ("Jon", "Gina, I miss our chats so much, Gina."),
        ("Gina", "My clothing store had its best month ever."),
        ("Jon", "Haha, anytime Gina. Take care, Gina."),
        (
            "Gina",
            "Work is busy, we ship the new collection on Friday.",
        ),
    ];
    let answer = "I cooked a spicy lentil curry for dinner.";
    let mut turns: Vec<(&str, &str)> = Vec::new();
    for round in 0..4 {
        turns.extend(chat);
        if round == 1 {
            turns.push(("Gina", answer));
        }
        if round == 2 {
            turns.push(("Jon", answer));
        }
    }
    let mut ids = HashMap::new();
    for (who, text) in &turns {
        let id = mem
            .add_conversational_by("friends", Role::User, who, *text)
            .await
            .unwrap();
        let plain = mem
            .add_conversational("anonymous", Role::User, *text)
            .await
            .unwrap();
        if *text == answer {
            ids.insert((*who, "friends"), id);
            ids.insert((*who, "anonymous"), plain);
        }
    }
    // The speaker is a field of the turn; the text is as given.
    let all = mem.get_conversational("friends", usize::MAX).await.unwrap();
    assert_eq!(all.len(), turns.len());
    assert!(all
        .iter()
        .zip(&turns)
        .all(|(m, (who, text))| m.speaker() == Some(*who) && m.content == *text));
    // Room for the newest turn and one recalled.
    let top = |thread: &'static str, question: &'static str| {
        let mem = &mem;
        async move {
            let ctx = mem.assemble_context(thread, question, 60).await.unwrap();
            assert!(ctx.tokens <= 60);
            let got = recalled_ids(&ctx);
            assert_eq!(got.len(), 1, "{}", ctx.render());
            got[0]
        }
    };
    assert_eq!(
        top("friends", "What did Gina cook for dinner?").await,
        ids[&("Gina", "friends")]
    );
    assert_eq!(
        top("friends", "What did Jon cook for dinner?").await,
        ids[&("Jon", "friends")]
    );
    // Without the speaker field, both questions get the same turn.
    assert_eq!(
        top("anonymous", "What did Gina cook for dinner?").await,
        top("anonymous", "What did Jon cook for dinner?").await
    );
    // A blank speaker is refused, and nothing is written.
    assert!(matches!(
        mem.add_conversational_by("friends", Role::User, "  ", "hello")
            .await,
        Err(HarnessError::Input(InputError::BlankSpeaker))
    ));
    assert_eq!(
        mem.get_conversational("friends", usize::MAX)
            .await
            .unwrap()
            .len(),
        turns.len()
    );
}
