//! Cryptography for capsule, with no I/O.
//!
//! * Every stored byte (except key-file metadata) is sealed in an *envelope*:
//!   `nonce (24) | XChaCha20-Poly1305 ciphertext | tag (16)`. Nonces are 192
//!   random bits, so concurrent clients writing with the same master key never
//!   collide in practice (birthday bound ~2^96 messages), with no counters or
//!   coordination to get wrong after a crash or a repository rollback.
//! * Each envelope binds *associated data* naming what it is (a blob with its
//!   ID, an index, a snapshot...), so the storage cannot swap one ciphertext for
//!   another of a different role or ID.
//! * Blob IDs are keyed BLAKE3 over the plaintext, so a storage operator cannot
//!   confirm that a known file is present.
//! * Passwords are stretched with Argon2id and only wrap the master key, so
//!   several passwords can open one repository and changing one re-encrypts
//!   nothing.

use capsule_format::{BlobId, BlobType, Id};
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::Tag;
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Nonce length of an envelope.
pub const NONCE_LEN: usize = 24;
/// Authentication tag length.
pub const TAG_LEN: usize = 16;
/// Bytes an envelope adds to its plaintext.
pub const ENVELOPE_OVERHEAD: usize = NONCE_LEN + TAG_LEN;
/// Length of serialized master key material.
pub const MASTER_KEY_LEN: usize = 32 + 32 + 8 + 8;

/// Errors from this crate.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// Authentication failed: wrong key, or the bytes were modified.
    #[error("authentication failed (wrong key, or the data was modified or truncated)")]
    Auth,
    /// Input too short to be an envelope.
    #[error("envelope too short: {0} bytes")]
    TooShort(usize),
    /// The operating system's random source failed.
    #[error("random number generator failed: {0}")]
    Rng(String),
    /// Bad KDF parameters.
    #[error("invalid key derivation parameters: {0}")]
    Kdf(String),
    /// Master key bytes have the wrong length.
    #[error("invalid master key material")]
    BadMasterKey,
}

/// What an envelope holds; becomes its associated data.
#[derive(Debug, Clone, Copy)]
pub enum Aad<'a> {
    /// A blob inside a pack: binds type and ID.
    Blob(BlobType, &'a BlobId),
    /// A pack header.
    PackHeader,
    /// An index file.
    Index,
    /// A snapshot.
    Snapshot,
    /// The repository config.
    Config,
    /// Master key material inside a key file.
    KeyFile,
    /// A writer's session (lease) object.
    Session,
    /// A prune's mark of packs to delete.
    PruneMark,
    /// The repository's quota.
    Quota,
    /// A record of a verified slice of the packs.
    Verified,
}

impl Aad<'_> {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Aad::Blob(t, id) => {
                let mut v = Vec::with_capacity(41);
                v.extend_from_slice(b"capsule:blob");
                v.push(t.to_byte());
                v.extend_from_slice(id.as_bytes());
                v
            }
            Aad::PackHeader => b"capsule:packheader".to_vec(),
            Aad::Index => b"capsule:index".to_vec(),
            Aad::Snapshot => b"capsule:snapshot".to_vec(),
            Aad::Config => b"capsule:config".to_vec(),
            Aad::KeyFile => b"capsule:keyfile".to_vec(),
            Aad::Session => b"capsule:session".to_vec(),
            Aad::PruneMark => b"capsule:prunemark".to_vec(),
            Aad::Quota => b"capsule:quota".to_vec(),
            Aad::Verified => b"capsule:verified".to_vec(),
        }
    }
}

/// Fills `buf` from the OS random source.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), CryptoError> {
    getrandom::fill(buf).map_err(|e| CryptoError::Rng(e.to_string()))
}

