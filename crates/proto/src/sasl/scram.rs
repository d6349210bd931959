//! SCRAM (RFC 5802, RFC 7677) server and client with channel binding (RFC 5802 §6).

use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

use super::crypto::{
    ct_eq, digest, fake_credentials, hi, hmac, keys_from_salted, random_bytes, DEFAULT_ITERATIONS,
};
use super::{
    saslprep, ChannelBindingType, ChannelBindings, Mechanism, SaslError, ScramCredentials,
    ScramHash,
};

/// Random bytes in a generated nonce (base64-encoded to 32 characters).
const NONCE_BYTES: usize = 24;

/// Upper bound on the iteration count a [`ScramClient`] accepts from a server.
const MAX_CLIENT_ITERATIONS: u32 = 10_000_000;

/// Parsed client-first-message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientFirst {
    /// Authentication identity: `=2C`/`=3D` decoded and SASLprepped. Never empty.
    pub username: String,
    /// Authorization identity from the GS2 header (`a=`), decoded; `None` if absent. The caller
    /// must still check that it is a JID the user may act as (else `invalid-authzid`).
    pub authzid: Option<String>,
}

/// Decodes a SCRAM `saslname` (`=2C` → `,`, `=3D` → `=`). `None` if empty or badly escaped.
fn decode_saslname(s: &str) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find(['=', ',', '\0']) {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        if let Some(after) = tail.strip_prefix("=2C") {
            out.push(',');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("=3D") {
            out.push('=');
            rest = after;
        } else {
            return None;
        }
    }
    out.push_str(rest);
    Some(out)
}

/// Encodes a string as a SCRAM `saslname`.
fn encode_saslname(s: &str) -> String {
    s.replace('=', "=3D").replace(',', "=2C")
}

/// `printable` from RFC 5802: %x21-2B / %x2D-7E (no comma).
fn is_valid_nonce(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// `attr-val` of an extension: one ALPHA, `=`, value (no NUL; commas are split already).
fn is_extension(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b'=' && !b.contains(&0)
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

fn utf8(msg: &[u8]) -> Result<&str, SaslError> {
    std::str::from_utf8(msg).map_err(|_| SaslError::MalformedRequest("SCRAM message is not UTF-8"))
}

fn new_nonce() -> Result<String, SaslError> {
    Ok(B64.encode(random_bytes(NONCE_BYTES)?))
}

/// State after client-first-message.
struct FirstState {
    /// client-first-message-bare, verbatim.
    bare: String,
    /// gs2-header, verbatim (including the trailing comma).
    gs2_header: String,
    /// Channel binding type and data when the client used `p=`.
    cb_data: Vec<u8>,
    client_nonce: String,
    username: String,
}

/// State after server-first-message.
struct ChallengeState {
    first: FirstState,
    server_first: String,
    nonce: String,
    creds: ScramCredentials,
    fake: bool,
}

enum ServerState {
    Initial,
    GotClientFirst(FirstState),
    SentServerFirst(Box<ChallengeState>),
    Done,
    Failed,
}

impl ServerState {
    fn name(&self) -> &'static str {
        match self {
            ServerState::Initial => "initial",
            ServerState::GotClientFirst(_) => "got-client-first",
            ServerState::SentServerFirst(_) => "sent-server-first",
            ServerState::Done => "done",
            ServerState::Failed => "failed",
        }
    }
}

/// Sans-IO SCRAM server exchange (RFC 5802 §5, with RFC 5802 §6 channel binding).
///
/// Call [`client_first`](Self::client_first), [`server_first`](Self::server_first) and
/// [`client_final`](Self::client_final) in that order, once each. Any error is final: every
/// later call fails too.
pub struct ScramServer {
    mechanism: Mechanism,
    hash: ScramHash,
    bindings: ChannelBindings,
    plus_advertised: bool,
    fake_iterations: u32,
    fixed_server_nonce: Option<String>,
    channel_binding: Option<ChannelBindingType>,
    state: ServerState,
}

impl fmt::Debug for ScramServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramServer")
            .field("mechanism", &self.mechanism)
            .field("channel_binding", &self.channel_binding)
            .field("state", &self.state.name())
            .finish_non_exhaustive()
    }
}

