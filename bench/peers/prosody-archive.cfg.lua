-- Prosody for `ARCHIVE=1 bench/compare.sh`: bench/peers/prosody.cfg.lua
-- plus Message Archive Management (mod_mam, built into 0.12) archiving
-- every one-to-one message by default. The archive store is SQL on SQLite
-- (Debian's lua-dbi-sqlite3; Prosody creates the tables); accounts stay in
-- the internal file store as in the plain config. @RUN@ and @PORT@ are
-- filled in by compare.sh.
pidfile = "@RUN@/prosody.pid"
data_path = "@RUN@/data"
log = { warn = "@RUN@/prosody.log" }
network_backend = "epoll"
-- Default backlog is 128; Starling and the ejabberd config use 4096.
-- Nagle is on by default in Prosody (a ~40 ms delayed-ACK stall per small
-- write under load); Starling and ejabberd set TCP_NODELAY, so do the same.
network_settings = { tcp_backlog = 4096; nagle = false }
interfaces = { "127.0.0.1" }
c2s_ports = { @PORT@ }
c2s_direct_tls_ports = { }
s2s_ports = { }
http_ports = { }
https_ports = { }
modules_enabled = { "saslauth", "tls", "disco", "ping", "register", "mam" }
modules_disabled = { "s2s", "offline" }
allow_registration = true
min_seconds_between_registrations = 0
c2s_require_encryption = false
authentication = "internal_hashed"
default_iteration_count = 4096
default_storage = "internal"
storage = { archive = "sql" }
sql = { driver = "SQLite3", database = "@RUN@/data/archive.sqlite" }
default_archive_policy = true
archive_expires_after = "1w"
max_archive_query_results = 50
ssl = {
  certificate = "@RUN@/cert.pem";
  key = "@RUN@/key.pem";
}
VirtualHost "localhost"
