//! Network namespaces and links made by a test and removed when dropped: the
//! same helpers `weft demo` uses.

pub use weft_control::demo::netns::*;
