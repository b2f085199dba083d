//! Go's rendering of OS errors, for messages that users compare with
//! flannel's.

use std::io;

/// Go's rendering of an I/O error: the errno text with a lower-case first
/// letter, without Rust's ` (os error N)` suffix (`no such file or
/// directory`, as Go's `syscall.Errno` prints it).
pub fn io_error_text(e: &io::Error) -> String {
    let text = match e.raw_os_error() {
        Some(code) => {
            let full = io::Error::from_raw_os_error(code).to_string();
            match full.rfind(" (os error ") {
                Some(i) => full[..i].to_string(),
                None => full,
            }
        }
        None => e.to_string(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_error_text_is_go_errno() {
        let e = io::Error::from_raw_os_error(2);
        assert_eq!(io_error_text(&e), "no such file or directory");
    }
}
