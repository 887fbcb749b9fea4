//! Key files: the master key sealed under a password-derived key, their
//! bounds, this machine's key hint, the early derivation and the search
//! that finds which key file a password opens.

use capsule_backend::{Backend, ErrorKind};
use capsule_crypto::{KdfParams, MasterKey};
use capsule_format::snapshot::{from_json, KeyFile};
use capsule_format::{FileType, ObjectId, FORMAT_VERSION};

use super::names::{hostname, username};
use crate::error::{EngineError, Result};
use crate::timefmt::{now_unix, rfc3339};

/// A key file as listed by `key list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeyInfo {
    /// Key object ID.
    pub id: String,
    /// Creation time.
    pub created: String,
    /// Host and user that created it.
    pub hostname: String,
    /// User that created it.
    pub username: String,
    /// Whether this key opened the repository.
    pub current: bool,
    /// Why the key file cannot be used, when it is damaged or stray.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
}

/// See [`Repository::ENVELOPE_SLACK`].
pub(crate) const ENVELOPE_SLACK: usize = 4096;

pub(crate) fn new_keyfile(
    master: &MasterKey,
    password: &[u8],
    kdf: KdfParams,
) -> Result<(Vec<u8>, KeyHint)> {
    let mut salt = [0u8; 16];
    capsule_crypto::random_bytes(&mut salt)?;
    let sealed = capsule_crypto::wrap_master_key(master, password, &salt, kdf)?;
    let kf = KeyFile {
        version: FORMAT_VERSION,
        kdf: "argon2id".into(),
        m_cost: kdf.m_cost,
        t_cost: kdf.t_cost,
        p_cost: kdf.p_cost,
        salt: hex::encode(salt),
        sealed: hex::encode(sealed),
        created: rfc3339(now_unix()),
        hostname: hostname(),
        username: username(),
    };
    let mut json = serde_json::to_vec_pretty(&kf).unwrap_or_default();
    json.push(b'\n');
    let hint = KeyHint {
        salt: salt.to_vec(),
        kdf,
        name: Some(format!(
            "{}{}",
            FileType::Key.prefix(),
            ObjectId::of(&json).to_hex()
        )),
    };
    Ok((json, hint))
}

/// The most a key file may ask of the key derivation. A key file is
/// attacker-controlled input: without a bound, a crafted one (4 GiB, 100
/// passes) holds every command for minutes. capsule writes 64 MiB × 3; the
/// bound leaves room for 16× that, well past any advice for Argon2id.
const KDF_MAX_MEMORY_KIB: u64 = 1 << 20;

const KDF_MAX_PASSES: u32 = 16;

/// Memory × passes, in KiB: about 4 s on a laptop core.
const KDF_MAX_WORK: u64 = 4 << 20;

const KDF_MAX_LANES: u32 = 16;

/// A key file parsed and checked, not yet opened.
pub(crate) struct ParsedKey {
    pub(crate) name: String,
    pub(crate) id: ObjectId,
    pub(crate) kdf: KdfParams,
    pub(crate) salt: Vec<u8>,
    pub(crate) sealed: Vec<u8>,
}

impl ParsedKey {
    fn work(&self) -> u64 {
        u64::from(self.kdf.m_cost) * u64::from(self.kdf.t_cost)
    }
}

/// Parses a key file and checks it against its name, which is the BLAKE3
/// of its bytes: so a damaged key file is told from a wrong password, even
/// when the damage is inside the sealed key.
pub(crate) fn parse_keyfile(bytes: &[u8], name: &str) -> Result<ParsedKey> {
    let id: ObjectId = name
        .trim_start_matches(FileType::Key.prefix())
        .parse()
        .map_err(|_| EngineError::corrupt(name, "not a key file (its name is not a key ID)"))?;
    if ObjectId::of(bytes) != id {
        return Err(EngineError::corrupt(
            name,
            "content does not match its name (the file was changed or truncated)",
        ));
    }
    let kf: KeyFile = from_json(bytes).map_err(|e| EngineError::corrupt(name, e))?;
    if kf.version > FORMAT_VERSION {
        return Err(EngineError::UnsupportedVersion {
            found: kf.version,
            supported: FORMAT_VERSION,
        });
    }
    if kf.kdf != "argon2id" {
        return Err(EngineError::corrupt(
            name,
            format!("unknown kdf {}", kf.kdf),
        ));
    }
    let salt = hex::decode(&kf.salt).map_err(|e| EngineError::corrupt(name, e))?;
    let sealed = hex::decode(&kf.sealed).map_err(|e| EngineError::corrupt(name, e))?;
    let kdf = KdfParams {
        m_cost: kf.m_cost,
        t_cost: kf.t_cost,
        p_cost: kf.p_cost,
    };
    // Refuse absurd costs from a hostile key file before paying them.
    if !kdf_in_bounds(kdf) {
        return Err(EngineError::corrupt(
            name,
            format!(
                "key derivation cost out of range ({} MiB, {} passes, {} lanes; at most {} MiB, {} passes, {} lanes)",
                kdf.m_cost / 1024,
                kdf.t_cost,
                kdf.p_cost,
                KDF_MAX_MEMORY_KIB / 1024,
                KDF_MAX_PASSES,
                KDF_MAX_LANES
            ),
        ));
    }
    Ok(ParsedKey {
        name: name.to_string(),
        id,
        kdf,
        salt,
        sealed,
    })
}

