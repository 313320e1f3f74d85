//! Sends one request to any OpenAI-compatible server, times its tokens and checks that the
//! response is well formed: a failure is a kind (`http_503`, `malformed: ...`), never a panic.

use super::workload::{Endpoint, Planned};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// Where and how to send.
#[derive(Clone)]
pub struct Target {
    pub base: String,
    pub model: String,
    pub api_key: Option<String>,
    pub agent: ureq::Agent,
    pub temperature: f64,
    pub ignore_eos: bool,
}

impl Target {
    pub fn new(base: &str, model: String, api_key: Option<String>, timeout: Duration) -> Target {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .timeout_connect(Some(Duration::from_secs(5)))
            .build()
            .new_agent();
        Target {
            base: base.trim_end_matches('/').to_string(),
            model,
            api_key,
            agent,
            temperature: 0.8,
            ignore_eos: false,
        }
    }

    pub fn get(&self, path: &str) -> Result<(u16, String), String> {
        let mut req = self.agent.get(format!("{}{path}", self.base));
        if let Some(k) = &self.api_key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let mut resp = req.call().map_err(kind_of)?;
        let status = resp.status().as_u16();
        let body = resp.body_mut().read_to_string().map_err(kind_of)?;
        Ok((status, body))
    }

    /// The first model the server lists (what `model` is set to when not given).
    pub fn first_model(&self) -> Result<String, String> {
        let (status, body) = self.get("/v1/models")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("/v1/models: {e}"))?;
        v["data"][0]["id"]
            .as_str()
            .filter(|_| status == 200)
            .map(str::to_string)
            .ok_or_else(|| format!("/v1/models answered {status} without a model id"))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Ok,
    /// The client hung up on purpose, as planned.
    Disconnected,
    Failed(String),
}

/// What happened to one request.
#[derive(Clone, Debug)]
pub struct Record {
    pub index: usize,
    /// Seconds from the start of the run to the send.
    pub sent_s: f64,
    pub outcome: Outcome,
    pub stream: bool,
    pub long: bool,
    pub ttft: Option<f64>,
    pub itl: Vec<f64>,
    pub latency: f64,
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: usize,
    /// Seconds the server asked to wait before retrying (a 429's Retry-After).
    pub retry_after_s: Option<u64>,
}

impl Record {
    /// A request about to be sent (or given up on) `sent_s` seconds into the run.
    pub fn new(p: &Planned, sent_s: f64) -> Record {
        Record {
            index: p.index,
            sent_s,
            outcome: Outcome::Ok,
            stream: p.stream,
            long: p.long,
            ttft: None,
            itl: Vec::new(),
            latency: 0.0,
            prompt_tokens: None,
            completion_tokens: 0,
            retry_after_s: None,
        }
    }
}

/// The body for a planned request.
pub fn body(t: &Target, p: &Planned, system: Option<&str>, text: &str) -> Value {
    let mut b = match p.endpoint {
        Endpoint::Completions => json!({
            "model": t.model,
            "prompt": match system { Some(s) => format!("{s}\n\n{text}"), None => text.to_string() },
        }),
        Endpoint::Chat => {
            let mut messages = Vec::new();
            if let Some(s) = system {
                messages.push(json!({"role": "system", "content": s}));
            }
            messages.push(json!({"role": "user", "content": text}));
            json!({"model": t.model, "messages": messages})
        }
    };
    b["max_tokens"] = json!(p.max_tokens);
    b["temperature"] = json!(t.temperature);
    b["seed"] = json!(p.index);
    b["stream"] = json!(p.stream);
    if p.stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    if t.ignore_eos {
        b["ignore_eos"] = json!(true);
    }
    b
}

fn kind_of(e: ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "timeout".into(),
        ureq::Error::ConnectionFailed => "connect".into(),
        ureq::Error::Io(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => "connect".into(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => "timeout".into(),
            k => format!("io: {k:?}"),
        },
        other => format!("http client: {other}"),
    }
}

/// Sends `body` and reads the answer, calling `on_token` with each content chunk's arrival
/// time; the client hangs up (`Disconnected`) when it returns false, or after the planned
/// number of chunks.
pub fn send(
    t: &Target,
    p: &Planned,
    body: &Value,
    run_start: Instant,
    mut on_token: impl FnMut(Instant) -> bool,
) -> Record {
    let path = match p.endpoint {
        Endpoint::Completions => "/v1/completions",
        Endpoint::Chat => "/v1/chat/completions",
    };
    let start = Instant::now();
    let mut rec = Record::new(p, (start - run_start).as_secs_f64());
    let result = exchange(t, p, path, body, start, &mut rec, &mut on_token);
    rec.latency = start.elapsed().as_secs_f64();
    rec.outcome = match result {
        Ok(o) => o,
        Err(kind) => Outcome::Failed(kind),
    };
    rec
}

