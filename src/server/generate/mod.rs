//! Running requests on the engines: the models loaded (`models`, their LoRA adapters in
//! `adapters`, the files they came from in `files`), a generation request's work (`work`)
//! submitted and its events turned into choices (`choices`, `text`), its answer written as it
//! grows or once at the end (`run`) in the shape a caller chooses (`format`), down the channel
//! to the client's connection (`reply`); embeddings (`embed`).

mod adapters;
mod choices;
mod embed;
mod files;
mod format;
mod models;
mod reply;
mod run;
mod text;
mod work;

pub use choices::{Choice, Choices, Released};
pub use embed::embed;
pub use files::stamps;
pub use format::{Failure, Format};
pub use models::{Kind, Models, Ready};
pub use reply::{HandedBody, RawResponse};
pub use run::{run, Watchers, GONE};
pub use work::{PendingImage, Work};
