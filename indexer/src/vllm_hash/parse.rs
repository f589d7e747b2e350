//! Reading a [`VllmVersion`] and a [`HashAlgo`] from the text an operator or an engine gives. Kept
//! apart from the two types so that they stay leaves: parsing is what needs [`VllmHashError`], and
//! that error names both types.

use std::str::FromStr;

use super::algo::HashAlgo;
use super::error::VllmHashError;
use super::version::VllmVersion;

impl VllmVersion {
    /// Parses `0.10.1`, `v0.33.0`, `0.11.0rc1`, `0.9.2+cu128`, `0.10.2.dev12+gabc`, `0.13`.
    pub fn parse(text: &str) -> Result<Self, VllmHashError> {
        let invalid = || VllmHashError::InvalidVersion(text.to_string());
        let trimmed = text.trim();
        let trimmed = trimmed.strip_prefix(['v', 'V']).unwrap_or(trimmed);
        let public = trimmed.split('+').next().unwrap_or("");
        let mut numbers = [0u32; 3];
        let mut rest = public;
        for (index, slot) in numbers.iter_mut().enumerate() {
            if index > 0 {
                match rest.strip_prefix('.') {
                    Some(after_dot) if after_dot.starts_with(|c: char| c.is_ascii_digit()) => rest = after_dot,
                    // MAJOR.MINOR is required; a missing patch means 0.
                    _ if index == 2 => break,
                    _ => return Err(invalid()),
                }
            }
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            *slot = rest[..digits].parse().map_err(|_| invalid())?;
            rest = &rest[digits..];
        }
        Ok(VllmVersion::new(numbers[0], numbers[1], numbers[2]))
    }
}

impl FromStr for VllmVersion {
    type Err = VllmHashError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        VllmVersion::parse(text)
    }
}

impl FromStr for HashAlgo {
    type Err = VllmHashError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        HashAlgo::ALL
            .into_iter()
            .find(|algo| algo.as_str() == text)
            .ok_or_else(|| VllmHashError::UnknownAlgo(text.to_string()))
    }
}