/// Whether a key derivation's cost is one capsule will pay.
fn kdf_in_bounds(kdf: KdfParams) -> bool {
    let work = u64::from(kdf.m_cost) * u64::from(kdf.t_cost);
    u64::from(kdf.m_cost) <= KDF_MAX_MEMORY_KIB
        && kdf.t_cost <= KDF_MAX_PASSES
        && kdf.p_cost <= KDF_MAX_LANES
        && work <= KDF_MAX_WORK
}

/// The salt and cost of the key file that opened a repository, which a
/// machine keeps so that its next command can start the key derivation
/// before the destination has answered ([`EarlyKey`]). Neither is secret:
/// both are in the key file, which anyone who can read the destination can
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyHint {
    pub(crate) salt: Vec<u8>,
    pub(crate) kdf: KdfParams,
    /// The key file's name (`keys/<id>`), so that it is read without
    /// listing `keys/` first: one round trip less for every command.
    pub(crate) name: Option<String>,
}

impl KeyHint {
    /// One line: `argon2id <memory KiB> <passes> <lanes> <salt hex>
    /// [<key file name>]`.
    pub fn to_text(&self) -> String {
        format!(
            "argon2id {} {} {} {}{}\n",
            self.kdf.m_cost,
            self.kdf.t_cost,
            self.kdf.p_cost,
            hex::encode(&self.salt),
            self.name
                .as_ref()
                .map(|n| format!(" {n}"))
                .unwrap_or_default()
        )
    }

    /// Reads [`to_text`](Self::to_text)'s line. `None` for anything else,
    /// including a cost beyond what a key file may ask: the hint is a local
    /// file, and a damaged or planted one must cost nothing.
    pub fn parse(text: &str) -> Option<KeyHint> {
        let mut f = text.split_ascii_whitespace();
        if f.next()? != "argon2id" {
            return None;
        }
        let kdf = KdfParams {
            m_cost: f.next()?.parse().ok()?,
            t_cost: f.next()?.parse().ok()?,
            p_cost: f.next()?.parse().ok()?,
        };
        let salt = hex::decode(f.next()?).ok()?;
        // A name read from a local file is only ever a key file's name.
        let name = match f.next() {
            Some(n) => {
                n.strip_prefix(FileType::Key.prefix())?
                    .parse::<ObjectId>()
                    .ok()?;
                Some(n.to_string())
            }
            None => None,
        };
        let valid = f.next().is_none() && kdf_in_bounds(kdf) && (8..=64).contains(&salt.len());
        valid.then_some(KeyHint { salt, kdf, name })
    }

    /// Whether a derivation with this hint's cost may start before the key
    /// file is read: only if it asks no more memory, passes or lanes than
    /// `limit` (the default cost). A hint is a local file that anything
    /// with the user's rights can plant; one asking a gigabyte for seconds
    /// must cost nothing, so a key that really is that costly is derived
    /// once its key file has been read, as without a hint.
    pub fn costs_at_most(&self, limit: KdfParams) -> bool {
        self.kdf.m_cost <= limit.m_cost
            && self.kdf.t_cost <= limit.t_cost
            && self.kdf.p_cost <= limit.p_cost
    }
}

/// A key derivation started on another thread from a [`KeyHint`], while
/// the command connects to the destination and reads the key files. On a
/// network destination the derivation (argon2id, about 0.15 s here) and
/// the connection then overlap instead of following each other. Opening
/// uses the result only for a key file with exactly the hint's salt and
/// cost, so a stale or wrong hint costs one wasted derivation and changes
/// nothing else.
pub struct EarlyKey {
    pub(crate) hint: KeyHint,
    pub(crate) kek: Kek,
}