impl ScramServer {
    /// `mechanism` must be a SCRAM mechanism; `bindings` what this connection's TLS offers;
    /// `plus_advertised` whether we advertised any -PLUS mechanism (for downgrade detection:
    /// client gs2 flag "y" while server advertised PLUS → not-authorized).
    ///
    /// Fails with [`SaslError::InvalidMechanism`] for `PLAIN`, and for a `-PLUS` mechanism
    /// when `bindings` is empty (it cannot have been offered).
    pub fn new(
        mechanism: Mechanism,
        bindings: ChannelBindings,
        plus_advertised: bool,
    ) -> Result<Self, SaslError> {
        let hash = mechanism.scram_hash().ok_or(SaslError::InvalidMechanism)?;
        if mechanism.is_plus() && bindings.is_empty() {
            return Err(SaslError::InvalidMechanism);
        }
        Ok(ScramServer {
            mechanism,
            hash,
            bindings,
            plus_advertised,
            fake_iterations: DEFAULT_ITERATIONS,
            fixed_server_nonce: None,
            channel_binding: None,
            state: ServerState::Initial,
        })
    }

    /// Test-only: like [`new`](Self::new) but with a fixed server nonce part (for RFC test
    /// vectors). Never use this in production: nonces must be fresh.
    #[doc(hidden)]
    pub fn with_nonce(
        mechanism: Mechanism,
        bindings: ChannelBindings,
        plus_advertised: bool,
        server_nonce: &str,
    ) -> Result<Self, SaslError> {
        if !is_valid_nonce(server_nonce) {
            return Err(SaslError::Internal("invalid fixed nonce"));
        }
        let mut server = Self::new(mechanism, bindings, plus_advertised)?;
        server.fixed_server_nonce = Some(server_nonce.to_owned());
        Ok(server)
    }

    /// Sets the iteration count advertised for unknown users (default
    /// [`DEFAULT_ITERATIONS`]); set it to what real accounts use so fake challenges look real.
    pub fn set_fake_iterations(&mut self, iterations: u32) {
        self.fake_iterations = iterations.max(1);
    }

    /// The mechanism of this exchange.
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// The channel-binding type the client used (after [`client_first`](Self::client_first)).
    pub fn channel_binding(&self) -> Option<ChannelBindingType> {
        self.channel_binding
    }

    /// Step 1: parse client-first-message (raw bytes after base64 decoding done by caller).
    /// Validates gs2 header: "p=<type>" only for -PLUS mechanisms and only a type we offer
    /// (else fail); "n" / "y" for non-PLUS; reject "a=" authzid that is not well formed;
    /// reject extensions "m=".
    pub fn client_first(&mut self, msg: &[u8]) -> Result<ClientFirst, SaslError> {
        if !matches!(self.state, ServerState::Initial) {
            self.state = ServerState::Failed;
            return Err(SaslError::MalformedRequest(
                "unexpected client-first-message",
            ));
        }
        match self.parse_client_first(msg) {
            Ok((state, first)) => {
                self.state = ServerState::GotClientFirst(state);
                Ok(first)
            }
            Err(e) => {
                self.state = ServerState::Failed;
                Err(e)
            }
        }
    }

