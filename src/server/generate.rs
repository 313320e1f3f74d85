//! Driving a generation request for both endpoints: submit its prompts to the engine, feed
//! the events to its choices (`choices`), and write the answer as it grows or once at the end
//! (`answer`). A failed write means the client left: its engine requests are cancelled at once.

use super::answer::Writer;
use super::chat_request::OutputRules;
use super::choices::Choices;
use super::error::ApiError;
use super::http::RawResponse;
use super::Ready;
use crate::engine::{Event, GenParams, RequestId};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub enum Flavor {
    Completion {
        echo: Vec<String>,
    },
    /// A chat answer, split into reasoning, content and tool calls by these rules.
    Chat(OutputRules),
}

pub struct Job {
    pub id: String,
    pub created: u64,
    pub prompts: Vec<Vec<u32>>,
    pub params: GenParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Top-N alternatives per generated token (Some(0): only the token's own logprob).
    pub logprobs: Option<usize>,
    pub flavor: Flavor,
}

/// How a request ended, for its log line.
pub struct Outcome {
    /// The finish reasons ("stop", "length", several joined by '+'), or what cut it short.
    pub result: String,
    /// Tokens generated for the client, all choices together.
    pub completion_tokens: usize,
    pub first_token: Option<Instant>,
}

/// Runs a job and writes its answer; `on_first_token` is told when the first token came.
/// Errors before the response starts come back with the response, so they can be sent.
pub fn run(
    ready: &Ready,
    job: Job,
    resp: RawResponse,
    on_first_token: &mut dyn FnMut(Instant),
    shed: &dyn Fn(Duration) -> bool,
) -> Result<Outcome, (ApiError, RawResponse)> {
    let (ids, rx) = match submit(ready, &job) {
        Ok(x) => x,
        Err(e) => return Err((e, resp)),
    };
    let cancel_all = || ids.iter().for_each(|&id| ready.engine.cancel(id));
    let mut choices = Choices::new(&job);
    // A whole answer sends nothing before its first event: until then it can still be refused
    // (429) when `shed` says so (a flood: its clients would take the slot it waits for anyway,
    // sooner), and a client gone is seen by polling the socket instead of writing.
    let mut early = None;
    if !job.stream {
        let since = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_millis(250)) {
                Ok(x) => {
                    early = Some(x);
                    break;
                }
                Err(RecvTimeoutError::Timeout) => {
                    if resp.peer_gone() {
                        cancel_all();
                        return Ok(choices.outcome(GONE));
                    }
                    if shed(since.elapsed()) {
                        cancel_all();
                        return Err((ApiError::overloaded(1, false), resp));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    let mut writer = Writer::new(&job, &choices);
    let Ok(mut body) = resp.start_chunked(200, writer.content_type()) else {
        cancel_all();
        return Ok(choices.outcome(GONE)); // the client went away before the first byte
    };
    let heartbeat = writer.heartbeat();
    let mut last_write = Instant::now();
    let mut cut_short = "";
    while !choices.all_done() {
        if last_write.elapsed() >= heartbeat {
            if writer.beat(&mut body).is_err() {
                cancel_all();
                return Ok(choices.outcome(GONE));
            }
            last_write = Instant::now();
        }
        let received = match early.take() {
            Some(x) => Ok(x),
            None => rx.recv_timeout(heartbeat.saturating_sub(last_write.elapsed())),
        };
        let (pi, ev) = match received {
            Ok(x) => x,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                cut_short = "engine stopped";
                break;
            }
        };
        match choices.apply(ready, &job, pi, ev, on_first_token) {
            Ok(None) => {}
            Ok(Some(released)) => match writer.released(&mut body, ready, &job, &choices, released)
            {
                Ok(true) => last_write = Instant::now(),
                Ok(false) => {}
                Err(_) => {
                    cancel_all();
                    return Ok(choices.outcome(GONE));
                }
            },
            Err(e) => {
                cancel_all();
                let failed = format!("failed ({e})");
                writer.error(body, &ApiError::internal(e));
                return Ok(choices.outcome(&failed));
            }
        }
    }
    // Stop strings can end every choice before the engine does: free its work now.
    cancel_all();
    match writer.finish(body, ready, &job, &choices) {
        Ok(()) => Ok(choices.outcome(cut_short)),
        Err(_) => Ok(choices.outcome(GONE)),
    }
}

/// A job's engine events, each tagged with the index of its prompt.
type JobEvents = Receiver<(usize, Event)>;

/// Submits every prompt of the job; its events arrive on one channel, tagged with the prompt's
/// index. A refused prompt cancels the ones already submitted.
fn submit(ready: &Ready, job: &Job) -> Result<(Vec<RequestId>, JobEvents), ApiError> {
    let mut ids: Vec<RequestId> = Vec::new();
    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    for (pi, prompt) in job.prompts.iter().enumerate() {
        match ready.engine.submit(prompt.clone(), job.params.clone()) {
            Ok((id, events)) => {
                ids.push(id);
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for ev in events {
                        if tx.send((pi, ev)).is_err() {
                            break;
                        }
                    }
                });
            }
            Err(e) => {
                for id in ids {
                    ready.engine.cancel(id);
                }
                return Err(ApiError::bad_request(e.to_string()).param("prompt"));
            }
        }
    }
    Ok((ids, rx))
}

/// The outcome of a request whose client went away before it was answered.
pub const GONE: &str = "cancelled (client gone)";