fn exchange(
    t: &Target,
    p: &Planned,
    path: &str,
    body: &Value,
    start: Instant,
    rec: &mut Record,
    on_token: &mut impl FnMut(Instant) -> bool,
) -> Result<Outcome, String> {
    let mut req = t
        .agent
        .post(format!("{}{path}", t.base))
        .header("Content-Type", "application/json");
    if let Some(k) = &t.api_key {
        req = req.header("Authorization", format!("Bearer {k}"));
    }
    let mut resp = req.send(body.to_string()).map_err(kind_of)?;
    let status = resp.status().as_u16();
    if status != 200 {
        let retry_after = resp.headers().contains_key("retry-after");
        rec.retry_after_s = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let text = resp.body_mut().read_to_string().map_err(kind_of)?;
        let parsed: Option<Value> = serde_json::from_str(&text).ok();
        if parsed
            .as_ref()
            .and_then(|v| v["error"]["message"].as_str())
            .is_none()
        {
            return Err(format!(
                "malformed: {status} without an OpenAI-style error body"
            ));
        }
        if status == 429 && !retry_after {
            return Err("malformed: 429 without Retry-After".into());
        }
        return Err(format!("http_{status}"));
    }
    if !p.stream {
        let text = resp.body_mut().read_to_string().map_err(kind_of)?;
        let v: Value = serde_json::from_str(&text).map_err(|_| "malformed: body is not JSON")?;
        check_completion(&v, p, rec)?;
        return Ok(Outcome::Ok);
    }
    let reader = BufReader::new(resp.into_body().into_reader());
    read_stream(reader, p, start, rec, on_token)
}

fn check_completion(v: &Value, p: &Planned, rec: &mut Record) -> Result<(), String> {
    let (object, text) = match p.endpoint {
        Endpoint::Completions => ("text_completion", &v["choices"][0]["text"]),
        Endpoint::Chat => ("chat.completion", &v["choices"][0]["message"]["content"]),
    };
    if v["object"] != object {
        return Err(format!("malformed: object is not {object}"));
    }
    if !text.is_string() {
        return Err("malformed: no text in choices[0]".into());
    }
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap_or("");
    let used = v["usage"]["completion_tokens"]
        .as_u64()
        .ok_or("malformed: no usage")? as usize;
    check_finish(finish, used, p)?;
    rec.completion_tokens = used;
    rec.prompt_tokens = v["usage"]["prompt_tokens"].as_u64().map(|n| n as usize);
    Ok(())
}

fn check_finish(finish: &str, used: usize, p: &Planned) -> Result<(), String> {
    match finish {
        "stop" if used <= p.max_tokens => Ok(()),
        "length" if used == p.max_tokens => Ok(()),
        "stop" | "length" => Err(format!(
            "malformed: {used} tokens for max_tokens {} (finish {finish})",
            p.max_tokens
        )),
        other => Err(format!("malformed: finish_reason {other:?}")),
    }
}

/// Reads the stream's next line into `line`; false at its end.
fn next_line(reader: &mut impl BufRead, line: &mut String) -> Result<bool, String> {
    line.clear();
    match reader.read_line(line) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err("timeout".into()),
        Err(e) => Err(format!("io: {:?}", e.kind())),
    }
}

/// The text a streamed chunk `v` carries in its first choice `choice`, once the chunk is
/// checked to be the kind `endpoint` streams.
fn chunk_text<'a>(
    v: &Value,
    choice: &'a Value,
    endpoint: Endpoint,
) -> Result<Option<&'a str>, String> {
    let chunk_object = match endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::Chat => "chat.completion.chunk",
    };
    if v["object"] != chunk_object {
        return Err(format!("malformed: chunk object is not {chunk_object}"));
    }
    Ok(match endpoint {
        Endpoint::Completions => choice["text"].as_str(),
        Endpoint::Chat => choice["delta"]["content"].as_str(),
    })
}