    fn parse_client_first(&mut self, msg: &[u8]) -> Result<(FirstState, ClientFirst), SaslError> {
        let s = utf8(msg)?;
        let (flag, rest) = s
            .split_once(',')
            .ok_or(SaslError::MalformedRequest("missing GS2 header"))?;
        let (authz, bare) = rest
            .split_once(',')
            .ok_or(SaslError::MalformedRequest("missing GS2 header"))?;
        let gs2_header = &s[..flag.len() + authz.len() + 2];

        // gs2-cbind-flag
        let cb_type = match flag {
            "n" | "y" => {
                if self.mechanism.is_plus() {
                    return Err(SaslError::MalformedRequest(
                        "-PLUS mechanism requires channel binding",
                    ));
                }
                if flag == "y" && self.plus_advertised {
                    // RFC 5802 §6: the client supports channel binding and thinks we do not,
                    // though we advertised -PLUS: someone stripped it.
                    return Err(SaslError::NotAuthorized("channel binding downgrade"));
                }
                None
            }
            _ => {
                let name = flag.strip_prefix("p=").ok_or(SaslError::MalformedRequest(
                    "invalid GS2 channel-binding flag",
                ))?;
                if name.is_empty()
                    || !name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
                {
                    return Err(SaslError::MalformedRequest("invalid channel-binding name"));
                }
                if !self.mechanism.is_plus() {
                    return Err(SaslError::MalformedRequest(
                        "channel binding requested with a non-PLUS mechanism",
                    ));
                }
                let ty = ChannelBindingType::from_name(name)
                    .filter(|t| self.bindings.get(*t).is_some())
                    .ok_or(SaslError::UnsupportedChannelBinding)?;
                Some(ty)
            }
        };

        // gs2 authzid
        let authzid = if authz.is_empty() {
            None
        } else {
            let raw = authz
                .strip_prefix("a=")
                .ok_or(SaslError::MalformedRequest("invalid GS2 header"))?;
            Some(decode_saslname(raw).ok_or(SaslError::InvalidAuthzid)?)
        };

        // client-first-message-bare
        let mut attrs = bare.split(',');
        let user_attr = attrs.next().unwrap_or_default();
        if user_attr.starts_with("m=") {
            return Err(SaslError::MalformedRequest(
                "mandatory SCRAM extensions are not supported",
            ));
        }
        let raw_user = user_attr
            .strip_prefix("n=")
            .ok_or(SaslError::MalformedRequest("missing username"))?;
        let decoded =
            decode_saslname(raw_user).ok_or(SaslError::MalformedRequest("invalid username"))?;
        let username = saslprep(&decoded)?;
        if username.is_empty() {
            return Err(SaslError::MalformedRequest("empty username"));
        }
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or(SaslError::MalformedRequest("missing nonce"))?;
        if !is_valid_nonce(client_nonce) {
            return Err(SaslError::MalformedRequest("invalid nonce"));
        }
        if !attrs.all(is_extension) {
            return Err(SaslError::MalformedRequest("invalid extension"));
        }

        let cb_data = match cb_type {
            Some(t) => self.bindings.get(t).unwrap_or_default().to_vec(),
            None => Vec::new(),
        };
        self.channel_binding = cb_type;
        let state = FirstState {
            bare: bare.to_owned(),
            gs2_header: gs2_header.to_owned(),
            cb_data,
            client_nonce: client_nonce.to_owned(),
            username: username.clone(),
        };
        Ok((state, ClientFirst { username, authzid }))
    }

    /// Step 2: produce server-first-message given the user's credentials for this hash. For an
    /// unknown user the caller passes `None`: generate plausible fake credentials deterministic
    /// per username (HMAC of username with a per-process random secret) so the exchange
    /// proceeds and fails only at the end — no user enumeration.
    ///
    /// Credentials for another hash, or malformed ones, give [`SaslError::Internal`].
    pub fn server_first(&mut self, creds: Option<&ScramCredentials>) -> Result<Vec<u8>, SaslError> {
        let first = match std::mem::replace(&mut self.state, ServerState::Failed) {
            ServerState::GotClientFirst(first) => first,
            _ => return Err(SaslError::MalformedRequest("unexpected SCRAM step")),
        };
        let (creds, fake) = match creds {
            Some(c) => {
                if c.hash != self.hash {
                    return Err(SaslError::Internal("credentials are for another hash"));
                }
                if !c.is_well_formed() {
                    return Err(SaslError::Internal("stored credentials are malformed"));
                }
                (c.clone(), false)
            }
            None => (
                fake_credentials(self.hash, &first.username, self.fake_iterations)?,
                true,
            ),
        };
        let server_nonce = match &self.fixed_server_nonce {
            Some(n) => n.clone(),
            None => new_nonce()?,
        };
        let nonce = format!("{}{}", first.client_nonce, server_nonce);
        let server_first = format!(
            "r={},s={},i={}",
            nonce,
            B64.encode(&creds.salt),
            creds.iterations
        );
        let out = server_first.clone().into_bytes();
        self.state = ServerState::SentServerFirst(Box::new(ChallengeState {
            first,
            server_first,
            nonce,
            creds,
            fake,
        }));
        Ok(out)
    }

