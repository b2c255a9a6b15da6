//! The everyday API of a memory store: upsert by external key, metadata patches, cursor
//! paging, and forgetting that reaches the summaries built on what is forgotten.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use cairn_core::{MemoryId, MemoryUnit, Metadata, NewMemory, ThreadId};
use cairn_store::{Cursor, DeletePolicy, Filter, Page, PendingForget, StoreError};

use crate::harness::blocking;
use crate::{MemoryHarness, Result};

/// What [`MemoryHarness::upsert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpsertOutcome {
    /// No memory had the key: it was added.
    Inserted,
    /// The stored memory was the same: nothing was written.
    Unchanged,
    /// Only the metadata differed: it was replaced, without re-embedding.
    MetadataUpdated,
    /// The content differed: it was replaced and re-embedded, and the summaries built on it
    /// were marked stale (consolidation re-summarizes them).
    ContentUpdated,
    /// Only the expiry differed: it was set.
    ExpiryUpdated,
}

/// The memory an upsert left, and what it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Upserted {
    /// The memory as stored now.
    pub memory: MemoryUnit,
    /// What was done.
    pub outcome: UpsertOutcome,
}

/// What to forget ([`MemoryHarness::forget`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Forget {
    /// These memories.
    Ids(Vec<MemoryId>),
    /// Every memory of a thread (its turns, knowledge, summaries) and its per-thread state.
    Thread(ThreadId),
    /// Every memory a filter admits (a user's memories: a metadata condition on `user_id`).
    Filter(Filter),
    /// Everything in the store.
    Everything,
}

/// What [`MemoryHarness::forget`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForgetReport {
    /// Every memory removed: those asked for, and summaries left with no source.
    pub deleted: Vec<MemoryId>,
    /// Summaries that had some of their sources forgotten and were written again from the
    /// sources they keep (and the summaries above them, level by level).
    pub resummarized: Vec<MemoryId>,
    /// Summaries that could not be written again (the summarizer failed) and were deleted
    /// instead, so that no text of what was forgotten survives in them; their sources stay
    /// and are summarized again by the next consolidation.
    pub dropped: Vec<MemoryId>,
    /// Whether the store's files were scrubbed too (see
    /// [`cairn_store::Store::erase_deleted`]): no byte of what was forgotten is left in the
    /// database, its log, its index snapshot or the embedding cache (whose vectors of
    /// queries are not memories: they stay until evicted). `false` on PostgreSQL
    /// (a deleted row's bytes stay in its table until the space is reused), when another
    /// process was reading an older snapshot of a SQLite store (its log is truncated by a
    /// later forget or checkpoint), or when the embedding cache could not be purged or the
    /// files could not be scrubbed (logged; the memories are forgotten all the same; the
    /// next open of a SQLite store purges the cache and runs the erase again). `true` when
    /// there was nothing to forget, on every backend.
    #[serde(default)]
    pub erased: bool,
}

/// Memories read per page while collecting what a thread or a filter holds.
const COLLECT_PAGE: usize = 5_000;

