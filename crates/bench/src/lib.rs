//! starling-bench: a load generator for XMPP servers.