    /// Step 3: verify client-final-message (channel binding data c= must equal
    /// base64(gs2-header + cb-data), nonce must match, proof verified constant-time). Returns
    /// server-final-message "v=..." to send in `<success/>`.
    pub fn client_final(&mut self, msg: &[u8]) -> Result<Vec<u8>, SaslError> {
        let st = match std::mem::replace(&mut self.state, ServerState::Failed) {
            ServerState::SentServerFirst(st) => st,
            _ => return Err(SaslError::MalformedRequest("unexpected SCRAM step")),
        };
        let out = verify_client_final(self.hash, &st, msg)?;
        self.state = ServerState::Done;
        Ok(out)
    }
}

fn verify_client_final(
    hash: ScramHash,
    st: &ChallengeState,
    msg: &[u8],
) -> Result<Vec<u8>, SaslError> {
    let s = utf8(msg)?;
    let (without_proof, proof_attr) = s
        .rsplit_once(',')
        .ok_or(SaslError::MalformedRequest("missing proof"))?;
    let proof_b64 = proof_attr
        .strip_prefix("p=")
        .ok_or(SaslError::MalformedRequest("missing proof"))?;
    let mut attrs = without_proof.split(',');
    let cb_b64 = attrs
        .next()
        .and_then(|a| a.strip_prefix("c="))
        .ok_or(SaslError::MalformedRequest("missing channel binding"))?;
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or(SaslError::MalformedRequest("missing nonce"))?;
    if !attrs.all(is_extension) {
        return Err(SaslError::MalformedRequest("invalid extension"));
    }
    let cb = B64
        .decode(cb_b64)
        .map_err(|_| SaslError::MalformedRequest("invalid base64 in channel binding"))?;
    let proof = B64
        .decode(proof_b64)
        .map_err(|_| SaslError::MalformedRequest("invalid base64 in proof"))?;
    if proof.len() != hash.output_len() {
        return Err(SaslError::MalformedRequest("proof has the wrong length"));
    }

    let mut expected_cb = st.first.gs2_header.as_bytes().to_vec();
    expected_cb.extend_from_slice(&st.first.cb_data);
    if !ct_eq(&cb, &expected_cb) {
        return Err(SaslError::NotAuthorized("channel bindings do not match"));
    }
    if nonce != st.nonce {
        return Err(SaslError::NotAuthorized("nonce mismatch"));
    }

    let auth_message = [
        st.first.bare.as_bytes(),
        b",",
        st.server_first.as_bytes(),
        b",",
        without_proof.as_bytes(),
    ];
    let client_signature = hmac(hash, &st.creds.stored_key, &auth_message)?;
    let client_key = xor(&proof, &client_signature);
    let ok = ct_eq(&digest(hash, &client_key), &st.creds.stored_key);
    if !ok || st.fake {
        return Err(SaslError::NotAuthorized("invalid proof"));
    }
    let server_signature = hmac(hash, &st.creds.server_key, &auth_message)?;
    Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
}

/// Client side of SCRAM, used by tests and the load generator.
///
/// For a `-PLUS` mechanism `binding` is required and sent as `p=<type>`. For a non-PLUS
/// mechanism, `binding: Some(..)` means "I support channel binding but the server did not
/// offer it" and sends the `y` flag; `None` sends `n`.
pub struct ScramClient {
    hash: ScramHash,
    gs2_header: String,
    cb_data: Vec<u8>,
    bare: String,
    client_nonce: String,
    password: String,
    expected_server_signature: Option<Vec<u8>>,
    salted: Option<SaltedPassword>,
}

