//! 32-byte identifiers. Blob IDs are keyed BLAKE3 hashes of plaintext (so the
//! storage cannot confirm a known file); object IDs are unkeyed BLAKE3 hashes of
//! the stored bytes (so anyone can verify an object's integrity without a key).
//! Distinct newtypes keep the two from being confused.

use std::fmt;
use std::str::FromStr;

/// Raw 32-byte identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Id(pub [u8; 32]);

impl Id {
    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// First 8 hex characters, for humans.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..4])
    }

    /// Parses 64 hex characters.
    pub fn from_hex(s: &str) -> Result<Self, IdParseError> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| IdParseError(s.to_string()))?;
        Ok(Id(out))
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.short())
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A string that is not 64 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("not a 64-digit hex identifier: {0:?}")]
pub struct IdParseError(pub String);

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub Id);

        impl $name {
            /// Lower-case hex form.
            pub fn to_hex(&self) -> String { self.0.to_hex() }
            /// First 8 hex characters.
            pub fn short(&self) -> String { self.0.short() }
            /// The raw bytes.
            pub fn as_bytes(&self) -> &[u8; 32] { &self.0 .0 }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.0.short())
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { fmt::Display::fmt(&self.0, f) }
        }
        impl FromStr for $name {
            type Err = IdParseError;
            fn from_str(s: &str) -> Result<Self, IdParseError> { Id::from_hex(s).map($name) }
        }
    };
}

typed_id!(
    /// Keyed hash of a blob's plaintext: `BLAKE3-keyed(id_key, plaintext)`.
    BlobId
);
typed_id!(
    /// Unkeyed BLAKE3 of an object's stored bytes; names packs, index files,
    /// snapshots and key files.
    ObjectId
);

impl ObjectId {
    /// Names stored bytes: unkeyed BLAKE3, so integrity is checkable without a key.
    pub fn of(bytes: &[u8]) -> Self {
        ObjectId(Id(*blake3::hash(bytes).as_bytes()))
    }
}

/// [`ObjectId::of`] over bytes that arrive in pieces: a pack written to a
/// file as it fills is named without reading it back.
#[derive(Debug, Default, Clone)]
pub struct ObjectHasher(blake3::Hasher);

impl ObjectHasher {
    /// Adds the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The ID of everything added, as [`ObjectId::of`] gives it.
    pub fn finish(&self) -> ObjectId {
        ObjectId(Id(*self.0.finalize().as_bytes()))
    }
}
