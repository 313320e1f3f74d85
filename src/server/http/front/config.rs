//! The front's limits: timeouts, the connection cap, the per-client buckets and the pacing of
//! refusals (a profile's `[http]` section).

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct FrontConfig {
    /// From accept (or the first byte of a further request on a kept-alive connection) to the
    /// end of the head.
    pub header_timeout: Duration,
    /// From the end of the head to the end of the body.
    pub body_timeout: Duration,
    /// A kept-alive connection with no new request, or an answer the client does not read.
    pub idle_timeout: Duration,
    /// Connections the front holds at once; a connection beyond is closed at accept.
    pub max_connections: usize,
    /// Per-client token bucket: generation requests a second per address; 0: off.
    pub client_rate_per_s: f64,
    pub client_burst: f64,
    /// Refusals the front answers a second at most (the rest wait their turn); 0: no bound.
    pub max_rejections_per_s: f64,
}
