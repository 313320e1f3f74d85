//! Driving a generation request: submit its prompts to the engine, feed the events to its
//! choices (`choices`), and write the answer in its format (`format`) as it grows or once at
//! the end. A failed write, or a response channel its client's connection has dropped, means
//! the client left: its engine requests are cancelled at once.

use super::choices::{Choices, Outcome, Released};
use super::format::{Failure, Format};
use super::models::Ready;
use super::reply::{ChunkedBody, RawResponse};
use super::work::Work;
use crate::engine::{Event, PromptImage, RequestId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The outcome of a request whose client went away before it was answered.
pub const GONE: &str = "cancelled (client gone)";

/// A whole answer sends its head once it is complete, so that a failure before then is a real
/// error status; only a request still running after this long (a long prefill) gets its `200`
/// head, then whitespace now and then before the JSON, so that proxies and clients see it alive.
pub const WHOLE_HEAD_AFTER: Duration = Duration::from_secs(10);
/// How often a handler waiting for events looks at its client and at the server's stop.
const WAKE: Duration = Duration::from_millis(100);
/// How long a started answer may go without a write: proxies and clients take a long silence
/// for a dead connection.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// The response: its head not sent yet, or its body under way.
enum Out {
    Waiting(RawResponse),
    Open(ChunkedBody),
}

/// What a running request needs besides its work: when its first token came, whether it may
/// still be shed (given how long it has waited), and the server's stop.
pub struct Watchers<'a> {
    pub on_first_token: &'a mut dyn FnMut(Instant),
    pub shed: &'a dyn Fn(Duration) -> bool,
    /// Turns true when the server's drain time is over: the answer ends at once with an error.
    pub cut: &'a AtomicBool,
}

/// Runs `work` and writes its answer in `format`. Failures before the response starts come
/// back with the response, so that they can be sent as an error status.
pub fn run(
    ready: &Ready,
    work: &Work,
    format: &mut dyn Format,
    resp: RawResponse,
    watch: Watchers,
) -> Result<Outcome, (Failure, RawResponse)> {
    let (ids, rx) = match submit(ready, work) {
        Ok(x) => x,
        Err(e) => return Err((e, resp)),
    };
    let mut answer = Answer {
        ready,
        work,
        format,
        choices: Choices::new(work),
        ids,
        since: Instant::now(),
        last_write: Instant::now(),
    };
    // A stream has its head at once (clients show that the request is under way).
    let content_type = answer.content_type();
    let out = match answer.format.streams() {
        true => resp.start_chunked(200, content_type).map(Out::Open),
        false => Ok(Out::Waiting(resp)),
    };
    match out {
        Ok(out) => answer.follow(out, &rx, watch),
        Err(_) => Ok(answer.gone()),
    }
}

/// One request's answer as its events arrive.
struct Answer<'a> {
    ready: &'a Ready,
    work: &'a Work,
    format: &'a mut dyn Format,
    choices: Choices,
    /// The engine's requests, one per prompt.
    ids: Vec<RequestId>,
    since: Instant,
    last_write: Instant,
}