/// `SaltedPassword := Hi(Normalize(password), salt, i)` (RFC 5802 §3) with
/// the salt and iteration count it was made with. Clients keep it between
/// logins so that only the first one pays PBKDF2 (as RFC 5802 §5.1
/// suggests: "the client can cache the ClientKey/ServerKey").
#[derive(Clone)]
pub struct SaltedPassword {
    salt: Vec<u8>,
    iterations: u32,
    key: Vec<u8>,
}

impl fmt::Debug for SaltedPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaltedPassword")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ScramClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramClient")
            .field("hash", &self.hash)
            .field("gs2_header", &self.gs2_header)
            .field("bare", &self.bare)
            .finish_non_exhaustive()
    }
}

impl ScramClient {
    /// Starts a client exchange. Username and password are SASLprepped
    /// ([`SaslError::Saslprep`] if prohibited). Fails with [`SaslError::InvalidMechanism`]
    /// for `PLAIN` and [`SaslError::UnsupportedChannelBinding`] for a `-PLUS` mechanism
    /// without `binding`.
    pub fn new(
        mechanism: Mechanism,
        username: &str,
        password: &str,
        binding: Option<(ChannelBindingType, Vec<u8>)>,
    ) -> Result<Self, SaslError> {
        Self::build(mechanism, username, password, binding, new_nonce()?)
    }

    /// Test-only: like [`new`](Self::new) but with a fixed client nonce (for RFC test vectors).
    #[doc(hidden)]
    pub fn with_nonce(
        mechanism: Mechanism,
        username: &str,
        password: &str,
        binding: Option<(ChannelBindingType, Vec<u8>)>,
        client_nonce: &str,
    ) -> Result<Self, SaslError> {
        if !is_valid_nonce(client_nonce) {
            return Err(SaslError::Internal("invalid fixed nonce"));
        }
        Self::build(
            mechanism,
            username,
            password,
            binding,
            client_nonce.to_owned(),
        )
    }

    fn build(
        mechanism: Mechanism,
        username: &str,
        password: &str,
        binding: Option<(ChannelBindingType, Vec<u8>)>,
        client_nonce: String,
    ) -> Result<Self, SaslError> {
        let hash = mechanism.scram_hash().ok_or(SaslError::InvalidMechanism)?;
        let (flag, cb_data) = match (mechanism.is_plus(), binding) {
            (true, Some((ty, data))) => (format!("p={}", ty.name()), data),
            (true, None) => return Err(SaslError::UnsupportedChannelBinding),
            (false, Some(_)) => ("y".to_owned(), Vec::new()),
            (false, None) => ("n".to_owned(), Vec::new()),
        };
        let username = saslprep(username)?;
        let password = saslprep(password)?;
        Ok(ScramClient {
            hash,
            gs2_header: format!("{flag},,"),
            cb_data,
            bare: format!("n={},r={}", encode_saslname(&username), client_nonce),
            client_nonce,
            password,
            expected_server_signature: None,
            salted: None,
        })
    }

    /// Reuses a salted password from an earlier exchange; it is used only
    /// if the server sends the same salt and iteration count.
    pub fn with_salted_password(mut self, salted: Option<SaltedPassword>) -> Self {
        self.salted = salted;
        self
    }

    /// The salted password of this exchange (after
    /// [`client_final`](Self::client_final)), to keep for the next one.
    pub fn salted_password(&self) -> Option<&SaltedPassword> {
        self.salted.as_ref()
    }

    /// Requests an authorization identity (`a=` in the GS2 header).
    pub fn with_authzid(mut self, authzid: &str) -> Self {
        let flag = self.gs2_header.split(',').next().unwrap_or("n").to_owned();
        self.gs2_header = format!("{flag},a={},", encode_saslname(authzid));
        self
    }

    /// The client-first-message (to base64 into `<auth/>`).
    pub fn client_first(&mut self) -> Vec<u8> {
        format!("{}{}", self.gs2_header, self.bare).into_bytes()
    }

