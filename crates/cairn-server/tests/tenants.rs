//! Random multi-tenant operation sequences: no operation of one namespace ever returns,
//! links, expands or deletes a memory of another (the same style as the store's
//! thread-isolation property).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod common;

use std::collections::{HashMap, HashSet};

use cairn_server::api::{AddMemory, AddSummary, ContextRequest, SearchRequest};
use cairn_server::{ErrorCode, Limits, Namespace};
use proptest::prelude::*;

const NAMESPACES: [&str; 3] = ["default", "acme", "globex"];
const THREADS: [&str; 2] = ["t1", "t2"];
const WORDS: [&str; 6] = ["apple", "river", "castle", "violin", "pepper", "comet"];

#[derive(Debug, Clone)]
enum Op {
    Add {
        ns: usize,
        thread: usize,
        word: usize,
    },
    Summarize {
        ns: usize,
        picks: Vec<usize>,
    },
    Search {
        ns: usize,
        word: usize,
        mode: usize,
    },
    Context {
        ns: usize,
        thread: usize,
        word: usize,
    },
    Expand {
        ns: usize,
        pick: usize,
        leaves: bool,
    },
    Get {
        ns: usize,
        pick: usize,
    },
    Backlinks {
        ns: usize,
        pick: usize,
    },
    Delete {
        ns: usize,
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let ns = 0..NAMESPACES.len();
    prop_oneof![
        4 => (ns.clone(), 0..THREADS.len(), 0..WORDS.len())
            .prop_map(|(ns, thread, word)| Op::Add { ns, thread, word }),
        2 => (ns.clone(), prop::collection::vec(0usize..1000, 1..4))
            .prop_map(|(ns, picks)| Op::Summarize { ns, picks }),
        2 => (ns.clone(), 0..WORDS.len(), 0usize..3)
            .prop_map(|(ns, word, mode)| Op::Search { ns, word, mode }),
        1 => (ns.clone(), 0..THREADS.len(), 0..WORDS.len())
            .prop_map(|(ns, thread, word)| Op::Context { ns, thread, word }),
        1 => (ns.clone(), 0usize..1000, any::<bool>())
            .prop_map(|(ns, pick, leaves)| Op::Expand { ns, pick, leaves }),
        1 => (ns.clone(), 0usize..1000).prop_map(|(ns, pick)| Op::Get { ns, pick }),
        1 => (ns.clone(), 0usize..1000).prop_map(|(ns, pick)| Op::Backlinks { ns, pick }),
        1 => (ns, 0usize..1000).prop_map(|(ns, pick)| Op::Delete { ns, pick }),
    ]
}

/// Every id ever created (deleted ones included), with its namespace.
#[derive(Default)]
struct Model {
    owner: HashMap<String, usize>,
    order: Vec<String>,
    alive: HashSet<String>,
}

impl Model {
    fn pick(&self, i: usize) -> Option<(&String, usize)> {
        if self.order.is_empty() {
            return None;
        }
        let id = &self.order[i % self.order.len()];
        Some((id, self.owner[id]))
    }

