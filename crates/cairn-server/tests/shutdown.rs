//! Graceful shutdown: adds in flight when the server is told to stop finish, and every
//! acknowledged add is in the store afterwards.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cairn_harness::MemoryHarness;
use cairn_server::{namespace_path, Limits, Namespace};
use common::start;

#[test]
fn stopping_finishes_requests_in_flight_and_loses_nothing_acknowledged() {
    let mut s = start(Limits::default());
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let url = format!("{}/v1/memories", s.base);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (url, key, acked, stop) =
                (url.clone(), s.key_a.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let content = format!("client {c} turn {i}");
                    let body = serde_json::json!({"thread": format!("c{c}"), "content": content});
                    let r = agent
                        .post(&url)
                        .header("Authorization", &format!("Bearer {key}"))
                        .send(body.to_string());
                    match r {
                        Ok(mut resp) if resp.status().as_u16() == 201 => {
                            let v: serde_json::Value =
                                serde_json::from_str(&resp.body_mut().read_to_string().unwrap())
                                    .unwrap();
                            acked
                                .lock()
                                .unwrap()
                                .push((v["id"].as_str().unwrap().to_owned(), content));
                        }
                        // Refused or cut off once the server stops: not acknowledged.
                        _ => {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();
    // Stop once enough adds were acknowledged, while clients are still sending.
    while acked.lock().unwrap().len() < 200 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    s.stop();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 200);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let path = namespace_path(&s.db, &Namespace::new("alpha").unwrap());
        let h = MemoryHarness::builder(&path)
            .embedder(common::embedder())
            .build()
            .await
            .unwrap();
        for (id, content) in &acked {
            let m = h.get(id.parse().unwrap()).await.unwrap();
            assert_eq!(&m.content, content);
        }
        assert!(h.stats().await.unwrap().store.total >= acked.len());
    });
}