/// Secrets of one repository. Generated once at `init`; never leaves the
/// client unsealed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct MasterKey {
    /// XChaCha20-Poly1305 key for every envelope.
    enc: [u8; 32],
    /// BLAKE3 key for blob IDs.
    id_key: [u8; 32],
    /// Seed that permutes the chunker's gear table.
    chunker_seed: u64,
    /// Reserved for future sub-keys; zero today.
    reserved: u64,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    /// A fresh random key.
    pub fn generate() -> Result<Self, CryptoError> {
        let mut b = [0u8; MASTER_KEY_LEN];
        random_bytes(&mut b)?;
        let k = Self::from_bytes(&b);
        b.zeroize();
        k
    }

    /// Deserializes key material (`enc | id_key | chunker_seed LE | reserved LE`).
    pub fn from_bytes(b: &[u8]) -> Result<Self, CryptoError> {
        if b.len() != MASTER_KEY_LEN {
            return Err(CryptoError::BadMasterKey);
        }
        let mut enc = [0u8; 32];
        let mut id_key = [0u8; 32];
        enc.copy_from_slice(&b[..32]);
        id_key.copy_from_slice(&b[32..64]);
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[64..72]);
        let mut r = [0u8; 8];
        r.copy_from_slice(&b[72..80]);
        Ok(MasterKey {
            enc,
            id_key,
            // A zero seed would select the public, unkeyed gear table.
            chunker_seed: u64::from_le_bytes(s) | 1,
            reserved: u64::from_le_bytes(r),
        })
    }

    /// Serializes key material; the caller must seal it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MASTER_KEY_LEN);
        v.extend_from_slice(&self.enc);
        v.extend_from_slice(&self.id_key);
        v.extend_from_slice(&self.chunker_seed.to_le_bytes());
        v.extend_from_slice(&self.reserved.to_le_bytes());
        v
    }

    /// A fresh key that cuts files and names blobs as `self` does (same
    /// blob-ID key and chunker seed) but seals with a key of its own: for a
    /// repository that copies another's snapshots without re-chunking
    /// (`init --copy-chunker-params-from`).
    pub fn sharing_ids(&self) -> Result<Self, CryptoError> {
        let mut k = Self::generate()?;
        k.id_key = self.id_key;
        k.chunker_seed = self.chunker_seed;
        Ok(k)
    }

    /// Whether `other` names blobs and cuts files as `self` does.
    pub fn shares_ids_with(&self, other: &MasterKey) -> bool {
        self.id_key == other.id_key && self.chunker_seed == other.chunker_seed
    }

    /// The chunker seed (never zero).
    pub fn chunker_seed(&self) -> u64 {
        self.chunker_seed
    }

    /// A key for data this machine keeps for the repository and checks
    /// before believing (the index's tables): derived, so it says nothing
    /// of the keys it comes from, and one per `context`.
    pub fn local_key(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.enc)
    }

    /// Keyed ID of a blob's plaintext.
    pub fn blob_id(&self, plaintext: &[u8]) -> BlobId {
        BlobId(Id(*blake3::keyed_hash(&self.id_key, plaintext).as_bytes()))
    }

    /// Seals `plaintext` with a fresh random nonce.
    pub fn seal(&self, aad: Aad<'_>, plaintext: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let mut nonce = [0u8; NONCE_LEN];
        random_bytes(&mut nonce)?;
        seal_with_nonce(&self.enc, &nonce, aad, plaintext)
    }

    /// Seals in place what `buf` holds after its first [`NONCE_LEN`] bytes,
    /// which are reserved for the nonce: they become a fresh nonce, the rest
    /// is encrypted where it lies and the tag is appended. The result is the
    /// envelope [`MasterKey::seal`] makes. Why: a backup seals every new
    /// byte it reads, and building the envelope around the plaintext saves
    /// the two copies (and two chunk-sized buffers) that sealing a slice
    /// costs; reserve [`TAG_LEN`] spare capacity and nothing is reallocated.
    pub fn seal_in_place(&self, aad: Aad<'_>, buf: &mut Vec<u8>) -> Result<(), CryptoError> {
        if buf.len() < NONCE_LEN {
            return Err(CryptoError::TooShort(buf.len()));
        }
        random_bytes(&mut buf[..NONCE_LEN])?;
        seal_reserved(&self.enc, aad, buf)
    }

    /// Opens an envelope made by [`MasterKey::seal`] with the same `aad`.
    pub fn open(&self, aad: Aad<'_>, envelope: &[u8]) -> Result<Vec<u8>, CryptoError> {
        open_with_key(&self.enc, aad, envelope)
    }

    /// Opens an envelope where it lies and returns its plaintext, a part of
    /// `envelope`. On failure the envelope's bytes are left unspecified.
    /// Why: a restore owns the ranges it fetched, so decrypting there saves
    /// a copy of every byte it restores.
    pub fn open_in_place<'a>(
        &self,
        aad: Aad<'_>,
        envelope: &'a mut [u8],
    ) -> Result<&'a mut [u8], CryptoError> {
        open_in_place_with_key(&self.enc, aad, envelope)
    }
}