impl Answer<'_> {
    /// Takes the events until every choice is done, the client leaves, the engine fails or
    /// stops, or the server's stop cuts the answer short; then ends the answer.
    fn follow(
        &mut self,
        mut out: Out,
        rx: &JobEvents,
        watch: Watchers,
    ) -> Result<Outcome, (Failure, RawResponse)> {
        let mut cut_short = "";
        while !self.choices.all_done() {
            if watch.cut.load(Ordering::Relaxed) {
                return self.end_with(out, Failure::Shutdown, "cut short (shutdown)");
            }
            out = match self.keep_alive(out, watch.shed) {
                Ok(out) => out,
                Err(stop) => return stop,
            };
            let (pi, ev) = match rx.recv_timeout(WAKE) {
                Ok(x) => x,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    cut_short = "engine stopped";
                    break;
                }
            };
            let tokenizer = &self.ready.tokenizer;
            match self
                .choices
                .apply(tokenizer, self.work, pi, ev, watch.on_first_token)
            {
                Ok(None) => {}
                Ok(Some(released)) => {
                    if self.send_released(&mut out, &released).is_err() {
                        return Ok(self.gone());
                    }
                }
                Err(e) => {
                    let failed = format!("failed ({e})");
                    return self.end_with(out, Failure::Engine(e), &failed);
                }
            }
        }
        // Stop strings can end every choice before the engine does: free its work now.
        self.cancel_all();
        match self.send_end(out) {
            Ok(()) => Ok(self.choices.outcome(cut_short)),
            Err(_) => Ok(self.choices.outcome(GONE)),
        }
    }

    fn content_type(&self) -> &'static str {
        match self.format.streams() {
            true => "text/event-stream",
            false => "application/json",
        }
    }

    fn cancel_all(&self) {
        self.ids.iter().for_each(|&id| self.ready.engine.cancel(id));
    }

    /// The client left: its work is cancelled.
    fn gone(&self) -> Outcome {
        self.cancel_all();
        self.choices.outcome(GONE)
    }

    /// A waiting head is held (or shed, or sent once the answer runs long); an open body gets
    /// a heartbeat after a silence. `Err`: the request ends here (its client left, or shed).
    fn keep_alive(
        &mut self,
        out: Out,
        shed: &dyn Fn(Duration) -> bool,
    ) -> Result<Out, Result<Outcome, (Failure, RawResponse)>> {
        match out {
            Out::Waiting(resp) => match self.hold(resp, shed) {
                Ok(out) => Ok(out),
                Err(Stop::Gone) => Err(Ok(self.gone())),
                Err(Stop::Shed(resp)) => {
                    self.cancel_all();
                    Err(Err((Failure::Shed, resp)))
                }
            },
            Out::Open(mut body) => {
                if self.last_write.elapsed() >= HEARTBEAT {
                    // A write that changes nothing for the client: an SSE comment line, or
                    // whitespace (valid before JSON).
                    let beat: &[u8] = match self.format.streams() {
                        true => b": keep-alive\n\n",
                        false => b" ",
                    };
                    if body.chunk(beat).is_err() {
                        return Err(Ok(self.gone()));
                    }
                    self.last_write = Instant::now();
                }
                Ok(Out::Open(body))
            }
        }
    }

    /// A whole answer whose head waits: its client may have gone; before its first token it
    /// can still be shed (a flood: its clients would take the slot it waits for anyway); after
    /// `WHOLE_HEAD_AFTER` its head goes out.
    fn hold(&self, resp: RawResponse, shed: &dyn Fn(Duration) -> bool) -> Result<Out, Stop> {
        if resp.peer_gone() {
            return Err(Stop::Gone);
        }
        if self.choices.first_token.is_none() && shed(self.since.elapsed()) {
            return Err(Stop::Shed(resp));
        }
        if self.since.elapsed() < WHOLE_HEAD_AFTER {
            return Ok(Out::Waiting(resp));
        }
        resp.start_chunked(200, self.content_type())
            .map(Out::Open)
            .map_err(|_| Stop::Gone)
    }

    /// What an event released, in the answer's format; sent at once where the body is open.
    fn send_released(&mut self, out: &mut Out, released: &Released) -> std::io::Result<()> {
        let chunks = self.format.released(&self.choices, released);
        if let Out::Open(body) = out {
            for c in &chunks {
                body.chunk(c.as_bytes())?;
            }
            if !chunks.is_empty() {
                self.last_write = Instant::now();
            }
        }
        Ok(())
    }

    /// Every choice is done: the whole answer with its head, or the end of the started body.
    fn send_end(&mut self, out: Out) -> std::io::Result<()> {
        match out {
            Out::Waiting(resp) => {
                let whole = self.format.whole(&self.choices);
                resp.send(200, self.content_type(), &[], whole.as_bytes())
            }
            Out::Open(mut body) => {
                let chunks = match self.format.streams() {
                    true => self.format.stream_end(&self.choices),
                    false => vec![self.format.whole(&self.choices)],
                };
                for c in &chunks {
                    body.chunk(c.as_bytes())?;
                }
                body.finish()
            }
        }
    }

    /// Ends an answer with `failure`: as the response itself if its head has not gone out
    /// yet, otherwise in the answer's own form.
    fn end_with(
        &mut self,
        out: Out,
        failure: Failure,
        result: &str,
    ) -> Result<Outcome, (Failure, RawResponse)> {
        self.cancel_all();
        match out {
            Out::Waiting(resp) => Err((failure, resp)),
            Out::Open(mut body) => {
                for c in self.format.failed(&self.choices, &failure) {
                    let _ = body.chunk(c.as_bytes());
                }
                let _ = body.finish();
                Ok(self.choices.outcome(result))
            }
        }
    }
}

/// Why a whole answer stopped before its head went out.
enum Stop {
    Gone,
    /// Refused after all (429): the response is given back for the refusal.
    Shed(RawResponse),
}

/// The work's images as rows of the model's width, by its projector.
fn encode_images(ready: &Ready, work: &Work) -> Result<Vec<PromptImage>, Failure> {
    if work.images.is_empty() {
        return Ok(Vec::new());
    }
    let Some(projector) = &ready.projector else {
        return Err(Failure::Refused("this model reads no images".into()));
    };
    // Encoded in slices between the engine's steps, so that its streams keep their pace.
    let mut slice = |piece: &mut dyn FnMut() -> bool| match &ready.encoder {
        Some(e) => {
            e.seat.run_slice(e.slowdown, piece);
        }
        None => while piece() {},
    };
    let mut out = Vec::new();
    for image in &work.images {
        let views = projector.embed_in_slices(&image.rgb, &mut slice);
        out.extend((image.views.iter().zip(views)).map(|(&at, rows)| PromptImage { at, rows }));
    }
    Ok(out)
}

/// A job's engine events, each tagged with the index of its prompt.
type JobEvents = Receiver<(usize, Event)>;

/// Submits every prompt of the work; its events arrive on one channel, tagged with the
/// prompt's index. A refused prompt cancels the ones already submitted.
fn submit(ready: &Ready, work: &Work) -> Result<(Vec<RequestId>, JobEvents), Failure> {
    let mut ids: Vec<RequestId> = Vec::new();
    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    let images = encode_images(ready, work)?;
    for (pi, prompt) in work.prompts.iter().enumerate() {
        let submitted =
            ready
                .engine
                .submit_with_images(prompt.clone(), images.clone(), work.params.clone());
        match submitted {
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
                return Err(Failure::Refused(e.to_string()));
            }
        }
    }
    Ok((ids, rx))
}
