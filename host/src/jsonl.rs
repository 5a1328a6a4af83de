//! Line-oriented JSON input, as `replay` requests and `simulate` traces are written: one JSON
//! object per line, blank lines and lines starting with `#` skipped, a UTF-8 byte-order mark at
//! the start of the file accepted. Errors carry the file's line number only.

use std::path::Path;

/// A line that could not be read, numbered from 1.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

const BYTE_ORDER_MARK: &[u8] = b"\xEF\xBB\xBF";

/// The content lines of `bytes` with their numbers; a line that is not UTF-8 is an error.
pub fn content_lines(bytes: &[u8]) -> ContentLines<&[u8]> {
    ContentLines::new(bytes)
}

/// The content lines of a reader, read one at a time (a file is never held whole), with their
/// numbers from 1: blank lines and `#` comments skipped, a byte-order mark before the first
/// line dropped, `\r\n` endings accepted. A line that is not UTF-8, or a read that fails, is an
/// error naming the line, after which the iterator ends.
pub struct ContentLines<R> {
    reader: R,
    number: usize,
    buffer: Vec<u8>,
    done: bool,
}

impl<R: std::io::BufRead> ContentLines<R> {
    pub fn new(reader: R) -> Self {
        ContentLines {
            reader,
            number: 0,
            buffer: Vec::new(),
            done: false,
        }
    }
}

impl<R: std::io::BufRead> Iterator for ContentLines<R> {
    type Item = Result<(usize, String), LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            self.buffer.clear();
            let read = self.reader.read_until(b'\n', &mut self.buffer);
            self.number += 1;
            let line = self.number;
            let fail = |message: String| Some(Err(LineError { line, message }));
            match read {
                Ok(0) => self.done = true,
                Ok(_) => {
                    // The line becomes the returned string in place, without a copy.
                    let mut bytes = std::mem::take(&mut self.buffer);
                    if bytes.ends_with(b"\n") {
                        bytes.pop();
                    }
                    if bytes.ends_with(b"\r") {
                        bytes.pop();
                    }
                    if line == 1 && bytes.starts_with(BYTE_ORDER_MARK) {
                        bytes.drain(..BYTE_ORDER_MARK.len());
                    }
                    match String::from_utf8(bytes) {
                        Ok(text) => {
                            let trimmed = text.trim_start();
                            if !trimmed.is_empty() && !trimmed.starts_with('#') {
                                return Some(Ok((line, text)));
                            }
                            self.buffer = text.into_bytes();
                        }
                        Err(e) => {
                            self.done = true;
                            return fail(format!(
                                "not valid UTF-8 (at byte {} of the line); save the file as UTF-8",
                                e.utf8_error().valid_up_to() + 1
                            ));
                        }
                    }
                }
                Err(e) => {
                    self.done = true;
                    return fail(format!("cannot read this line: {e}"));
                }
            }
        }
        None
    }
}

/// Parses one line as `T`; the message names the field it concerns (when it concerns one)
/// and the column, not serde_json's "line 1".
pub fn parse_line<T: serde::de::DeserializeOwned>(line: usize, text: &str) -> Result<T, LineError> {
    // Most lines parse; only a refused one is parsed again, tracking the path to name its field.
    if let Ok(value) = serde_json::from_str(text) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let (field, error) = match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(value) => match deserializer.end() {
            Ok(()) => return Ok(value),
            Err(e) => (String::new(), e),
        },
        Err(e) => (e.path().to_string(), e.into_inner()),
    };
    let message = json_message(&error);
    let message = if field.is_empty() || field == "." || error.is_syntax() {
        message
    } else {
        format!("{field}: {message}")
    };
    Err(LineError { line, message })
}

/// serde_json's message with the column, without its own line number (each line is its own
/// document, so that number is always 1).
pub fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let bare = match text.rfind(" at line ") {
        Some(i) => &text[..i],
        None => text.as_str(),
    };
    format!("{bare} (column {})", e.column())
}

/// Whether `output` names the same file as `input` (an existing file reached by another path
/// included), so writing it would destroy the input before it was read.
pub fn same_file(input: &Path, output: &Path) -> bool {
    match (std::fs::canonicalize(input), std::fs::canonicalize(output)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(bytes: &[u8]) -> Vec<Result<(usize, String), LineError>> {
        content_lines(bytes).collect()
    }

    #[test]
    fn skips_blank_and_comment_lines_and_keeps_file_numbers() {
        let got = numbers(b"{\"a\":1}\n\n  # note\r\n{\"b\":2}\r\n");
        assert_eq!(
            got,
            vec![Ok((1, "{\"a\":1}".into())), Ok((4, "{\"b\":2}".into()))]
        );
    }

    #[test]
    fn a_byte_order_mark_is_accepted() {
        let got = numbers(b"\xEF\xBB\xBF{\"a\":1}\n");
        assert_eq!(got, vec![Ok((1, "{\"a\":1}".into()))]);
    }

    #[test]
    fn invalid_utf8_names_its_line() {
        let got = numbers(b"{}\n{\"a\":\"\xff\"}\n");
        let error = got[1].clone().unwrap_err();
        assert_eq!(error.line, 2);
        assert!(error.message.contains("UTF-8"), "{error}");
    }

    #[test]
    fn json_errors_carry_the_column_only() {
        let error = parse_line::<serde_json::Value>(7, "{\"a\": }").unwrap_err();
        assert_eq!(error.line, 7);
        assert!(!error.message.contains("line 1"), "{error}");
        assert!(error.message.contains("column 7"), "{error}");
    }
}
