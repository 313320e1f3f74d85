//! What is wrong with a chat request's messages, tools or options, and the request field it is
//! about: the server answers it as a 400 that names that field.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    pub message: String,
    /// The request field at fault (`messages`, `tools`, `tool_choice`, `reasoning_effort`).
    pub param: &'static str,
}

impl Error {
    pub fn new(param: &'static str, message: impl Into<String>) -> Error {
        Error {
            message: message.into(),
            param,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.param)
    }
}

impl std::error::Error for Error {}