    /// Processes server-first-message and returns client-final-message. Runs PBKDF2 with the
    /// server's iteration count (rejected above 10 000 000).
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, SaslError> {
        let s = utf8(server_first)?;
        let mut attrs = s.split(',');
        let first = attrs.next().unwrap_or_default();
        if first.starts_with("m=") {
            return Err(SaslError::MalformedRequest(
                "mandatory SCRAM extensions are not supported",
            ));
        }
        let nonce = first
            .strip_prefix("r=")
            .ok_or(SaslError::MalformedRequest("missing nonce"))?;
        if !is_valid_nonce(nonce)
            || nonce.len() <= self.client_nonce.len()
            || !nonce.starts_with(&self.client_nonce)
        {
            return Err(SaslError::NotAuthorized(
                "server nonce does not extend ours",
            ));
        }
        let salt = attrs
            .next()
            .and_then(|a| a.strip_prefix("s="))
            .ok_or(SaslError::MalformedRequest("missing salt"))?;
        let salt = B64
            .decode(salt)
            .map_err(|_| SaslError::MalformedRequest("invalid base64 in salt"))?;
        if salt.is_empty() {
            return Err(SaslError::MalformedRequest("empty salt"));
        }
        let iterations: u32 = attrs
            .next()
            .and_then(|a| a.strip_prefix("i="))
            .filter(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|i| i.parse().ok())
            .ok_or(SaslError::MalformedRequest(
                "missing or invalid iteration count",
            ))?;
        if iterations == 0 || iterations > MAX_CLIENT_ITERATIONS {
            return Err(SaslError::MalformedRequest("unacceptable iteration count"));
        }
        if !attrs.all(is_extension) {
            return Err(SaslError::MalformedRequest("invalid extension"));
        }

        let cached = self
            .salted
            .as_ref()
            .filter(|c| c.salt == salt && c.iterations == iterations);
        let salted = match cached {
            Some(c) => c.key.clone(),
            None => {
                let key = hi(self.hash, self.password.as_bytes(), &salt, iterations);
                self.salted = Some(SaltedPassword {
                    salt,
                    iterations,
                    key: key.clone(),
                });
                key
            }
        };
        let client_key = hmac(self.hash, &salted, &[b"Client Key"])?;
        let (stored_key, server_key) = keys_from_salted(self.hash, &salted)?;
        let mut cb = self.gs2_header.as_bytes().to_vec();
        cb.extend_from_slice(&self.cb_data);
        let without_proof = format!("c={},r={}", B64.encode(&cb), nonce);
        let auth_message = [
            self.bare.as_bytes(),
            b",",
            s.as_bytes(),
            b",",
            without_proof.as_bytes(),
        ];
        let client_signature = hmac(self.hash, &stored_key, &auth_message)?;
        let proof = xor(&client_key, &client_signature);
        self.expected_server_signature = Some(hmac(self.hash, &server_key, &auth_message)?);
        Ok(format!("{},p={}", without_proof, B64.encode(proof)).into_bytes())
    }

    /// Verifies server-final-message (`v=...`, from `<success/>`), constant-time.
    /// A server error (`e=...`) or a wrong signature gives [`SaslError::NotAuthorized`].
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), SaslError> {
        let expected =
            self.expected_server_signature
                .as_ref()
                .ok_or(SaslError::MalformedRequest(
                    "unexpected server-final-message",
                ))?;
        let s = utf8(server_final)?;
        let first = s.split(',').next().unwrap_or_default();
        if first.starts_with("e=") {
            return Err(SaslError::NotAuthorized("server reported an error"));
        }
        let verifier = first
            .strip_prefix("v=")
            .ok_or(SaslError::MalformedRequest("missing verifier"))?;
        let signature = B64
            .decode(verifier)
            .map_err(|_| SaslError::MalformedRequest("invalid base64 in verifier"))?;
        if ct_eq(&signature, expected) {
            Ok(())
        } else {
            Err(SaslError::NotAuthorized("server signature mismatch"))
        }
    }
}