fn read_stream(
    mut reader: impl BufRead,
    p: &Planned,
    start: Instant,
    rec: &mut Record,
    on_token: &mut impl FnMut(Instant) -> bool,
) -> Result<Outcome, String> {
    let (mut chunks, mut finish, mut done) = (0usize, None::<String>, false);
    let mut last: Option<Instant> = None;
    let mut line = String::new();
    while next_line(&mut reader, &mut line)? {
        let Some(data) = line.trim_end().strip_prefix("data:") else {
            continue; // blank separators, comments, event names
        };
        let data = data.trim_start();
        if done {
            return Err("malformed: data after [DONE]".into());
        }
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).map_err(|_| "malformed: chunk is not JSON")?;
        if v.get("error").is_some() {
            return Err("stream_error".into());
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            rec.prompt_tokens = u["prompt_tokens"].as_u64().map(|n| n as usize);
            rec.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
        }
        let Some(choice) = v["choices"].get(0) else {
            continue; // the usage chunk
        };
        let text = chunk_text(&v, choice, p.endpoint)?;
        if text.is_some_and(|s| !s.is_empty()) {
            let now = Instant::now();
            match last {
                None => rec.ttft = Some((now - start).as_secs_f64()),
                Some(prev) => rec.itl.push((now - prev).as_secs_f64()),
            }
            last = Some(now);
            chunks += 1;
            if !on_token(now) || p.disconnect_after == Some(chunks) {
                return Ok(Outcome::Disconnected); // dropping the reader closes the socket
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            if finish.replace(f.to_string()).is_some() {
                return Err("malformed: two finish_reasons".into());
            }
        }
    }
    if !done {
        return Err("malformed: stream ended without [DONE]".into());
    }
    let finish = finish.ok_or("malformed: stream without finish_reason")?;
    if rec.completion_tokens == 0 {
        rec.completion_tokens = chunks; // servers that send no usage: one token per chunk
    }
    check_finish(&finish, rec.completion_tokens, p)?;
    Ok(Outcome::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(max_tokens: usize, disconnect_after: Option<usize>) -> Planned {
        Planned {
            index: 0,
            at_s: 0.0,
            endpoint: Endpoint::Completions,
            stream: true,
            system: None,
            words: 8,
            long: false,
            max_tokens,
            disconnect_after,
        }
    }

    fn record() -> Record {
        Record::new(&planned(1, None), 0.0)
    }

    fn chunk(text: &str, finish: Option<&str>) -> String {
        let v = json!({"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]});
        format!("data: {v}\n\n")
    }

    fn read(sse: &str, p: &Planned) -> (Result<Outcome, String>, Record) {
        let mut rec = record();
        let r = read_stream(sse.as_bytes(), p, Instant::now(), &mut rec, &mut |_| true);
        (r, rec)
    }

    #[test]
    fn a_good_stream_is_timed_and_counted() {
        let usage = json!({"object": "text_completion", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}});
        let sse = format!(
            "{}{}{}data: {usage}\n\ndata: [DONE]\n\n",
            chunk("a", None),
            chunk("b", None),
            chunk("c", Some("length"))
        );
        let (r, rec) = read(&sse, &planned(3, None));
        assert_eq!(r, Ok(Outcome::Ok));
        assert!(rec.ttft.is_some());
        assert_eq!(rec.itl.len(), 2);
        assert_eq!((rec.prompt_tokens, rec.completion_tokens), (Some(5), 3));
    }

    #[test]
    fn broken_streams_are_named() {
        let p = planned(3, None);
        let no_done = format!("{}{}", chunk("a", None), chunk("b", Some("stop")));
        assert_eq!(
            read(&no_done, &p).0,
            Err("malformed: stream ended without [DONE]".into())
        );
        let no_finish = format!("{}data: [DONE]\n\n", chunk("a", None));
        assert_eq!(
            read(&no_finish, &p).0,
            Err("malformed: stream without finish_reason".into())
        );
        let bad_json = "data: {not json\n\ndata: [DONE]\n\n";
        assert_eq!(
            read(bad_json, &p).0,
            Err("malformed: chunk is not JSON".into())
        );
        let too_long = format!(
            "{}{}data: [DONE]\n\n",
            chunk("a", None),
            chunk("b", Some("length"))
        );
        assert!(read(&too_long, &planned(1, None))
            .0
            .unwrap_err()
            .contains("max_tokens 1"));
        let after = format!(
            "{}data: [DONE]\n\n{}",
            chunk("a", Some("stop")),
            chunk("b", None)
        );
        assert_eq!(
            read(&after, &p).0,
            Err("malformed: data after [DONE]".into())
        );
        let error = "data: {\"error\": {\"message\": \"x\"}}\n\n";
        assert_eq!(read(error, &p).0, Err("stream_error".into()));
    }

    #[test]
    fn a_planned_hang_up_stops_reading() {
        let sse = format!(
            "{}{}{}",
            chunk("a", None),
            chunk("b", None),
            chunk("c", None)
        );
        let (r, rec) = read(&sse, &planned(8, Some(2)));
        assert_eq!(r, Ok(Outcome::Disconnected));
        assert_eq!(rec.itl.len(), 1);
    }
}