    fn check_owned(&self, ns: usize, ids: impl IntoIterator<Item = String>, what: &str) {
        for id in ids {
            assert_eq!(
                self.owner.get(&id).copied(),
                Some(ns),
                "{what} in {} returned {id}, which is not its own",
                NAMESPACES[ns]
            );
        }
    }
}

fn run(ops: Vec<Op>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let server = common::open(
            dir.path().join("m.db"),
            dir.path().join("keys"),
            Limits::default(),
        )
        .await;
        let svc = server.service();
        let nss: Vec<Namespace> = NAMESPACES
            .iter()
            .map(|n| Namespace::new(n).unwrap())
            .collect();
        let mut model = Model::default();
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Add { ns, thread, word } => {
                    let m = AddMemory {
                        content: format!(
                            "{} {} note {n} of {}",
                            WORDS[word],
                            WORDS[(word + n) % 6],
                            NAMESPACES[ns]
                        ),
                        thread: Some(THREADS[thread].to_owned()),
                        ..AddMemory::default()
                    };
                    let added = svc.add(&nss[ns], vec![m]).await.unwrap();
                    for id in added.ids {
                        model.owner.insert(id.clone(), ns);
                        model.order.push(id.clone());
                        model.alive.insert(id);
                    }
                }
                Op::Summarize { ns, picks } => {
                    let mut sources: Vec<String> = Vec::new();
                    let mut owners = HashSet::new();
                    for p in picks {
                        if let Some((id, o)) = model.pick(p) {
                            if !sources.contains(id) {
                                sources.push(id.clone());
                                owners.insert(o);
                            }
                        }
                    }
                    if sources.is_empty() {
                        continue;
                    }
                    let r = svc
                        .add_summary(
                            &nss[ns],
                            AddSummary {
                                content: format!("summary {n} of {}", NAMESPACES[ns]),
                                source_ids: sources.clone(),
                                thread: None,
                            },
                        )
                        .await;
                    let foreign = owners.iter().any(|o| *o != ns);
                    let dead = sources.iter().any(|s| !model.alive.contains(s));
                    match r {
                        Ok(s) => {
                            assert!(
                                !foreign,
                                "a summary in {} cited another namespace",
                                NAMESPACES[ns]
                            );
                            assert!(!dead, "a summary cited a deleted memory");
                            model.owner.insert(s.memory.id.clone(), ns);
                            model.order.push(s.memory.id.clone());
                            model.alive.insert(s.memory.id);
                        }
                        Err(e) => {
                            if foreign || dead {
                                assert_eq!(e.code, ErrorCode::NotFound, "{e}");
                            }
                            // Otherwise a link rule (threads differ, ...) refused it.
                        }
                    }
                }
                Op::Search { ns, word, mode } => {
                    let r = svc
                        .search(
                            &nss[ns],
                            SearchRequest {
                                query: WORDS[word].to_owned(),
                                k: Some(50),
                                mode: Some(["hybrid", "vector", "keyword"][mode].to_owned()),
                                thread: None,
                                kind: None,
                                metadata: None,
                                as_of: None,
                                history: None,
                                half_life: None,
                            },
                        )
                        .await
                        .unwrap();
                    for h in &r.hits {
                        assert!(
                            !NAMESPACES
                                .iter()
                                .enumerate()
                                .any(|(i, other)| i != ns
                                    && h.content.ends_with(&format!("of {other}"))),
                            "{}",
                            h.content
                        );
                    }
                    model.check_owned(ns, r.hits.into_iter().map(|h| h.id), "search");
                }
                Op::Context { ns, thread, word } => {
                    let r = svc
                        .context(
                            &nss[ns],
                            ContextRequest {
                                thread: THREADS[thread].to_owned(),
                                query: WORDS[word].to_owned(),
                                budget: Some(4000),
                                knowledge: Some(true),
                                scope: Some(THREADS.iter().map(|t| (*t).to_owned()).collect()),
                                scope_metadata: None,
                            },
                        )
                        .await
                        .unwrap();
                    model.check_owned(ns, r.items.into_iter().map(|i| i.id), "context");
                }
                Op::Expand { ns, pick, leaves } => {
                    let Some((id, owner)) = model.pick(pick) else {
                        continue;
                    };
                    let id = id.clone();
                    match svc.expand(&nss[ns], &id, leaves).await {
                        Ok(m) => {
                            assert_eq!(owner, ns, "expanded another namespace's summary");
                            model.check_owned(ns, m.memories.into_iter().map(|m| m.id), "expand");
                        }
                        Err(e) => {
                            if owner != ns {
                                assert_eq!(e.code, ErrorCode::NotFound, "{e}");
                            }
                        }
                    }
                }
                Op::Get { ns, pick } => {
                    let Some((id, owner)) = model.pick(pick) else {
                        continue;
                    };
                    let id = id.clone();
                    let r = svc.get(&nss[ns], &id).await;
                    let visible = owner == ns && model.alive.contains(&id);
                    match r {
                        Ok(m) => {
                            assert!(visible, "got {id} from {}", NAMESPACES[ns]);
                            assert_eq!(m.id, id);
                        }
                        Err(e) => {
                            assert!(!visible, "lost {id}: {e}");
                            assert_eq!(e.code, ErrorCode::NotFound);
                        }
                    }
                }
                Op::Backlinks { ns, pick } => {
                    let Some((id, owner)) = model.pick(pick) else {
                        continue;
                    };
                    let id = id.clone();
                    match svc.summaries_of(&nss[ns], &id).await {
                        Ok(m) => {
                            assert_eq!(owner, ns);
                            model.check_owned(
                                ns,
                                m.memories.into_iter().map(|m| m.id),
                                "back-links",
                            );
                        }
                        Err(e) => assert_eq!(e.code, ErrorCode::NotFound, "{e}"),
                    }
                }
                Op::Delete { ns, pick } => {
                    let Some((id, owner)) = model.pick(pick) else {
                        continue;
                    };
                    let id = id.clone();
                    match svc.delete(&nss[ns], &id, Some("cascade")).await {
                        Ok(d) => {
                            assert_eq!(owner, ns, "deleted another namespace's memory");
                            model.check_owned(ns, d.deleted.iter().cloned(), "delete");
                            for gone in d.deleted {
                                model.alive.remove(&gone);
                            }
                        }
                        Err(e) => {
                            assert!(owner != ns || !model.alive.contains(&id), "{e}");
                            assert_eq!(e.code, ErrorCode::NotFound);
                        }
                    }
                }
            }
        }
        // Every namespace still holds exactly its own living memories.
        for (i, ns) in nss.iter().enumerate() {
            for id in model.order.iter().filter(|id| model.owner[*id] == i) {
                let found = svc.get(ns, id).await.is_ok();
                assert_eq!(found, model.alive.contains(id), "{id} in {}", NAMESPACES[i]);
            }
        }
    });
}

#[test]
fn no_operation_crosses_a_namespace() {
    let config = proptest::test_runner::Config {
        cases: 24,
        failure_persistence: None,
        ..Default::default()
    };
    // Seeded: the same sequences every run.
    let rng = proptest::test_runner::TestRng::deterministic_rng(config.rng_algorithm);
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(config, rng);
    runner
        .run(&prop::collection::vec(op(), 1..40), |ops| {
            run(ops);
            Ok(())
        })
        .unwrap();
}