/// Seals with an explicit nonce; only for test vectors and key wrapping.
pub fn seal_with_nonce(
    key: &[u8; 32],
    nonce: &[u8; NONCE_LEN],
    aad: Aad<'_>,
    plaintext: &[u8],
) -> Result<Vec<u8>, CryptoError> {
    let mut out = Vec::with_capacity(ENVELOPE_OVERHEAD + plaintext.len());
    out.extend_from_slice(nonce);
    out.extend_from_slice(plaintext);
    seal_reserved(key, aad, &mut out)?;
    Ok(out)
}

/// Encrypts `buf[NONCE_LEN..]` in place under the nonce in
/// `buf[..NONCE_LEN]` and appends the tag.
fn seal_reserved(key: &[u8; 32], aad: Aad<'_>, buf: &mut Vec<u8>) -> Result<(), CryptoError> {
    let cipher = XChaCha20Poly1305::new(key.into());
    let aad = aad.bytes();
    let (nonce, msg) = buf.split_at_mut(NONCE_LEN);
    let tag = cipher
        .encrypt_in_place_detached(XNonce::from_slice(nonce), &aad, msg)
        .map_err(|_| CryptoError::Auth)?;
    buf.extend_from_slice(&tag);
    Ok(())
}

fn open_with_key(key: &[u8; 32], aad: Aad<'_>, envelope: &[u8]) -> Result<Vec<u8>, CryptoError> {
    if envelope.len() < ENVELOPE_OVERHEAD {
        return Err(CryptoError::TooShort(envelope.len()));
    }
    let (nonce, rest) = envelope.split_at(NONCE_LEN);
    let (msg, tag) = rest.split_at(rest.len() - TAG_LEN);
    let mut out = msg.to_vec();
    XChaCha20Poly1305::new(key.into())
        .decrypt_in_place_detached(
            XNonce::from_slice(nonce),
            &aad.bytes(),
            &mut out,
            Tag::from_slice(tag),
        )
        .map_err(|_| CryptoError::Auth)?;
    Ok(out)
}

fn open_in_place_with_key<'a>(
    key: &[u8; 32],
    aad: Aad<'_>,
    envelope: &'a mut [u8],
) -> Result<&'a mut [u8], CryptoError> {
    if envelope.len() < ENVELOPE_OVERHEAD {
        return Err(CryptoError::TooShort(envelope.len()));
    }
    let cipher = XChaCha20Poly1305::new(key.into());
    let aad = aad.bytes();
    let (nonce, rest) = envelope.split_at_mut(NONCE_LEN);
    let (msg, tag) = rest.split_at_mut(rest.len() - TAG_LEN);
    cipher
        .decrypt_in_place_detached(XNonce::from_slice(nonce), &aad, msg, Tag::from_slice(tag))
        .map_err(|_| CryptoError::Auth)?;
    Ok(msg)
}

/// Argon2id cost parameters, stored in each key file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfParams {
    /// Memory in KiB.
    pub m_cost: u32,
    /// Iterations.
    pub t_cost: u32,
    /// Parallelism.
    pub p_cost: u32,
}

