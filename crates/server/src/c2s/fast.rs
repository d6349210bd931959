//! XEP-0484 FAST: tokens a client gets after authenticating with its
//! password and uses instead of it on its next connections, in one round
//! trip (HT-SHA-256-*, `starling_proto::sasl::ht`).
//!
//! - A token is never stored. The database keeps a random nonce per slot;
//!   the token is HMAC-SHA-256(server key, account, client, nonce) under
//!   the server's FAST key (`data_dir/fast.key`, 32 random bytes, mode
//!   0600, made on first start). So the database alone authenticates
//!   nobody, and a new key revokes every token.
//! - Two slots per client (its SASL2 user-agent id), as XEP-0484 §6.1
//!   suggests: a new token waits in `new`; the one in `current` keeps
//!   working until the new one is used (then it is deleted), so a client
//!   that lost the response with its new token is not locked out. A used
//!   token stays in `new` (authenticating writes nothing) until a newer
//!   one is issued, which first moves it to `current`.
//! - A token is bound to the mechanism it was requested for, expires after
//!   `[auth] fast_token_days`, and is rotated (a new one in the
//!   `<success/>`) once half its life has passed. `invalidate='true'`
//!   revokes the token used. A password change or the account's deletion
//!   revokes all (storage).
//! - Not offered: TLS 0-RTT (rustls accepts no early data here), so the
//!   `count` attribute is not needed and ignored.

use starling_core::storage::{FastSlot, FastToken};
use starling_proto::sasl::ht;
use starling_proto::BareJid;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The FAST settings and key of this server.
pub struct Fast {
    key: [u8; 32],
    lifetime: Duration,
}

/// XEP-0484's namespace.
pub const NS_FAST: &str = "urn:xmpp:fast:0";

pub(crate) fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Loads `data_dir/fast.key`, or makes it: the server's secret for FAST
/// tokens and for stable Bind 2 resources.
pub fn load_or_create_key(data_dir: &Path) -> anyhow::Result<[u8; 32]> {
    let path = data_dir.join("fast.key");
    Ok(match std::fs::read(&path) {
        Ok(bytes) if bytes.len() == 32 => {
            let mut k = [0u8; 32];
            k.copy_from_slice(&bytes);
            k
        }
        Ok(_) => anyhow::bail!(
            "{} is not a 32-byte FAST key; delete it to make a new one (every FAST token is then revoked)",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut k = [0u8; 32];
            getrandom::fill(&mut k)
                .map_err(|e| anyhow::anyhow!("no randomness for the FAST key: {e}"))?;
            std::fs::create_dir_all(data_dir)?;
            crate::tls::write_private(&path, &k)?;
            tracing::info!(path = %path.display(), "generated the FAST token key");
            k
        }
        Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    })
}

/// XEP-0386 §3.3 stable resources: the part after the tag, the same for
/// every bind of one client (its SASL2 user-agent id) with one tag, and
/// revealing nothing of the id.
pub fn stable_resource_id(key: &[u8; 32], user: &BareJid, agent: &str, tag: &str) -> String {
    let mut id = ht::derive_token(key, &["bind2", user.as_str(), agent, tag]);
    id.truncate(12);
    id
}

impl Fast {
    /// FAST with this key and token lifetime.
    pub fn new(key: [u8; 32], lifetime: Duration) -> Fast {
        Fast { key, lifetime }
    }

    /// The token a stored slot stands for.
    pub fn token(&self, jid: &BareJid, agent: &str, nonce: &str) -> String {
        ht::derive_token(&self.key, &[jid.as_str(), agent, nonce])
    }

    /// A new token for `mechanism` in the `new` slot: what to store and
    /// the token to give the client.
    pub fn issue(&self, jid: &BareJid, agent: &str, mechanism: &str) -> (FastToken, String) {
        let nonce = starling_proto::random_id(24);
        let token = self.token(jid, agent, &nonce);
        let stored = FastToken {
            slot: FastSlot::New,
            nonce,
            mechanism: mechanism.to_owned(),
            expires_at: now_millis().saturating_add(self.lifetime.as_millis() as i64),
        };
        (stored, token)
    }

    /// True once half of the token's life has passed.
    pub fn due_for_rotation(&self, t: &FastToken) -> bool {
        let half = (self.lifetime.as_millis() / 2) as i64;
        t.expires_at.saturating_sub(now_millis()) < half
    }
}
