//! Driving a generation request for both endpoints: submit its prompts to the engine, feed
//! the events to its choices (`choices`), and write the answer as it grows or once at the end
//! (`answer`). A failed write, or a response channel its client's connection has dropped,
//! means the client left: its engine requests are cancelled at once.

use super::answer::{Answering, Writer};
use super::chat_request::OutputRules;
use super::choices::Choices;
use super::error::ApiError;
use super::http::{ChunkedBody, RawResponse};
use super::responses::ResponseMeta;
use super::Ready;
use crate::engine::{Event, GenParams, RequestId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub enum Flavor {
    Completion {
        echo: Vec<String>,
    },
    /// A chat answer, split into reasoning, content and tool calls by these rules.
    Chat(OutputRules),
    /// A chat answer written as a Responses object (or its events).
    Response(OutputRules, Box<ResponseMeta>),
}

impl Flavor {
    /// The rules that split a chat answer (both chat shapes).
    pub fn rules(&self) -> Option<&OutputRules> {
        match self {
            Flavor::Chat(rules) | Flavor::Response(rules, _) => Some(rules),
            Flavor::Completion { .. } => None,
        }
    }
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
    /// A chat request in the legacy `functions` form: its call comes back as
    /// `message.function_call` with `finish_reason: "function_call"`.
    pub legacy_functions: bool,
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
) -> Result<Outcome, (ApiError, RawResponse)> {
    let (ids, rx) = match submit(ready, &job) {
        Ok(x) => x,
        Err(e) => return Err((e, resp)),
    };
    let cancel_all = || ids.iter().for_each(|&id| ready.engine.cancel(id));
    let mut choices = Choices::new(&job);
    let mut writer = Writer::new(&job, &choices);
    let since = Instant::now();
    // A stream has its head at once (clients show that the request is under way).
    let opened = if job.stream {
        resp.start_chunked(200, writer.content_type())
            .map(Out::Open)
    } else {
        Ok(Out::Waiting(resp))
    };
    let Ok(mut out) = opened else {
        cancel_all();
        return Ok(choices.outcome(GONE));
    };
    let mut last_write = Instant::now();
    let mut cut_short = "";
    while !choices.all_done() {
        if cut.load(Ordering::Relaxed) {
            cancel_all();
            let stopping = ApiError::unavailable("the server is shutting down");
            let cut = "cut short (shutdown)";
            let a = Answering::new(ready, &job, &choices);
            return end_with_error(out, &mut writer, a, &stopping, cut);
        }
        out = match out {
            Out::Waiting(resp) => {
                match hold(resp, &writer, since, choices.first_token.is_some(), shed) {
                    Ok(out) => out,
                    Err(stop) => {
                        cancel_all();
                        return stop.outcome(&choices);
                    }
                }
            }
            Out::Open(mut body) => {
                if last_write.elapsed() >= writer.heartbeat() {
                    if writer.beat(&mut body).is_err() {
                        cancel_all();
                        return Ok(choices.outcome(GONE));
                    }
                    last_write = Instant::now();
                }
                Out::Open(body)
            }
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
                let body = match out {
                    Out::Open(ref mut body) => Some(body),
                    Out::Waiting(_) => None,
                };
                let a = Answering::new(ready, &job, &choices);
                match writer.released(body, a, released) {
                    Ok(wrote) => last_write = if wrote { Instant::now() } else { last_write },
                    Err(_) => {
                        cancel_all();
                        return Ok(choices.outcome(GONE));
                    }
                }
            }
            Err(e) => {
                cancel_all();
                let failed = format!("failed ({e})");
                let e = ApiError::internal(e);
                let a = Answering::new(ready, &job, &choices);
                return end_with_error(out, &mut writer, a, &e, &failed);
            }
        }
    }
    // Stop strings can end every choice before the engine does: free its work now.
    cancel_all();
    match send_end(out, &mut writer, Answering::new(ready, &job, &choices)) {
        Ok(()) => Ok(choices.outcome(cut_short)),
        Err(_) => Ok(choices.outcome(GONE)),
    }
}

/// Every choice is done: the whole answer with its head, or the end of the started body.
fn send_end(out: Out, writer: &mut Writer, a: Answering) -> std::io::Result<()> {
    match out {
        Out::Waiting(resp) => {
            let whole = writer.whole(a).to_string();
            resp.send(200, writer.content_type(), &[], whole.as_bytes())
        }
        Out::Open(body) => writer.finish(body, a),
    }
}

/// Why a whole answer stopped before its head went out.
enum Stop {
    Gone,
    /// Refused after all (429): the response is given back for the refusal.
    Shed(RawResponse),
}

impl Stop {
    fn outcome(self, choices: &Choices) -> Result<Outcome, (ApiError, RawResponse)> {
        match self {
            Stop::Gone => Ok(choices.outcome(GONE)),
            Stop::Shed(resp) => Err((ApiError::overloaded(1, false), resp)),
        }
    }
}

/// A whole answer whose head waits: its client may have gone; before its first token it can
/// still be shed (a flood: its clients would take the slot it waits for anyway); after
/// `WHOLE_HEAD_AFTER` its head goes out.
fn hold(
    resp: RawResponse,
    writer: &Writer,
    since: Instant,
    first_token: bool,
    shed: &dyn Fn(Duration) -> bool,
) -> Result<Out, Stop> {
    if resp.peer_gone() {
        return Err(Stop::Gone);
    }
    if !first_token && shed(since.elapsed()) {
        return Err(Stop::Shed(resp));
    }
    if since.elapsed() < WHOLE_HEAD_AFTER {
        return Ok(Out::Waiting(resp));
    }
    resp.start_chunked(200, writer.content_type())
        .map(Out::Open)
        .map_err(|_| Stop::Gone)
}

/// Ends an answer with an error: as the response itself if its head has not gone out yet,
/// otherwise in the answer's own form.
fn end_with_error(
    out: Out,
    writer: &mut Writer,
    a: Answering,
    e: &ApiError,
    result: &str,
) -> Result<Outcome, (ApiError, RawResponse)> {
    match out {
        Out::Waiting(resp) => Err((e.clone(), resp)),
        Out::Open(body) => {
            writer.error(body, a, e);
            Ok(a.choices.outcome(result))
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