impl Default for KdfParams {
    /// 64 MiB, 3 passes, 1 lane: about a quarter second on a laptop core,
    /// the OWASP-recommended order of magnitude.
    fn default() -> Self {
        KdfParams {
            m_cost: 64 * 1024,
            t_cost: 3,
            p_cost: 1,
        }
    }
}

/// Derives a key-encryption key from a password with Argon2id.
pub fn derive_kek(
    password: &[u8],
    salt: &[u8],
    p: KdfParams,
) -> Result<zeroize::Zeroizing<[u8; 32]>, CryptoError> {
    let params = argon2::Params::new(p.m_cost, p.t_cost, p.p_cost, Some(32))
        .map_err(|e| CryptoError::Kdf(e.to_string()))?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = zeroize::Zeroizing::new([0u8; 32]);
    a.hash_password_into(password, salt, out.as_mut())
        .map_err(|e| CryptoError::Kdf(e.to_string()))?;
    Ok(out)
}

/// Seals master key material under a password.
pub fn wrap_master_key(
    master: &MasterKey,
    password: &[u8],
    salt: &[u8],
    p: KdfParams,
) -> Result<Vec<u8>, CryptoError> {
    let kek = derive_kek(password, salt, p)?;
    let mut nonce = [0u8; NONCE_LEN];
    random_bytes(&mut nonce)?;
    let mut material = master.to_bytes();
    let sealed = seal_with_nonce(&kek, &nonce, Aad::KeyFile, &material);
    material.zeroize();
    sealed
}

/// Opens master key material with a password; `Auth` means wrong password.
pub fn unwrap_master_key(
    sealed: &[u8],
    password: &[u8],
    salt: &[u8],
    p: KdfParams,
) -> Result<MasterKey, CryptoError> {
    let kek = derive_kek(password, salt, p)?;
    unwrap_master_key_with_kek(sealed, &kek)
}

