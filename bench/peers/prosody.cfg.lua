-- Prosody for bench/compare.sh: loopback only, STARTTLS, features as close
-- as possible to bench/peers/starling.toml (disco, ping, presence, in-band
-- registration, multi-user chat at conference.localhost). @RUN@ and @PORT@
-- are filled in by compare.sh.
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
modules_enabled = { "saslauth", "tls", "disco", "ping", "register" }
modules_disabled = { "s2s", "offline" }
allow_registration = true
min_seconds_between_registrations = 0
c2s_require_encryption = false
authentication = "internal_hashed"
default_iteration_count = 4096
storage = "internal"
ssl = {
  certificate = "@RUN@/cert.pem";
  key = "@RUN@/key.pem";
}
VirtualHost "localhost"

-- XEP-0045, as Starling's [modules.muc]: local users create rooms (locked
-- until configured: muc_room_locking, on by default), history 20. Prosody
-- keeps at most muc_room_cache_size rooms live (100 by default; the others
-- are saved and reloaded): raised so that the bench's rooms stay live. No
-- mod_muc_mam, so room messages are not archived (Starling archives them
-- by default).
Component "conference.localhost" "muc"
  restrict_room_creation = "local"
  muc_room_cache_size = 10000
  muc_room_default_history_length = 20
