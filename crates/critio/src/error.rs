//! The error every layer's configuration check returns.
//!
//! A leaf module: each layer's config (`block`, `cache`, `log`, `nvwc`,
//! `sync`, the stack's `device` and layout) validates itself with it, and
//! [`crate::config::Config`] gathers those configs into one file. Keeping
//! the error here, below all of them, is what lets `config` depend on the
//! layers without the layers depending back on `config`.

/// A configuration that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field is out of its allowed range.
    #[error("config: `{field}` = {value} is invalid: {allowed}")]
    Invalid {
        /// The dotted field name, as in the config file.
        field: &'static str,
        /// The rejected value.
        value: String,
        /// What is allowed instead.
        allowed: String,
    },
    /// The config file is not valid TOML for this schema.
    #[error("config: cannot parse: {0}")]
    Parse(#[from] toml::de::Error),
}