/// [`unwrap_master_key`] with the key-encryption key already derived (by
/// [`derive_kek`] from the same password, salt and cost).
pub fn unwrap_master_key_with_kek(sealed: &[u8], kek: &[u8; 32]) -> Result<MasterKey, CryptoError> {
    let mut material = open_with_key(kek, Aad::KeyFile, sealed)?;
    let k = MasterKey::from_bytes(&material);
    material.zeroize();
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fixed_key() -> MasterKey {
        let mut b = [0u8; MASTER_KEY_LEN];
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as u8;
        }
        MasterKey::from_bytes(&b).unwrap()
    }

    /// Test vectors from docs/FORMAT.md ("Test vectors").
    #[test]
    fn vectors() {
        let k = fixed_key();
        assert_eq!(
            k.blob_id(b"capsule").to_hex(),
            "89ed1960f890188ac1b8b61e8f26b3c0b413f62916e03a5b9f8ba6563914708d"
        );
        let env = seal_with_nonce(&k.enc, &[0x24; NONCE_LEN], Aad::Snapshot, b"{}").unwrap();
        assert_eq!(
            hex::encode(&env),
            "242424242424242424242424242424242424242424242424d0b8b3a08ab06d3de9f52f0a2dae89ac8509"
        );
        assert_eq!(k.open(Aad::Snapshot, &env).unwrap(), b"{}");
        let kek = derive_kek(
            b"password",
            b"saltsaltsaltsalt",
            KdfParams {
                m_cost: 64,
                t_cost: 1,
                p_cost: 1,
            },
        )
        .unwrap();
        assert_eq!(
            hex::encode(kek.as_ref()),
            "59bf4338b29483094be5f8da77db5f08f534481028d0f118fdebc9461c2d511d"
        );
    }

    #[test]
    fn wrong_aad_or_flip_fails() {
        let k = fixed_key();
        let id = k.blob_id(b"x");
        let env = k.seal(Aad::Blob(BlobType::Data, &id), b"hello").unwrap();
        assert!(k.open(Aad::Blob(BlobType::Tree, &id), &env).is_err());
        let other = k.blob_id(b"y");
        assert!(k.open(Aad::Blob(BlobType::Data, &other), &env).is_err());
        for i in 0..env.len() {
            let mut bad = env.clone();
            bad[i] ^= 1;
            assert!(
                k.open(Aad::Blob(BlobType::Data, &id), &bad).is_err(),
                "flip at {i}"
            );
        }
        assert!(k.open(Aad::Blob(BlobType::Data, &id), &env[..10]).is_err());
    }

    #[test]
    fn wrap_unwrap() {
        let k = MasterKey::generate().unwrap();
        let p = KdfParams {
            m_cost: 64,
            t_cost: 1,
            p_cost: 1,
        };
        let sealed = wrap_master_key(&k, b"pw", b"0123456789abcdef", p).unwrap();
        let k2 = unwrap_master_key(&sealed, b"pw", b"0123456789abcdef", p).unwrap();
        assert_eq!(k.to_bytes(), k2.to_bytes());
        assert!(matches!(
            unwrap_master_key(&sealed, b"wrong", b"0123456789abcdef", p),
            Err(CryptoError::Auth)
        ));
    }

    #[test]
    fn nonces_do_not_repeat() {
        let k = fixed_key();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100_000 {
            let env = k.seal(Aad::Index, b"").unwrap();
            assert!(seen.insert(env[..NONCE_LEN].to_vec()));
        }
    }

    /// The in-place forms make and open the same envelopes as the copying
    /// ones: the vector of docs/FORMAT.md opens in place, an envelope sealed
    /// in place opens with `open`, and a flipped byte fails in place too.
    #[test]
    fn in_place_envelopes_are_the_same_envelopes() {
        let k = fixed_key();
        let mut env = hex::decode(
            "242424242424242424242424242424242424242424242424d0b8b3a08ab06d3de9f52f0a2dae89ac8509",
        )
        .unwrap();
        assert_eq!(k.open_in_place(Aad::Snapshot, &mut env).unwrap(), b"{}");

        let id = k.blob_id(b"payload");
        let mut buf = Vec::with_capacity(NONCE_LEN + 7 + TAG_LEN);
        buf.extend_from_slice(&[0; NONCE_LEN]);
        buf.extend_from_slice(b"payload");
        let cap = buf.capacity();
        k.seal_in_place(Aad::Blob(BlobType::Data, &id), &mut buf)
            .unwrap();
        assert_eq!(buf.capacity(), cap, "the tag fits the reserved room");
        assert_ne!(&buf[..NONCE_LEN], &[0; NONCE_LEN], "a fresh nonce");
        assert_eq!(
            k.open(Aad::Blob(BlobType::Data, &id), &buf).unwrap(),
            b"payload"
        );
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 1;
            assert!(
                k.open_in_place(Aad::Blob(BlobType::Data, &id), &mut bad)
                    .is_err(),
                "flip at {i}"
            );
        }
        let mut short = vec![0; ENVELOPE_OVERHEAD - 1];
        assert!(matches!(
            k.open_in_place(Aad::Index, &mut short),
            Err(CryptoError::TooShort(_))
        ));
        assert!(matches!(
            k.seal_in_place(Aad::Index, &mut vec![0; NONCE_LEN - 1]),
            Err(CryptoError::TooShort(_))
        ));
    }

    proptest! {
        #[test]
        fn seal_open_roundtrip(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let k = fixed_key();
            let env = k.seal(Aad::Config, &data).unwrap();
            prop_assert_eq!(env.len(), data.len() + ENVELOPE_OVERHEAD);
            prop_assert_eq!(&k.open(Aad::Config, &env).unwrap(), &data);
            let mut env = env;
            prop_assert_eq!(k.open_in_place(Aad::Config, &mut env).unwrap(), &data[..]);
        }
    }
}
