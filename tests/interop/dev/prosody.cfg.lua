-- Prosody configuration used ONLY as a development aid to validate the
-- interop tests in tests/interop before Starling is runnable.
-- Not used by run.sh or CI.  Start it with ./run-prosody.sh, which sets
-- STARLING_PROSODY_DIR (temp dir holding data, cert and key).
--
-- Ports mirror the env contract of tests/interop/README.md:
--   15222 = c2s with STARTTLS, 15223 = c2s direct TLS (XEP-0368).

daemonize = false
pidfile = ENV_STARLING_PROSODY_DIR .. "/prosody.pid"
data_path = ENV_STARLING_PROSODY_DIR .. "/data"
log = { debug = ENV_STARLING_PROSODY_DIR .. "/prosody.log"; { levels = { min = "warn" }, to = "console" } }

-- loopback only, non-standard ports, no s2s, no HTTP
interfaces = { "127.0.0.1" }
local_interfaces = { "127.0.0.1" }
c2s_ports = { 15222 }
c2s_direct_tls_ports = { 15223 }
s2s_ports = { }
component_ports = { }
http_ports = { }
https_ports = { }

modules_enabled = {
	"disco"; "roster"; "saslauth"; "tls"; "ping"; "register"; "time"; "version";
}
modules_disabled = { "s2s"; "offline"; "c2s_limits"; "posix"; }

c2s_require_encryption = true
allow_registration = true
-- no IBR throttling (loopback is allow-listed by default, make it explicit)
min_seconds_between_registrations = nil
registration_throttle_max = nil
registration_allowlist = { "127.0.0.1", "::1" }

-- internal_plain lets Prosody offer every SCRAM variant it knows
-- (SCRAM-SHA-1, SCRAM-SHA-256 and their -PLUS forms with tls-unique on TLS 1.2)
-- plus PLAIN over TLS; internal_hashed would offer only one SCRAM hash.
authentication = "internal_plain"
storage = "internal"

certificates = ENV_STARLING_PROSODY_DIR -- holds localhost.crt / localhost.key
ssl = {
	certificate = ENV_STARLING_PROSODY_DIR .. "/localhost.crt";
	key = ENV_STARLING_PROSODY_DIR .. "/localhost.key";
}

VirtualHost "localhost"
