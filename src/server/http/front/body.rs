//! The body of every answer the front gives hyper: whole (the front's own answers, and handlers'
//! complete ones: sent with `Content-Length`), or streamed from a handler's channel. When hyper
//! has taken all of it, or dropped it, the connection's watch is told the answer is done.

use super::watch::Watch;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

pub struct Body {
    inner: Inner,
    watch: Option<Rc<Watch>>,
}

enum Inner {
    Whole(Option<Bytes>),
    Stream(mpsc::Receiver<Option<Bytes>>),
}

impl Body {
    pub fn whole(bytes: Bytes, watch: Rc<Watch>) -> Body {
        Body {
            inner: Inner::Whole(Some(bytes)),
            watch: Some(watch),
        }
    }

    pub fn stream(rx: mpsc::Receiver<Option<Bytes>>, watch: Rc<Watch>) -> Body {
        Body {
            inner: Inner::Stream(rx),
            watch: Some(watch),
        }
    }

    fn done(&mut self) {
        if let Some(w) = self.watch.take() {
            w.answer_done();
        }
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        self.done();
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        let frame = match &mut this.inner {
            Inner::Whole(bytes) => bytes.take().map(|b| Ok(Frame::data(b))),
            Inner::Stream(rx) => match std::task::ready!(rx.poll_recv(cx)) {
                Some(Some(b)) => Some(Ok(Frame::data(b))),
                Some(None) => None,
                // The handler's end went without finishing the body (it panicked): the
                // connection is closed rather than the body ended as if it were whole.
                None => Some(Err(io::Error::other("the answer was cut short"))),
            },
        };
        if !matches!(frame, Some(Ok(_))) {
            this.done();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.inner, Inner::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Inner::Stream(_) => SizeHint::default(),
        }
    }
}