impl MemoryHarness {
    /// Adds `memory`, or updates the memory that has its id (set one with
    /// [`NewMemory::with_key`]): an upsert by external key. The same content is left alone;
    /// other metadata alone is replaced without re-embedding; other content is re-embedded
    /// and the summaries above it become stale. The kind, thread and role of a stored memory
    /// are not changed by an upsert (`DuplicateId` when they differ: that is another memory
    /// under the same key); its expiry is set to the new one's (an expired copy not yet
    /// swept is written again whole). A memory without an id is simply added.
    pub async fn upsert(&self, memory: NewMemory) -> Result<Upserted> {
        memory.validate()?;
        let Some(id) = memory.id else {
            let id = self.add(memory).await?;
            return Ok(Upserted {
                memory: self.get(id).await?,
                outcome: UpsertOutcome::Inserted,
            });
        };
        let inner = self.inner.clone();
        let stored = blocking(move || match inner.store.get(id) {
            Ok(m) => Ok(Some(m)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        })
        .await??;
        let Some(stored) = stored else {
            // Two upserts of a new key at once: the loser finds the winner's row through
            // `add`'s retry rule (the same memory) or gets `DuplicateId`.
            let id = self.add(memory).await?;
            return Ok(Upserted {
                memory: self.get(id).await?,
                outcome: UpsertOutcome::Inserted,
            });
        };
        if stored.kind != memory.kind
            || stored.thread_id != memory.thread_id
            || stored.role != memory.role
        {
            return Err(StoreError::DuplicateId { id }.into());
        }
        let now = self.inner.clock.now();
        let expired = stored.lifetime.expires_at.is_some_and(|t| t <= now);
        let (mut unit, mut outcome) = if stored.content != memory.content || expired {
            // (An expired copy not yet swept is written again whole: revived.)
            let unit = self
                .update_with(id, memory.content, Some(memory.metadata))
                .await?;
            (unit, UpsertOutcome::ContentUpdated)
        } else if stored.metadata != memory.metadata {
            let inner = self.inner.clone();
            let metadata = memory.metadata;
            let unit = blocking(move || inner.store.set_metadata(id, metadata)).await??;
            (unit, UpsertOutcome::MetadataUpdated)
        } else {
            (stored, UpsertOutcome::Unchanged)
        };
        if unit.lifetime.expires_at != memory.lifetime.expires_at {
            let inner = self.inner.clone();
            let at = memory.lifetime.expires_at;
            unit = blocking(move || inner.store.set_expiry(id, at)).await??;
            if outcome == UpsertOutcome::Unchanged {
                outcome = UpsertOutcome::ExpiryUpdated;
            }
        }
        Ok(Upserted {
            memory: unit,
            outcome,
        })
    }

    /// Merges `patch` into a memory's metadata (JSON merge patch: `null` removes a field)
    /// without re-embedding it; returns the memory as stored.
    pub async fn patch_metadata(&self, id: MemoryId, patch: Metadata) -> Result<MemoryUnit> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.patch_metadata(id, patch)).await??)
    }

    /// One page of the memories `filter` admits, oldest first, after `cursor` (from the
    /// start when `None`); pass the page's `next` back for the following one. Stable under
    /// concurrent writes: nothing that was there when the listing started is repeated or
    /// skipped.
    pub async fn list_page(
        &self,
        filter: Filter,
        cursor: Option<Cursor>,
        limit: usize,
    ) -> Result<Page> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.page(&filter, cursor, limit)).await??)
    }

    /// Forgets memories so that nothing of them is recalled afterwards: they are deleted
    /// (one transaction), every summary built on them is written again from the sources it
    /// keeps, level by level up the tree (or deleted when none remain, or when the
    /// summarizer fails), and the embedding cache drops the texts of everything deleted or
    /// rewritten (and the sentences and lines of them the extractive summarizer embedded). No search, context, expansion or summary text returns a forgotten memory
    /// afterwards, and the store's files are scrubbed of it
    /// ([`cairn_store::MemoryBackend::erase_deleted`]; [`ForgetReport::erased`] says
    /// whether that was done whole).
    ///
    /// On a SQLite store a forget that does not finish (its process is killed, or it stops
    /// on an error after its deletes) is finished by the next open of the store: the
    /// summaries it had not written again yet are deleted instead, with what was built on
    /// them since (their sources stay and are summarized again by the next
    /// consolidation), the embedding cache keeps only the vectors of texts the store still
    /// holds, and the files are erased ([`cairn_store::Store::mark_forget`]). An open
    /// while another forget is under way leaves this to a later open.
    ///
    /// An unknown id in [`Forget::Ids`] is `NotFound` and forgets nothing.
    pub async fn forget(&self, what: Forget) -> Result<ForgetReport> {
        let (ids, thread) = match what {
            Forget::Ids(ids) => (ids, None),
            Forget::Thread(t) => (
                self.collect_ids(Filter::all().thread(t.clone())).await?,
                Some(t),
            ),
            Forget::Filter(f) => (self.collect_ids(f).await?, None),
            Forget::Everything => (self.collect_ids(Filter::all()).await?, None),
        };
        let mut report = ForgetReport::default();
        let mut purged = true;
        let ids_empty = ids.is_empty();
        // A thread's state rows (its running summary) are deleted too, memories or not.
        let erase = !ids_empty || thread.is_some();
        if erase {
            // Marked first: should this process stop before the erase below, the store's
            // next open runs it.
            let inner = self.inner.clone();
            blocking(move || inner.store.mark_for_erase()).await??;
        }
        // And the rest of the forget: the summaries to write again and the cache's purge.
        // Should this process stop first, the next open deletes those summaries and purges
        // every text the store no longer holds (a SQLite store; see `Store::mark_forget`).
        let forget_mark = match &self.inner.sqlite {
            Some(store) if !ids_empty => {
                let store = store.clone();
                Some(blocking(move || store.mark_forget()).await??)
            }
            _ => None,
        };
        if !ids_empty {
            let inner = self.inner.clone();
            // The texts of everything deleted (summaries left with no source too) go from
            // the cache as well.
            let mark = forget_mark.as_ref().map(|m| m.name.clone());
            let (deleted, detached, texts) = blocking(move || -> Result<_> {
                let (r, texts) = match (&inner.sqlite, &mark) {
                    (Some(store), Some(mark)) => match store.delete_marked(&ids, mark) {
                        Ok(done) => done,
                        // Nothing was deleted (an unknown id, say): nothing to finish.
                        Err(e) => {
                            if let Err(c) = store.clear_forget_marks(std::slice::from_ref(mark)) {
                                tracing::warn!(error = %c, "a forget mark stays: the next open purges the embedding cache");
                            }
                            return Err(e.into());
                        }
                    },
                    _ => inner
                        .store
                        .delete_many_with_texts(&ids, DeletePolicy::Detach)?,
                };
                Ok((r.deleted, r.detached, texts))
            })
            .await??;
            report.deleted = deleted;
            let mut purge = texts;
            let rewritten = self
                .rewrite_above(&detached, forget_mark.as_ref(), &mut report, &mut purge)
                .await;
            if let Err(e) = rewritten {
                // Stopped on an error after the deletes: the summaries it has not written
                // again go now, as the next open would delete them, so none that quotes
                // what was forgotten stays readable meanwhile.
                let inner = self.inner.clone();
                // The lock is held until the mark is dealt with: an open elsewhere does not
                // finish it meanwhile.
                blocking(move || {
                    abandon(&inner, forget_mark.as_ref().map(|m| m.name.as_str()), purge);
                    drop(forget_mark);
                })
                .await?;
                return Err(e);
            }
            let inner = self.inner.clone();
            purged = blocking(move || crate::harness::purge_cached(&inner, &purge)).await?;
            // Done but for the erase, which has its own mark. A mark left behind (a purge
            // that failed) has the next open purge the cache.
            if let (Some(store), Some(mark), true) = (&self.inner.sqlite, forget_mark, purged) {
                let store = store.clone();
                // The lock goes with the mark (a mark left behind is finished by an open).
                if let Err(e) = blocking(move || store.clear_forget_marks(&[mark.name])).await? {
                    tracing::warn!(error = %e, "a forget mark stays: the next open purges the embedding cache again");
                }
            }
        }
        if let Some(t) = thread {
            let inner = self.inner.clone();
            blocking(move || inner.store.clear_thread_state(&t)).await??;
        }
        // What the deletes left in the files goes too: the keyword index's older segments,
        // the log's older frames, the index snapshot's vectors. The memories are gone
        // whatever happens here, so a failure is reported, not returned.
        report.erased = if !erase {
            true
        } else {
            let inner = self.inner.clone();
            match blocking(move || inner.store.erase_deleted()).await? {
                Ok(whole) => whole && purged,
                Err(e) => {
                    tracing::warn!(error = %e, "forgotten memories' bytes stay in the store's files until the next erase");
                    false
                }
            }
        };
        Ok(report)
    }

    /// Writes again every summary above `detached` (and `detached` themselves), lowest
    /// level first (each rewrite marks the ones above stale; they read their sources' new
    /// text), deleting one the summarizer cannot write; their old texts (and the texts of
    /// what such a delete took along) go to `purge`. Rounds until none is left: a
    /// consolidation may have built a summary on a detached one meanwhile, still quoting
    /// it.
    async fn rewrite_above(
        &self,
        detached: &[MemoryId],
        mark: Option<&PendingForget>,
        report: &mut ForgetReport,
        purge: &mut Vec<String>,
    ) -> Result<()> {
        let mut done: HashSet<MemoryId> = HashSet::new();
        for round in 0..=4 {
            let inner = self.inner.clone();
            let (detached, seen) = (detached.to_vec(), done.clone());
            let affected = blocking(move || -> Result<Vec<(u32, u64, MemoryId)>> {
                let mut all: HashSet<MemoryId> = detached.iter().copied().collect();
                for id in &detached {
                    match inner.store.ancestors(*id) {
                        Ok(a) => all.extend(a.into_iter().map(|m| m.id)),
                        Err(StoreError::NotFound { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                let ids: Vec<MemoryId> = all.into_iter().filter(|i| !seen.contains(i)).collect();
                let mut order: Vec<(u32, u64, MemoryId)> = inner
                    .store
                    .sequenced(&ids)?
                    .into_iter()
                    .map(|(m, seq)| (m.level, seq, m.id))
                    .collect();
                order.sort_unstable();
                Ok(order)
            })
            .await??;
            if affected.is_empty() {
                break;
            }
            if round == 4 {
                // Consolidation keeps building on what this forget detaches: what is left
                // stays stale (rewritten by the next consolidation), and is logged.
                tracing::warn!(
                    summaries = affected.len(),
                    "summaries built during a forget on what it detached are left to the next consolidation"
                );
                break;
            }
            // Found after the delete (built meanwhile on what it detached): listed too, so
            // that a forget cut short from here has the next open delete them.
            if round > 0 {
                if let (Some(store), Some(mark)) = (&self.inner.sqlite, mark) {
                    let (store, mark) = (store.clone(), mark.name.clone());
                    let ids: Vec<MemoryId> = affected.iter().map(|(_, _, id)| *id).collect();
                    if let Err(e) =
                        blocking(move || store.list_forget_summaries(&mark, &ids)).await?
                    {
                        tracing::warn!(error = %e, "summaries found late are not on the forget's mark");
                    }
                }
            }
            for (_, _, id) in affected {
                done.insert(id);
                let old = match self.get(id).await {
                    Ok(m) => m,
                    // Deleted meanwhile (a summary above a dropped one that lost its last
                    // source).
                    Err(crate::HarnessError::NotFound { .. }) => continue,
                    Err(e) => return Err(e),
                };
                match self.refresh_summary(id).await {
                    Ok(_) => report.resummarized.push(id),
                    Err(e) => {
                        tracing::warn!(%id, error = %e, "a summary of forgotten memories could not be rewritten; it is deleted");
                        let inner = self.inner.clone();
                        let (r, texts) = match blocking(move || {
                            inner
                                .store
                                .delete_many_with_texts(&[id], DeletePolicy::Detach)
                        })
                        .await?
                        {
                            Ok(done) => done,
                            // Deleted meanwhile: gone either way.
                            Err(StoreError::NotFound { .. }) => continue,
                            Err(e) => return Err(e.into()),
                        };
                        purge.extend(texts);
                        report.dropped.push(id);
                        report
                            .deleted
                            .extend(r.deleted.into_iter().filter(|d| *d != id));
                    }
                }
                purge.push(old.content);
                // Done with: an open finishing this forget leaves it alone.
                if let (Some(store), Some(mark)) = (&self.inner.sqlite, mark) {
                    let (store, mark) = (store.clone(), mark.name.clone());
                    if let Err(e) = blocking(move || store.unlist_forget_summary(&mark, id)).await?
                    {
                        tracing::warn!(%id, error = %e, "a summary written again stays on its forget's mark: an open finishing the forget deletes it");
                    }
                }
            }
        }
        Ok(())
    }

    /// The ids of every memory `filter` admits, superseded and expired ones included.
    async fn collect_ids(&self, mut filter: Filter) -> Result<Vec<MemoryId>> {
        if filter.as_of.is_none() {
            filter.history = true;
        }
        filter.expired = true;
        let mut ids = Vec::new();
        let mut cursor = None;
        loop {
            let page = self.list_page(filter.clone(), cursor, COLLECT_PAGE).await?;
            ids.extend(page.items.iter().map(|m| m.id));
            match page.next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        Ok(ids)
    }
}

/// What a forget that stopped on an error after its deletes leaves: the summaries its mark
/// still lists (not written again yet, so possibly quoting what was forgotten) are deleted
/// with what was built on them, the cache forgets their texts and `purge`, and the mark
/// goes. Failures are logged: the mark then stays for the next open.
fn abandon(inner: &crate::harness::Inner, mark: Option<&str>, mut purge: Vec<String>) {
    let (Some(store), Some(mark)) = (&inner.sqlite, mark) else {
        crate::harness::purge_cached(inner, &purge);
        return;
    };
    let done = (|| -> std::result::Result<bool, StoreError> {
        let mine: Vec<_> = store
            .forget_marks()?
            .into_iter()
            .filter(|m| m.name == mark)
            .collect();
        purge.extend(crate::harness::delete_listed(store, &mine)?.1);
        Ok(crate::harness::purge_cached(inner, &purge))
    })();
    match done {
        Ok(true) => {
            if let Err(e) = store.clear_forget_marks(&[mark.to_owned()]) {
                tracing::warn!(error = %e, "a forget mark stays for the next open");
            }
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %e, "a forget stopped on an error is finished by the next open")
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use cairn_core::{NewMemory, Role, ThreadId};
    use cairn_embed::HashEmbedder;

    use super::*;

    async fn hashed(dir: &tempfile::TempDir) -> MemoryHarness {
        MemoryHarness::builder(dir.path().join("f.db"))
            .embedder(Arc::new(HashEmbedder::new(32)))
            .build()
            .await
            .unwrap()
    }

    /// A forget that stops on an error after its deletes is finished on the spot: the
    /// summaries its mark still lists go (with what was built on them), the texts gathered
    /// and theirs leave the cache, and the mark goes; a summary not listed stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_forget_deletes_what_it_listed() {
        let dir = tempfile::tempdir().unwrap();
        let mem = hashed(&dir).await;
        let t = ThreadId::new("t").unwrap();
        let mut ids = Vec::new();
        for text in ["the vault code is 9123", "lunch at noon", "a walk later"] {
            ids.push(
                mem.add(NewMemory::conversational(t.clone(), Role::User, text))
                    .await
                    .unwrap(),
            );
        }
        let low = mem
            .add_summary("vault 9123 and lunch", &ids[..2], Some("t"))
            .await
            .unwrap();
        let top = mem
            .add_summary("vault 9123, lunch, walk", &[low, ids[2]], Some("t"))
            .await
            .unwrap();
        let other = mem
            .add_summary("a walk", &ids[2..], Some("t"))
            .await
            .unwrap();
        let cache = mem.embedding_cache().unwrap().clone();
        assert!(cache.contains("vault 9123 and lunch").unwrap());
        let store = mem.sqlite().unwrap().clone();
        let pending = store.mark_forget().unwrap();
        let (_, texts) = store.delete_marked(&[ids[0]], &pending.name).unwrap();
        assert_eq!(texts, vec!["the vault code is 9123".to_owned()]);
        let inner = mem.inner.clone();
        let name = pending.name.clone();
        blocking(move || abandon(&inner, Some(&name), texts))
            .await
            .unwrap();
        assert!(store.forget_marks().unwrap().is_empty());
        for gone in [low, top] {
            assert!(matches!(
                mem.get(gone).await,
                Err(crate::HarnessError::NotFound { .. })
            ));
        }
        assert_eq!(mem.get(other).await.unwrap().id, other);
        assert_eq!(mem.get(ids[1]).await.unwrap().id, ids[1]);
        for text in [
            "the vault code is 9123",
            "vault 9123 and lunch",
            "vault 9123, lunch, walk",
        ] {
            assert!(!cache.contains(text).unwrap(), "{text}");
        }
        assert!(cache.contains("lunch at noon").unwrap());
    }

    /// The default summarizer's sentences are kept in memory while the harness lives and
    /// emptied when text leaves the store (here a forget).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forget_empties_the_sentence_memo() {
        let dir = tempfile::tempdir().unwrap();
        let mem = hashed(&dir).await;
        let t = ThreadId::new("t").unwrap();
        let mut ids = Vec::new();
        for (i, text) in [
            "We moved the boat to the north dock. The engine needs a service.",
            "My niece starts school in May. She already reads well.",
            "The roof leaks over the kitchen. A builder comes on Monday.",
        ]
        .into_iter()
        .enumerate()
        {
            let m = NewMemory::conversational(t.clone(), Role::User, text)
                .at(chrono::Utc::now() - chrono::Duration::hours(3 - i as i64));
            ids.push(mem.add(m).await.unwrap());
        }
        let policy = crate::ConsolidationPolicy::older_than(std::time::Duration::ZERO)
            .max_age(std::time::Duration::ZERO);
        assert!(!mem.consolidate(policy).await.unwrap().summaries.is_empty());
        let memo = mem.inner.sentences.clone().unwrap();
        assert!(memo.len() >= 6, "{}", memo.len());
        mem.forget(Forget::Ids(vec![ids[1]])).await.unwrap();
        assert_eq!(memo.len(), 0);
    }

    /// A text replaced in one memory (an update, a stale summary written again) takes from
    /// the sentence memo only the sentences the new text does not say: the rest stay, so the
    /// summaries written again do not embed them again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replaced_text_takes_only_its_own_sentences_from_the_memo() {
        let dir = tempfile::tempdir().unwrap();
        let mem = hashed(&dir).await;
        let t = ThreadId::new("t").unwrap();
        let mut ids = Vec::new();
        for (i, text) in [
            "We moved the boat to the north dock. The engine needs a service.",
            "My niece starts school in May. She already reads well.",
            "The roof leaks over the kitchen. A builder comes on Monday.",
        ]
        .into_iter()
        .enumerate()
        {
            let m = NewMemory::conversational(t.clone(), Role::User, text)
                .at(chrono::Utc::now() - chrono::Duration::hours(3 - i as i64));
            ids.push(mem.add(m).await.unwrap());
        }
        let policy = || {
            crate::ConsolidationPolicy::older_than(std::time::Duration::ZERO)
                .max_age(std::time::Duration::ZERO)
        };
        assert!(!mem
            .consolidate(policy())
            .await
            .unwrap()
            .summaries
            .is_empty());
        let memo = mem.inner.sentences.clone().unwrap();
        for s in [
            "The engine needs a service.",
            "My niece starts school in May.",
            "She already reads well.",
        ] {
            assert!(memo.contains(s), "{s}");
        }
        mem.update(
            ids[1],
            "My niece starts school in May. She cannot wait to meet her teacher.",
        )
        .await
        .unwrap();
        assert!(!memo.contains("She already reads well."));
        assert!(memo.contains("My niece starts school in May."));
        assert!(memo.contains("The engine needs a service."));
        // The summary above the updated turn is stale, and written again.
        let report = mem.consolidate(policy()).await.unwrap();
        assert!(!report.refreshed.is_empty());
        assert!(memo.contains("The engine needs a service."));
        assert!(memo.contains("A builder comes on Monday."));
        assert!(!memo.contains("She already reads well."));
    }
}
