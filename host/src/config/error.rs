//! Configuration errors that point at the operator's file.

use std::fmt;
use std::path::{Path, PathBuf};

/// A problem in a config file: where it is and what to do about it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line, when the problem has a place in the file.
    pub line: Option<usize>,
    /// The plugin instance concerned, as `name (type)`.
    pub plugin: Option<String>,
    /// The parameter or key concerned.
    pub field: Option<String>,
    pub message: String,
}

impl ConfigError {
    pub fn new(file: &Path, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            line: None,
            plugin: None,
            field: None,
            message: message.into(),
        }
    }

    pub fn at_line(mut self, line: Option<usize>) -> Self {
        self.line = line;
        self
    }

    pub fn plugin(mut self, name: &str, type_name: &str) -> Self {
        self.plugin = Some(if name == type_name {
            format!("'{name}'")
        } else {
            format!("'{name}' ({type_name})")
        });
        self
    }

    pub fn field(mut self, field: impl Into<String>) -> Self {
        let field = field.into();
        if !field.is_empty() {
            self.field = Some(field);
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        f.write_str(": ")?;
        if let Some(plugin) = &self.plugin {
            write!(f, "plugin {plugin}: ")?;
        }
        if let Some(field) = &self.field {
            if !self.message.contains(field.as_str()) {
                write!(f, "{field}: ")?;
            }
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}