/// An [`EarlyKey`]'s key-encryption key: still being derived, or handed
/// over already derived (a daemon holds it between runs).
pub(crate) enum Kek {
    Deriving(
        std::thread::JoinHandle<
            std::result::Result<zeroize::Zeroizing<[u8; 32]>, capsule_crypto::CryptoError>,
        >,
    ),
    Derived(zeroize::Zeroizing<[u8; 32]>),
}

impl Kek {
    pub(crate) fn wait(self) -> Option<zeroize::Zeroizing<[u8; 32]>> {
        match self {
            // A derivation that failed or panicked is simply done again
            // the usual way.
            Kek::Deriving(t) => t.join().ok()?.ok(),
            Kek::Derived(k) => Some(k),
        }
    }
}

impl std::fmt::Debug for EarlyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyKey")
            .field("hint", &self.hint)
            .finish()
    }
}

impl EarlyKey {
    /// Starts deriving the key-encryption key of `password` with `hint`'s
    /// salt and cost.
    pub fn start(password: &[u8], hint: KeyHint) -> EarlyKey {
        let password = zeroize::Zeroizing::new(password.to_vec());
        let (salt, kdf) = (hint.salt.clone(), hint.kdf);
        let kek = std::thread::spawn(move || capsule_crypto::derive_kek(&password, &salt, kdf));
        EarlyKey {
            hint,
            kek: Kek::Deriving(kek),
        }
    }

    /// A key derived earlier for `hint` (by [`wait`](Self::wait)), so that
    /// opening derives nothing. Used exactly like a derivation under way:
    /// for a key file with another salt or cost it is ignored.
    pub fn derived(hint: KeyHint, kek: zeroize::Zeroizing<[u8; 32]>) -> EarlyKey {
        EarlyKey {
            hint,
            kek: Kek::Derived(kek),
        }
    }

    /// Waits for the derivation: the hint and the key-encryption key, for
    /// [`derived`](Self::derived) later (`None` if it failed).
    pub fn wait(self) -> Option<(KeyHint, zeroize::Zeroizing<[u8; 32]>)> {
        let hint = self.hint;
        self.kek.wait().map(|k| (hint, k))
    }

    /// The hint this key was derived for.
    pub fn hint(&self) -> &KeyHint {
        &self.hint
    }

    /// The derived key, if it is for this key file's salt and cost, and
    /// whether it was handed over already derived.
    fn take_for(
        slot: &mut Option<EarlyKey>,
        p: &ParsedKey,
    ) -> Option<(zeroize::Zeroizing<[u8; 32]>, KeySource)> {
        if !slot
            .as_ref()
            .is_some_and(|e| e.hint.salt == p.salt && e.hint.kdf == p.kdf)
        {
            return None;
        }
        let kek = slot.take()?.kek;
        let source = match kek {
            Kek::Derived(_) => KeySource::Held,
            Kek::Deriving(_) => KeySource::Early,
        };
        Some((kek.wait()?, source))
    }
}

/// How the key that opened a repository was had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeySource {
    /// Derived from the password after the key file was read.
    Derived,
    /// Derived from this machine's hint while the command connected.
    Early,
    /// Derived earlier and handed over ([`EarlyKey::derived`]): this
    /// command derived nothing.
    Held,
    /// Created with the repository (or a new password).
    New,
}

/// What opening with a password found among the key files.
pub(crate) struct KeySearch {
    pub(crate) key: Option<(MasterKey, ObjectId, KeyHint)>,
    /// How the key was had.
    pub(crate) source: KeySource,
    /// Key files that parsed and did not open with the password.
    pub(crate) intact: usize,
    /// Key files that could not be read or parsed.
    pub(crate) damaged: Vec<EngineError>,
}

impl KeySearch {
    /// The key file `p` opened, giving `key`.
    pub(crate) fn found(
        key: MasterKey,
        p: ParsedKey,
        source: KeySource,
        intact: usize,
        damaged: Vec<EngineError>,
    ) -> KeySearch {
        KeySearch {
            source,
            key: Some((
                key,
                p.id,
                KeyHint {
                    salt: p.salt,
                    kdf: p.kdf,
                    name: Some(p.name),
                },
            )),
            intact,
            damaged,
        }
    }
}

