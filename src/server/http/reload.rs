//! A reload (`SIGHUP`, `POST /admin/reload`): the profile read again and, where a model's
//! section or one of its files changed, the models loaded anew beside the running ones and
//! checked (a strict load, a short prompt each, the memory check); only then do new requests
//! go to them. Requests in flight finish on the old models, which are freed when the last of
//! them ends. A reload that fails leaves the old models serving, and says why in the log,
//! `/metrics` and `/api/status`.

use super::reloads::Reloads;
use super::server::Server;
use crate::engine::{Event, GenParams};
use crate::server::generate::{stamps, Kind, Models, Ready};
use crate::systemd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a reload did.
pub enum Outcome {
    /// Nothing the models were loaded from changed.
    Unchanged,
    /// New models serve: their ids.
    Reloaded(Vec<String>),
}

/// The most a new model's self-test may take.
const SELF_TEST_LIMIT: Duration = Duration::from_secs(120);

impl Server {
    /// Reloads (one at a time), counting how it went; `why` is logged (the signal or the
    /// endpoint).
    pub(super) fn reload(&self, why: &str) -> Result<Outcome, String> {
        // Held for the whole reload; `reloads` only for a moment, since the front reads it
        // for every /health.
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        log::info!("reload ({why}): reading the profile again");
        systemd::notify(&["RELOADING=1", "STATUS=reloading"]);
        let outcome = self.try_reload();
        let mut reloads = self.reloads.lock().unwrap_or_else(|e| e.into_inner());
        match &outcome {
            Ok(Outcome::Unchanged) => {
                reloads.unchanged += 1;
                reloads.last_error = None;
                log::info!("reload: nothing changed; the models serving stay");
            }
            Ok(Outcome::Reloaded(ids)) => {
                reloads.done += 1;
                reloads.last_error = None;
                log::info!("reload: now serving {}", ids.join(", "));
            }
            Err(e) => {
                reloads.failed += 1;
                reloads.last_error = Some(e.clone());
                log::error!("reload failed, the running models keep serving: {e}");
            }
        }
        drop(reloads);
        self.notify_serving();
        outcome
    }

    /// How the reloads went.
    pub(super) fn reloads(&self) -> Reloads {
        self.reloads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn try_reload(&self) -> Result<Outcome, String> {
        let running = self.ready().ok_or("the models are still loading")?;
        if self.draining.load(Ordering::Relaxed) {
            return Err("the server is shutting down".into());
        }
        exit_if_changed_in_place(&running);
        let specs = match &self.config.reread {
            Some(reread) => (reread.0)().map_err(|e| format!("{e:#}"))?,
            None => self.config.models.clone(),
        };
        if specs == running.specs && stamps(&specs) == running.stamps {
            return Ok(Outcome::Unchanged);
        }
        let (models, threads) = self.load_models(&specs).map_err(|e| format!("{e:#}"))?;
        if let Err(e) = self_test(&models) {
            for ready in &models.list {
                ready.engine.shutdown();
            }
            drop(models);
            for thread in threads {
                let _ = thread.join();
            }
            return Err(e);
        }
        let ids = models.list.iter().map(|m| m.model_name.clone()).collect();
        *self.ready.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(models));
        let mut kept = self
            .reloaded_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        kept.extend(threads);
        Ok(Outcome::Reloaded(ids))
    }
}

/// A file the running models were read from, changed in place since (the same inode, another
/// length or time): its mapping now reads bytes no check has seen, or faults past its end. The
/// process exits with one line saying so, and systemd (`Restart=on-failure`) starts it again
/// on the file as it is now.
fn exit_if_changed_in_place(running: &Models) {
    let changed = running
        .stamps
        .iter()
        .flatten()
        .find(|s| s.changed_in_place());
    if let Some(stamp) = changed {
        log::error!(
            "{} was rewritten or truncated in place while served (replace a model by renaming \
             a new file over it): exiting so that the service restarts on the new file",
            stamp.path.display()
        );
        std::process::exit(1);
    }
}

/// Each new model answers a short prompt: a generating model greedily continues it, an
/// embedding model embeds it into finite numbers.
fn self_test(models: &Models) -> Result<(), String> {
    for ready in &models.list {
        self_test_one(ready).map_err(|e| format!("model {}: self-test: {e}", ready.model_name))?;
    }
    Ok(())
}

fn self_test_one(ready: &Ready) -> Result<(), String> {
    let prompt = ready
        .tokenizer
        .encode("The quick brown fox", true)
        .map_err(|e| e.to_string())?;
    let mut params = GenParams {
        max_tokens: Some(4),
        ignore_eos: true,
        embed: ready.kind == Kind::Embed,
        ..GenParams::default()
    };
    params.sampling.temperature = 0.0;
    let (_, events) = ready
        .engine
        .submit(prompt, params)
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + SELF_TEST_LIMIT;
    let vocab = ready.tokenizer.vocab_size() as u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Token { token, .. }) if token >= vocab => {
                return Err(format!("token {token} is outside the vocabulary"))
            }
            Ok(Event::Finished {
                completion_tokens, ..
            }) if completion_tokens > 0 => return Ok(()),
            Ok(Event::Finished { .. }) => return Err("no token generated".into()),
            Ok(Event::Embedding { vector, .. }) => {
                return match vector.iter().all(|x| x.is_finite()) && !vector.is_empty() {
                    true => Ok(()),
                    false => Err("the embedding is not finite".into()),
                }
            }
            Ok(Event::Error(e)) => return Err(e),
            Ok(_) => {}
            Err(_) => return Err(format!("no answer in {} s", SELF_TEST_LIMIT.as_secs())),
        }
    }
}
