//! Driving a generation request for both endpoints: submit its prompts to the engine, feed
//! the events to its choices (`choices`), and write the answer as it grows or once at the end
//! (`answer`). A failed write, or a response channel its client's connection has dropped,
//! means the client left: its engine requests are cancelled at once.

use super::answer::Writer;
use super::chat_request::OutputRules;
use super::choices::Choices;
use super::error::ApiError;
use super::http::{ChunkedBody, RawResponse};
use super::Ready;
use crate::engine::{Event, GenParams, RequestId};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// A whole answer sends its head once it is complete, so that a failure before then is a real
/// error status; only a request still running after this long (a long prefill) gets its `200`
/// head, then whitespace now and then before the JSON, so that proxies and clients see it alive.
pub const WHOLE_HEAD_AFTER: Duration = Duration::from_secs(10);
/// How often a handler waiting for events looks at its client and at the server's stop.
const WAKE: Duration = Duration::from_millis(100);

/// The response: its head not sent yet, or its body under way.
enum Out {
    Waiting(RawResponse),
    Open(ChunkedBody),
}

/// How an answer ends: its outcome, or an error to send as the response (with it).
type Answer = Result<Outcome, (ApiError, RawResponse)>;

/// Runs a job and writes its answer; `on_first_token` is told when the first token came.
/// Errors before the response starts come back with the response, so they can be sent. When
/// `cut` turns true (the server's drain time is over) the answer ends at once with an error.
pub fn run(
    ready: &Ready,
    job: Job,
    resp: RawResponse,
    on_first_token: &mut dyn FnMut(Instant),
    shed: &dyn Fn(Duration) -> bool,
    cut: &AtomicBool,
) -> Answer {
    let (ids, rx) = match submit(ready, &job) {
        Ok(x) => x,
        Err(e) => return Err((e, resp)),
    };
    let cancel_all = || ids.iter().for_each(|&id| ready.engine.cancel(id));
    let mut choices = Choices::new(&job);
    let mut writer = Writer::new(&job, &choices);
    let since = Instant::now();
    // A stream has its head at once (clients show that the request is under way).
    let mut out = if job.stream {
        match resp.start_chunked(200, writer.content_type()) {
            Ok(body) => Out::Open(body),
            Err(_) => {
                cancel_all();
                return Ok(choices.outcome(GONE));
            }
        }
    } else {
        Out::Waiting(resp)
    };
    let mut last_write = Instant::now();
    let mut cut_short = "";
    while !choices.all_done() {
        if cut.load(Ordering::Relaxed) {
            cancel_all();
            let e = ApiError::unavailable("the server is shutting down");
            return end_with_error(out, &writer, &e, &choices, "cut short (shutting down)");
        }
        let keep_alive = KeepAlive {
            writer: &writer,
            choices: &choices,
            since,
            shed,
            cancel_all: &cancel_all,
        };
        out = match keep_alive.tend(out, &mut last_write) {
            ControlFlow::Continue(out) => out,
            ControlFlow::Break(answer) => return answer,
        };
        let (pi, ev) = match rx.recv_timeout(WAKE) {
            Ok(x) => x,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                cut_short = "engine stopped";
                break;
            }
        };
        match choices.apply(ready, &job, pi, ev, on_first_token) {
            Ok(None) => {}
            Ok(Some(released)) => {
                let Out::Open(ref mut body) = out else {
                    continue; // a whole answer is written at its end
                };
                match writer.released(body, ready, &job, &choices, released) {
                    Ok(true) => last_write = Instant::now(),
                    Ok(false) => {}
                    Err(_) => {
                        cancel_all();
                        return Ok(choices.outcome(GONE));
                    }
                }
            }
            Err(e) => {
                cancel_all();
                let failed = format!("failed ({e})");
                return end_with_error(out, &writer, &ApiError::internal(e), &choices, &failed);
            }
        }
    }
    // Stop strings can end every choice before the engine does: free its work now.
    cancel_all();
    let sent = match out {
        Out::Waiting(resp) => {
            let whole = writer.whole(ready, &job, &choices).to_string();
            resp.send(200, writer.content_type(), &[], whole.as_bytes())
        }
        Out::Open(body) => writer.finish(body, ready, &job, &choices),
    };
    match sent {
        Ok(()) => Ok(choices.outcome(cut_short)),
        Err(_) => Ok(choices.outcome(GONE)),
    }
}

/// What keeps an answer alive between two engine events.
struct KeepAlive<'a> {
    writer: &'a Writer,
    choices: &'a Choices,
    /// When the job was submitted.
    since: Instant,
    shed: &'a dyn Fn(Duration) -> bool,
    /// Cancels the job's engine requests.
    cancel_all: &'a dyn Fn(),
}

impl KeepAlive<'_> {
    /// Keeps the response alive while no event comes: a whole answer ends when its client has
    /// left, or with 429 when `shed` refuses it before its first token, and gets its head once
    /// it has waited WHOLE_HEAD_AFTER; an open body gets its heartbeat when one is due.
    /// `Break`: how the answer ends, its engine requests cancelled.
    fn tend(&self, out: Out, last_write: &mut Instant) -> ControlFlow<Answer, Out> {
        match out {
            Out::Waiting(resp) => {
                if resp.peer_gone() {
                    return self.gone();
                }
                // Before its first token a whole answer can still be refused (429) when `shed`
                // says so (a flood: its clients would take the slot it waits for anyway).
                if self.choices.first_token.is_none() && (self.shed)(self.since.elapsed()) {
                    (self.cancel_all)();
                    return ControlFlow::Break(Err((ApiError::overloaded(1, false), resp)));
                }
                if self.since.elapsed() < WHOLE_HEAD_AFTER {
                    return ControlFlow::Continue(Out::Waiting(resp));
                }
                match resp.start_chunked(200, self.writer.content_type()) {
                    Ok(body) => ControlFlow::Continue(Out::Open(body)),
                    Err(_) => self.gone(),
                }
            }
            Out::Open(mut body) => {
                if last_write.elapsed() >= self.writer.heartbeat() {
                    if self.writer.beat(&mut body).is_err() {
                        return self.gone();
                    }
                    *last_write = Instant::now();
                }
                ControlFlow::Continue(Out::Open(body))
            }
        }
    }

    /// The client left: its requests are cancelled.
    fn gone(&self) -> ControlFlow<Answer, Out> {
        (self.cancel_all)();
        ControlFlow::Break(Ok(self.choices.outcome(GONE)))
    }
}

/// Ends an answer with an error: as the response itself if its head has not gone out yet,
/// otherwise in the answer's own form.
fn end_with_error(
    out: Out,
    writer: &Writer,
    e: &ApiError,
    choices: &Choices,
    result: &str,
) -> Answer {
    match out {
        Out::Waiting(resp) => Err((e.clone(), resp)),
        Out::Open(body) => {
            writer.error(body, e);
            Ok(choices.outcome(result))
        }
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