/// Tries every key file, cheapest first, until one opens with `password`.
/// A damaged or stray file is set aside, never fatal: one bad file in
/// `keys/` must not lock out the holders of the others.
pub(crate) fn find_key(
    backend: &dyn Backend,
    password: &[u8],
    mut early: Option<EarlyKey>,
) -> Result<KeySearch> {
    // The key file the hint names is read while `keys/` is listed, so
    // that when it opens the key is had in one round trip. When the
    // derivation does not open it, it is set aside as the search below
    // would (an early derivation is this password's; a held key falls
    // back to the password there); anything else (gone, another salt) is
    // the search below, over the same listing.
    let hinted = early.as_ref().and_then(|e| e.hint.name.clone());
    let (listing, direct) = std::thread::scope(|s| {
        let listing = s.spawn(|| backend.list(FileType::Key.prefix()));
        let direct = hinted.as_ref().map(|name| {
            backend
                .get(name, None)
                .map_err(EngineError::from)
                .and_then(|b| parse_keyfile(&b, name))
        });
        (
            listing
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            direct,
        )
    });
    let listing = listing?;
    let mut tried = None;
    let mut intact = 0;
    if let Some(Ok(p)) = direct {
        if let Some((kek, how)) = EarlyKey::take_for(&mut early, &p) {
            let opened = match capsule_crypto::unwrap_master_key_with_kek(&p.sealed, &kek) {
                Err(capsule_crypto::CryptoError::Auth) if how == KeySource::Held => {
                    capsule_crypto::unwrap_master_key(&p.sealed, password, &p.salt, p.kdf)
                        .map(|k| (k, KeySource::Derived))
                }
                r => r.map(|k| (k, how)),
            };
            match opened {
                Ok((k, source)) => {
                    // The others are still looked at, to report a damaged
                    // or stray one (none to read with a single key).
                    let mut damaged = Vec::new();
                    for o in listing.iter().filter(|o| o.name != p.name) {
                        match backend.get(&o.name, None) {
                            Ok(b) => {
                                if let Err(e) = parse_keyfile(&b, &o.name) {
                                    damaged.push(e);
                                }
                            }
                            Err(e) if e.kind == ErrorKind::NotFound => {}
                            Err(e) => damaged.push(EngineError::corrupt(&o.name, e)),
                        }
                    }
                    return Ok(KeySearch::found(k, p, source, 0, damaged));
                }
                Err(_) => {
                    intact += 1;
                    tried = Some(p.name);
                }
            }
        }
    }
    let mut parsed = Vec::new();
    let mut damaged = Vec::new();
    for k in listing {
        if tried.as_ref() == Some(&k.name) {
            continue;
        }
        let bytes = match backend.get(&k.name, None) {
            Ok(b) => b,
            Err(e) if e.kind == ErrorKind::NotFound => continue,
            // The destination failing is not the key file's fault.
            Err(e) if e.is_destination_failure() => return Err(e.into()),
            Err(e) => {
                damaged.push(EngineError::corrupt(&k.name, e));
                continue;
            }
        };
        match parse_keyfile(&bytes, &k.name) {
            Ok(p) => parsed.push(p),
            Err(e) => damaged.push(e),
        }
    }
    // Cheapest first; the key whose derivation already ran costs nothing.
    parsed.sort_by_key(|p| {
        let derived = early
            .as_ref()
            .is_some_and(|e| e.hint.salt == p.salt && e.hint.kdf == p.kdf);
        (!derived, p.work())
    });
    for p in parsed {
        let mut source = KeySource::Derived;
        let opened = match EarlyKey::take_for(&mut early, &p) {
            Some((kek, how)) => {
                source = how;
                match capsule_crypto::unwrap_master_key_with_kek(&p.sealed, &kek) {
                    // A key handed over was derived from a password this
                    // command may not share (a changed profile): this
                    // command's own password decides.
                    Err(capsule_crypto::CryptoError::Auth) if how == KeySource::Held => {
                        source = KeySource::Derived;
                        capsule_crypto::unwrap_master_key(&p.sealed, password, &p.salt, p.kdf)
                    }
                    r => r,
                }
            }
            None => {
                // An early derivation for no key file here (the hint was
                // stale) is waited out before another starts: two at once
                // would hold twice Argon2's 64 MiB.
                if let Some(unused) = early.take() {
                    let _ = unused.kek.wait();
                }
                capsule_crypto::unwrap_master_key(&p.sealed, password, &p.salt, p.kdf)
            }
        };
        match opened {
            Ok(k) => return Ok(KeySearch::found(k, p, source, intact, damaged)),
            Err(capsule_crypto::CryptoError::Auth) => intact += 1,
            Err(e) => damaged.push(EngineError::corrupt(&p.name, e)),
        }
    }
    Ok(KeySearch {
        source: KeySource::Derived,
        key: None,
        intact,
        damaged,
    })
}
