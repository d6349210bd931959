//! Where stanzas go: the router (RFC 6120 §10, RFC 6121 §8.5, local
//! services) and the session table it owns. Modules see neither type, only
//! the `Router` and `SessionManager` interfaces of `starling-core`, so a
//! clustered router is a drop-in.

pub mod router;
pub mod sessions;
